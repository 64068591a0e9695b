-- +goose Up
-- What the database keeps per principal, whoever writes:
--
--   ledger.rejections         a rejection is one the fence would give. The
--                             ingest's role writes only the columns an
--                             append writes (not id, not rejected_at), and a
--                             statement trigger refuses a row whose verdict
--                             the leases, heads and ids deny (SQLSTATE LF007).
--   ledger.partition_ranges   which partitions a principal may lease, where
--                             an operator said so (ledgerctl partition-ranges).
--                             A grant outside them is refused (LFP01), as a
--                             cordon refuses it (migration 00014).
--   ledger.quota_buckets      each principal's share of the dead letters and
--                             of the projections, for every process at once.

-- A stolen ingest DATABASE_URL could otherwise record any verdict for any
-- event id: a rejection row stands for ever (a verdict is never reversed),
-- so a false one answers the verdict lookup and refuses later copies. Ids
-- come from their rows' identity and the time from the database's clock.
REVOKE INSERT ON ledger.rejections FROM ledger_ingest;
GRANT INSERT (event_id, partition, task_id, version, holder, generation, verdict, reason, current_generation)
    ON ledger.rejections TO ledger_ingest;

-- The rows of a statement, each checked against what the append saw. An
-- append that records a rejection holds its partitions' lease rows FOR
-- UPDATE until commit, and a task's head moves only under its partition's
-- lease row, so none of these has moved since the append decided.
--
--   stale      the event's holder and generation are not the partition's
--              unexpired lease; superseded names a lower generation than
--              the lease's, which current_generation repeats.
--   conflict   the event id is committed (event_id_reused, archived), or
--              the task's head is at or past the version (version_taken,
--              archived).
--   gap        the version is more than one past the task's head.
--   invalid    only not_owner: the task's owner is another principal.
-- +goose StatementBegin
CREATE FUNCTION ledger.rejections_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad record;
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NULL;
    END IF;
    SELECT n.event_id, n.verdict, n.reason INTO bad
    FROM new_rejections n
    LEFT JOIN ledger.leases l ON l.partition = n.partition
    LEFT JOIN ledger.heads h ON h.task_id = n.task_id
    WHERE NOT CASE n.verdict || '/' || n.reason
        WHEN 'stale/no_lease' THEN l.partition IS NULL OR l.holder <> n.holder OR l.generation <> n.generation
        WHEN 'stale/superseded' THEN n.generation < l.generation AND n.current_generation = l.generation
        WHEN 'stale/not_holder' THEN (l.holder <> n.holder OR l.generation <> n.generation)
                                     AND n.current_generation = l.generation
        WHEN 'stale/lease_expired' THEN l.holder = n.holder AND l.generation = n.generation
                                        AND l.expires_at <= clock_timestamp() AND n.current_generation = l.generation
        WHEN 'conflict/event_id_reused' THEN EXISTS (SELECT FROM ledger.event_ids x WHERE x.event_id = n.event_id)
        WHEN 'conflict/archived' THEN EXISTS (SELECT FROM ledger.event_ids x WHERE x.event_id = n.event_id)
                                      OR h.version >= n.version
        WHEN 'conflict/version_taken' THEN h.version >= n.version
        WHEN 'gap/gap_timeout' THEN coalesce(h.version, 0) + 1 < n.version
        WHEN 'gap/too_far_ahead' THEN coalesce(h.version, 0) + 1 < n.version
        WHEN 'gap/too_many_waiting' THEN coalesce(h.version, 0) + 1 < n.version
        WHEN 'invalid/not_owner' THEN h.owner <> split_part(n.holder, '.', 1)
        ELSE false
    END IS TRUE
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger rejections: % is not the fence''s verdict for event %', bad.verdict || '/' || bad.reason, bad.event_id
            USING ERRCODE = 'LF007';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER rejections_fence AFTER INSERT ON ledger.rejections
    REFERENCING NEW TABLE AS new_rejections FOR EACH STATEMENT EXECUTE FUNCTION ledger.rejections_fence();

-- Partition ranges (CONTRACT §1, forbidden). A principal named here may be
-- granted only partitions within its ranges, and a partition within any
-- range only to a principal whose range holds it. Principals and
-- partitions named nowhere are as before: anyone may lease them.
CREATE TABLE ledger.partition_ranges (
    principal  text        NOT NULL CHECK (principal ~ '^[A-Za-z0-9_-]{1,64}$'),
    lo         integer     NOT NULL CHECK (lo >= 0),
    hi         integer     NOT NULL CHECK (hi >= lo),
    changed_by text        NOT NULL,
    db_user    text        NOT NULL DEFAULT session_user,
    reason     text        NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (principal, lo)
);

