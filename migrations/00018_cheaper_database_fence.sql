-- +goose Up
-- The database's fence (migration 00012) at a lower cost to the append.
-- Its statement triggers asked ledger.fence_enforced() in a statement of
-- its own and then ran one to three queries more; each is an executor run
-- for every statement the ingest sends. Each trigger is now one query: the
-- role's check is a one-time filter of it (false for the owner: nothing
-- else runs), and the events trigger locks the leases FOR KEY SHARE in the
-- same query that checks them. What each refuses, and with which
-- SQLSTATE, is unchanged; the Down half puts 00012's bodies back.
-- docs/benchmarks.md, "The database's own fence", has the cost before and
-- after.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.events_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad record;
BEGIN
    -- The first branch locks each lease the rows claim until commit (a
    -- takeover, FOR UPDATE, waits as it waits for an append), in
    -- partition order, and runs to its end before the second begins.
    SELECT x.code, x.partition, x.holder, x.generation, x.task_id INTO bad
    FROM (
        SELECT 1 AS ord, 'LF001' AS code, n.partition, n.holder, n.generation, NULL::text AS task_id
        FROM (SELECT n.partition, n.holder, n.generation, min(n.committed_at) AS first_at, max(n.committed_at) AS last_at
              FROM new_events n GROUP BY n.partition, n.holder, n.generation ORDER BY n.partition) n
        LEFT JOIN LATERAL (SELECT l.holder, l.generation, l.expires_at FROM ledger.leases l
                           WHERE l.partition = n.partition FOR KEY SHARE OF l) l ON true
        WHERE l.holder IS NULL OR l.holder <> n.holder OR l.generation <> n.generation
           OR l.expires_at <= clock_timestamp()
           OR n.first_at < statement_timestamp() OR n.last_at > clock_timestamp()
        UNION ALL
        SELECT 2, 'LF005', NULL, NULL, NULL, t.task_id
        FROM (SELECT n.task_id, count(*) AS rows, count(DISTINCT n.version) AS versions,
                     min(n.version) AS lo, max(n.version) AS hi, min(n.seq) AS first_seq, max(n.seq) AS last_seq,
                     min(n.partition) AS p_lo, max(n.partition) AS p_hi
              FROM new_events n GROUP BY n.task_id) t
        LEFT JOIN ledger.heads h ON h.task_id = t.task_id
        WHERE h.task_id IS NULL OR t.rows <> t.versions
           OR (h.kind = 'events' AND (t.rows <> t.hi - t.lo + 1 OR t.lo IS DISTINCT FROM h.moved_from + 1))
           OR (h.kind = 'snapshot' AND t.lo <= h.moved_from)
           OR t.hi <> h.version OR t.last_seq <> h.seq
           OR t.p_lo <> h.partition OR t.p_hi <> h.partition
           OR (h.moved_from = 0 AND t.first_seq <> h.first_seq)
    ) x
    WHERE ledger.fence_enforced()
    ORDER BY x.ord LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF bad.code = 'LF001' THEN
        RAISE EXCEPTION 'ledger fence: events of partition % by % at generation % are not under its unexpired lease, committed now',
            bad.partition, bad.holder, bad.generation
            USING ERRCODE = 'LF001';
    END IF;
    RAISE EXCEPTION 'ledger versions: the events of task % are not the versions its head moved over in their statement', bad.task_id
        USING ERRCODE = 'LF005';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.heads_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
