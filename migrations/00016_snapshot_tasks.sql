-- +goose Up
-- Snapshot tasks (docs/contract.md §14). A task's kind is chosen by its
-- first committed event and pinned for ever, like its partition and owner:
-- ledger.heads.kind is written with the head of that event, and the
-- ingest may never update it (migration 00012 grants it UPDATE of a head's
-- version, seq and type only). Every task committed before this migration
-- is applied event by event.
--
-- A snapshot task's versions rise but need not be dense: the database's
-- own fence (migration 00012) then requires of a statement's rows of such
-- a task only that they are distinct versions above the version its head
-- moved from, ending at the head. An events task keeps the dense rule.
ALTER TABLE ledger.heads ADD COLUMN kind text NOT NULL DEFAULT 'events'
    CHECK (kind IN ('events', 'snapshot'));

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
    WHERE h.task_id IS NULL OR t.rows <> t.versions OR t.rows <> t.hi - t.lo + 1
       OR t.lo IS DISTINCT FROM h.moved_from + 1 OR t.hi <> h.version OR t.last_seq <> h.seq
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
ALTER TABLE ledger.heads DROP COLUMN kind;