-- ledger.set_partition_ranges replaces principal's ranges with ranges
-- ({lo, hi} pairs, inclusive; empty: no ranges, the principal may lease
-- any partition no other principal's range holds). A lease granted
-- before stays until it ends; its next grant keeps the new ranges.
-- +goose StatementBegin
CREATE FUNCTION ledger.set_partition_ranges(who text, ranges integer[], actor text, why text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer := coalesce(array_length(ranges, 1), 0);
BEGIN
    IF n % 2 <> 0 OR array_ndims(ranges) > 1 THEN
        RAISE EXCEPTION 'ledger partition ranges: give lo, hi pairs' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM ledger.partition_ranges r WHERE r.principal = who;
    INSERT INTO ledger.partition_ranges (principal, lo, hi, changed_by, reason)
    SELECT who, ranges[i], ranges[i + 1], actor, why FROM generate_series(1, n, 2) AS i;
    RETURN n / 2;
END
$$;
-- +goose StatementEnd

-- ledger.partition_range_refusal says why partition p is not holder's to
-- lease, or null where it is.
-- +goose StatementBegin
CREATE FUNCTION ledger.partition_range_refusal(p integer, holder text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    who  text := split_part(holder, '.', 1);
    mine text;
BEGIN
    IF NOT EXISTS (SELECT FROM ledger.partition_ranges r WHERE r.principal = who OR p BETWEEN r.lo AND r.hi)
       OR EXISTS (SELECT FROM ledger.partition_ranges r WHERE r.principal = who AND p BETWEEN r.lo AND r.hi) THEN
        RETURN NULL;
    END IF;
    SELECT string_agg(r.lo || '-' || r.hi, ',' ORDER BY r.lo) INTO mine
    FROM ledger.partition_ranges r WHERE r.principal = who;
    RETURN format('partition %s is not within principal %s''s partitions (%s)',
                  p, who, coalesce(mine, 'none: it is within other principals'' ranges'));
END
$$;
-- +goose StatementEnd

-- ledger.partition_range_check refuses a grant outside the grantee's
-- ranges, whoever grants: each grant records a row of ledger.lease_grants
-- in the statement that moves the lease. SQLSTATE LFP01.
-- +goose StatementBegin
CREATE FUNCTION ledger.partition_range_check() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    why text := ledger.partition_range_refusal(NEW.partition, NEW.holder);
BEGIN
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'ledger partition ranges: %', why USING ERRCODE = 'LFP01';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER lease_grants_partition_range_check BEFORE INSERT ON ledger.lease_grants
    FOR EACH ROW EXECUTE FUNCTION ledger.partition_range_check();

GRANT SELECT ON ledger.partition_ranges TO ledger_ingest, ledger_projector, ledger_operator;
GRANT EXECUTE ON FUNCTION ledger.partition_range_refusal(integer, text) TO ledger_ingest, ledger_operator;
REVOKE EXECUTE ON FUNCTION ledger.set_partition_ranges(text, integer[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger.set_partition_ranges(text, integer[], text, text) TO ledger_operator;

-- Per-principal quotas that hold across processes (internal/quota): the
-- dead letters of every ingest, and the projection values of every
-- projector, draw from one bucket per principal here. A process takes
-- bytes in chunks and spends them locally, so the database is asked about
-- once a chunk, and what all processes spend never passes the quota.
CREATE TABLE ledger.quota_buckets (
    kind       text             NOT NULL CHECK (kind IN ('dead_letters', 'projections')),
    principal  text             NOT NULL,
    -- bytes_left as of at; the bucket refills at its size an hour.
    bytes_left double precision NOT NULL,
    at         timestamptz      NOT NULL,
    PRIMARY KEY (kind, principal)
);

-- ledger.quota_take takes up to want bytes from principal's bucket of
-- kind, of size bytes (the caller's configured quota), and returns how
-- many it took: fewer, or 0, when the bucket has fewer left. The database's
-- clock refills it.
-- +goose StatementBegin
CREATE FUNCTION ledger.quota_take(k text, who text, want bigint, size bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_at timestamptz := clock_timestamp();
    have   double precision;
    got    bigint;
BEGIN
    IF want < 0 OR size < 1 THEN
        RAISE EXCEPTION 'ledger quota: want % of size %', want, size USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO ledger.quota_buckets AS b (kind, principal, bytes_left, at)
    VALUES (k, who, size, now_at) ON CONFLICT (kind, principal) DO NOTHING;
    SELECT least(size, b.bytes_left + extract(epoch FROM now_at - b.at) / 3600 * size) INTO have
    FROM ledger.quota_buckets b WHERE b.kind = k AND b.principal = who FOR UPDATE;
    got := greatest(0, least(want, floor(have)))::bigint;
    UPDATE ledger.quota_buckets b SET bytes_left = have - got, at = now_at WHERE b.kind = k AND b.principal = who;
    RETURN got;
END
$$;
-- +goose StatementEnd

GRANT SELECT ON ledger.quota_buckets TO ledger_operator;
REVOKE EXECUTE ON FUNCTION ledger.quota_take(text, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger.quota_take(text, text, bigint, bigint) TO ledger_ingest, ledger_projector;

-- +goose Down
DROP FUNCTION ledger.quota_take(text, text, bigint, bigint);
DROP TABLE ledger.quota_buckets;
DROP TRIGGER lease_grants_partition_range_check ON ledger.lease_grants;
DROP FUNCTION ledger.partition_range_check();
DROP FUNCTION ledger.partition_range_refusal(integer, text);
DROP FUNCTION ledger.set_partition_ranges(text, integer[], text, text);
DROP TABLE ledger.partition_ranges;
DROP TRIGGER rejections_fence ON ledger.rejections;
DROP FUNCTION ledger.rejections_fence();
REVOKE INSERT ON ledger.rejections FROM ledger_ingest;
GRANT INSERT ON ledger.rejections TO ledger_ingest;
