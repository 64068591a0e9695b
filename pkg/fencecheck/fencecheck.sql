-- The storage-side fence check of the ledger (docs/side-effects.md): a
-- downstream database applies this file once (it is idempotent), then calls
-- ledger_fence.admit(resource, partition, holder, generation) inside the
-- transaction of each fenced write. The call refuses a generation below the
-- highest seen for (resource, partition), and locks that row until the
-- caller's transaction ends, so concurrent writers of one resource and
-- partition are serialised and a superseded one cannot slip in between.

CREATE SCHEMA IF NOT EXISTS ledger_fence;

CREATE TABLE IF NOT EXISTS ledger_fence.high_water (
    resource   text        NOT NULL,
    partition  integer     NOT NULL CHECK (partition >= 0),
    generation bigint      NOT NULL CHECK (generation >= 1),
    holder     text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource, partition)
);

COMMENT ON TABLE ledger_fence.high_water IS
    'The highest ledger lease generation seen per (resource, partition), and its holder.';

-- SQLSTATEs raised (class LF, "ledger fence"):
--   LF001  the generation is below the highest seen: a superseded holder.
--          DETAIL is the highest generation seen, as plain digits.
--   LF002  the generation equals the highest seen but names another holder.
--   LF003  the fence itself is malformed (a null, a negative partition, a
--          generation below 1, a holder that is not <principal>.<instance>).
CREATE OR REPLACE FUNCTION ledger_fence.admit(
    p_resource text, p_partition integer, p_holder text, p_generation bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    cur ledger_fence.high_water%ROWTYPE;
BEGIN
    IF p_resource IS NULL OR p_partition IS NULL OR p_partition < 0 OR p_generation IS NULL
       OR p_generation < 1 OR p_holder IS NULL
       OR p_holder !~ '^[A-Za-z0-9_-]{1,64}\.[A-Za-z0-9_-]{1,64}$' THEN
        RAISE EXCEPTION 'ledger fence: malformed fence (resource %, partition %, holder %, generation %)',
            p_resource, p_partition, p_holder, p_generation
            USING ERRCODE = 'LF003';
    END IF;
    -- The row exists before it is locked, so that a first writer of a
    -- resource is serialised with the others like every later one.
    INSERT INTO ledger_fence.high_water (resource, partition, generation, holder)
    VALUES (p_resource, p_partition, p_generation, p_holder)
    ON CONFLICT (resource, partition) DO NOTHING;
    SELECT * INTO cur FROM ledger_fence.high_water
    WHERE resource = p_resource AND partition = p_partition
    FOR UPDATE;
    IF p_generation < cur.generation THEN
        RAISE EXCEPTION 'ledger fence: generation % of holder % on partition % is superseded for resource %: generation % (holder %) was seen',
            p_generation, p_holder, p_partition, p_resource, cur.generation, cur.holder
            USING ERRCODE = 'LF001', DETAIL = cur.generation::text;
    END IF;
    IF p_generation = cur.generation AND p_holder <> cur.holder THEN
        RAISE EXCEPTION 'ledger fence: generation % on partition % belongs to holder %, not %',
            p_generation, p_partition, cur.holder, p_holder
            USING ERRCODE = 'LF002';
    END IF;
    IF p_generation > cur.generation THEN
        UPDATE ledger_fence.high_water
        SET generation = p_generation, holder = p_holder, updated_at = now()
        WHERE resource = p_resource AND partition = p_partition;
    END IF;
END;
$$;
