-- +goose Up
-- The operator's fence (CONTRACT §12): an operator revokes a partition's
-- lease at once, or cordons a partition so that nobody is granted it until
-- it is uncordoned. Each action is recorded with who, when and why.

-- One row per partition an operator ever cordoned.
CREATE TABLE ledger.partition_controls (
    partition   integer     PRIMARY KEY CHECK (partition >= 0),
    cordoned    boolean     NOT NULL DEFAULT false,
    -- The last cordon or uncordon: who named themself, the database user,
    -- why and when.
    changed_by  text        NOT NULL,
    db_user     text        NOT NULL,
    reason      text        NOT NULL,
    changed_at  timestamptz NOT NULL
);

-- Every operator action, in order: the audit trail beside ledger.lease_grants.
CREATE TABLE ledger.lease_actions (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition      integer     NOT NULL,
    action         text        NOT NULL CHECK (action IN ('revoke', 'cordon', 'uncordon')),
    -- The lease when the action was taken (null: never leased). A revoke
    -- fences holder at generation and raises the partition to new_generation.
    holder         text,
    generation     bigint,
    new_generation bigint,
    by_name        text        NOT NULL,
    db_user        text        NOT NULL DEFAULT session_user,
    reason         text        NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX lease_actions_partition_idx ON ledger.lease_actions (partition, id);

-- ledger.revoke_lease fences the current holder of partition p now: the
-- generation rises to at least min_generation (the ingest's witness plus
-- one, so no grant repeats it) and the lease expires at once. It waits for
-- every in-flight append on the partition (the lease row FOR UPDATE), so
-- every event committed under the old generation precedes the revoke.
-- SQLSTATE LFR01: the partition was never leased.
-- +goose StatementBegin
CREATE FUNCTION ledger.revoke_lease(p integer, min_generation bigint, actor text, why text)
RETURNS TABLE (holder text, generation bigint, new_generation bigint, at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    cur ledger.leases%ROWTYPE;
    raised bigint;
    now_at timestamptz;
BEGIN
    SELECT * INTO cur FROM ledger.leases l WHERE l.partition = p FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ledger revoke: partition % was never leased', p USING ERRCODE = 'LFR01';
    END IF;
    now_at := clock_timestamp();
    raised := greatest(cur.generation + 1, min_generation);
    UPDATE ledger.leases l
    SET generation = raised, expires_at = least(l.expires_at, now_at), request_id = NULL
    WHERE l.partition = p;
    INSERT INTO ledger.lease_actions (partition, action, holder, generation, new_generation, by_name, reason, at)
    VALUES (p, 'revoke', cur.holder, cur.generation, raised, actor, why, now_at);
    RETURN QUERY SELECT cur.holder, cur.generation, raised, now_at;
END
$$;
-- +goose StatementEnd

-- ledger.cordon_partition cordons (on) or uncordons partition p. It waits
-- for an in-flight takeover (the lease row FOR UPDATE), so once it returns
-- no grant of p commits until an uncordon.
-- +goose StatementBegin
CREATE FUNCTION ledger.cordon_partition(p integer, cordon boolean, actor text, why text)
RETURNS TABLE (holder text, generation bigint, at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    cur ledger.leases%ROWTYPE;
    now_at timestamptz;
BEGIN
    IF p < 0 THEN
        RAISE EXCEPTION 'ledger cordon: partition % is negative', p USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO cur FROM ledger.leases l WHERE l.partition = p FOR UPDATE;
    now_at := clock_timestamp();
    INSERT INTO ledger.partition_controls AS c (partition, cordoned, changed_by, db_user, reason, changed_at)
    VALUES (p, cordon, actor, session_user, why, now_at)
    ON CONFLICT (partition) DO UPDATE
    SET cordoned = EXCLUDED.cordoned, changed_by = EXCLUDED.changed_by, db_user = EXCLUDED.db_user,
        reason = EXCLUDED.reason, changed_at = EXCLUDED.changed_at;
    INSERT INTO ledger.lease_actions (partition, action, holder, generation, by_name, reason, at)
    VALUES (p, CASE WHEN cordon THEN 'cordon' ELSE 'uncordon' END, cur.holder, cur.generation, actor, why, now_at);
    RETURN QUERY SELECT cur.holder, cur.generation, now_at;
END
$$;
-- +goose StatementEnd

-- ledger.cordon_check refuses every grant of a cordoned partition: each
-- grant records a row of ledger.lease_grants in the statement that moves
-- the lease, so raising here aborts the grant. SQLSTATE LFC01.
-- +goose StatementBegin
CREATE FUNCTION ledger.cordon_check() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    c ledger.partition_controls%ROWTYPE;
BEGIN
    SELECT * INTO c FROM ledger.partition_controls WHERE partition = NEW.partition AND cordoned;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger cordon: partition % is cordoned', NEW.partition
            USING ERRCODE = 'LFC01', DETAIL = c.changed_by || ': ' || c.reason;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER lease_grants_cordon_check BEFORE INSERT ON ledger.lease_grants
    FOR EACH ROW EXECUTE FUNCTION ledger.cordon_check();

GRANT SELECT ON ledger.partition_controls, ledger.lease_actions
    TO ledger_ingest, ledger_projector, ledger_operator;
REVOKE EXECUTE ON FUNCTION ledger.revoke_lease(integer, bigint, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ledger.cordon_partition(integer, boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger.revoke_lease(integer, bigint, text, text) TO ledger_operator;
GRANT EXECUTE ON FUNCTION ledger.cordon_partition(integer, boolean, text, text) TO ledger_operator;

-- +goose Down
DROP TRIGGER lease_grants_cordon_check ON ledger.lease_grants;
DROP FUNCTION ledger.cordon_check();
DROP FUNCTION ledger.cordon_partition(integer, boolean, text, text);
DROP FUNCTION ledger.revoke_lease(integer, bigint, text, text);
DROP TABLE ledger.lease_actions;
DROP TABLE ledger.partition_controls;