BEGIN
    -- The seq range of the statement's heads bounds the probe of the log,
    -- so only the partitions of ledger.events that hold it are searched.
    SELECT n.task_id INTO bad
    FROM new_heads n
    LEFT JOIN (SELECT e.seq, e.task_id, e.version, e.type, e.partition FROM ledger.events e
               WHERE e.seq >= (SELECT min(m.seq) FROM new_heads m)
                 AND e.seq <= (SELECT max(m.seq) FROM new_heads m)) e ON e.seq = n.seq
    WHERE ledger.fence_enforced()
      AND (n.version <= coalesce(n.moved_from, n.version) OR e.seq IS NULL OR e.task_id <> n.task_id
           OR e.version <> n.version OR e.type <> n.type OR e.partition <> n.partition)
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger versions: the head of task % does not rise onto the row of its version', bad
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.event_ids_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
BEGIN
    SELECT n.event_id INTO bad FROM new_ids n
    WHERE ledger.fence_enforced()
      AND NOT EXISTS (SELECT FROM ledger.events e WHERE e.seq = n.seq AND e.event_id = n.event_id)
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger ids: event id % names no row that carries it', bad
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.events_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad record;
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NULL;
    END IF;
    -- The leases the rows claim stay as they are until commit: a takeover
    -- (FOR UPDATE) waits, as it waits for an append.
    PERFORM FROM ledger.leases l WHERE l.partition IN (SELECT DISTINCT n.partition FROM new_events n)
        ORDER BY l.partition FOR KEY SHARE OF l;
    SELECT n.partition, n.holder, n.generation INTO bad
    FROM (SELECT n.partition, n.holder, n.generation, min(n.committed_at) AS first_at, max(n.committed_at) AS last_at
          FROM new_events n GROUP BY n.partition, n.holder, n.generation) n
    LEFT JOIN ledger.leases l ON l.partition = n.partition
    WHERE l.partition IS NULL OR l.holder <> n.holder OR l.generation <> n.generation
       OR l.expires_at <= clock_timestamp()
       OR n.first_at < statement_timestamp() OR n.last_at > clock_timestamp()
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger fence: events of partition % by % at generation % are not under its unexpired lease, committed now',
            bad.partition, bad.holder, bad.generation
            USING ERRCODE = 'LF001';
    END IF;
    SELECT t.task_id INTO bad
    FROM (SELECT n.task_id, count(*) AS rows, count(DISTINCT n.version) AS versions,
                 min(n.version) AS lo, max(n.version) AS hi, min(n.seq) AS first_seq, max(n.seq) AS last_seq,
                 min(n.partition) AS p_lo, max(n.partition) AS p_hi
          FROM new_events n GROUP BY n.task_id) t
    LEFT JOIN ledger.heads h ON h.task_id = t.task_id
    WHERE h.task_id IS NULL OR t.rows <> t.versions
       OR (h.kind = 'events' AND (t.rows <> t.hi - t.lo + 1 OR t.lo IS DISTINCT FROM h.moved_from + 1))
       OR (h.kind = 'snapshot' AND t.lo <= h.moved_from)
       OR t.hi <> h.version OR t.last_seq <> h.seq
       OR t.p_lo <> h.partition OR t.p_hi <> h.partition
       OR (h.moved_from = 0 AND t.first_seq <> h.first_seq)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger versions: the events of task % are not the versions its head moved over in their statement', bad.task_id
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.heads_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
    lo  bigint;
    hi  bigint;
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NULL;
    END IF;
    SELECT min(n.seq), max(n.seq) INTO lo, hi FROM new_heads n;
    SELECT n.task_id INTO bad
    FROM new_heads n
    LEFT JOIN (SELECT e.seq, e.task_id, e.version, e.type, e.partition FROM ledger.events e
               WHERE e.seq >= lo AND e.seq <= hi) e ON e.seq = n.seq
    WHERE n.version <= coalesce(n.moved_from, n.version) OR e.seq IS NULL OR e.task_id <> n.task_id OR e.version <> n.version
       OR e.type <> n.type OR e.partition <> n.partition
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger versions: the head of task % does not rise onto the row of its version', bad
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.event_ids_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NULL;
    END IF;
    SELECT n.event_id INTO bad FROM new_ids n
    WHERE NOT EXISTS (SELECT FROM ledger.events e WHERE e.seq = n.seq AND e.event_id = n.event_id)
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger ids: event id % names no row that carries it', bad
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
