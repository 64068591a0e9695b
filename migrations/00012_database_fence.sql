-- +goose Up
-- The database holds the fence against the ingest's own role. The ingest
-- appends and moves leases with plain INSERT and UPDATE, so a stolen
-- ingest DATABASE_URL could otherwise write what the fence refuses: an
-- event under a stale generation, a second version 2, a lease rewound to
-- an old generation. The triggers below refuse, for every role but the
-- schema's owner, what the fenced append refuses (pkg/fence/doc.go,
-- "Invariants"; docs/security.md):
--
--   ledger.events      a row commits only under its partition's lease:
--                      same holder and generation, unexpired now, locked
--                      FOR KEY SHARE until commit as an append locks it. Its
--                      committed_at lies within its own statement. Its
--                      task's head covers it, on the same partition, and no
--                      other row holds its (task, version).
--   ledger.heads       a head rises only, onto the row of its version,
--                      and the statement that moves it inserts exactly
--                      the versions it passes. Only version, seq and type
--                      may change.
--   ledger.event_ids   an id names the row that carries it.
--   ledger.leases      a generation never falls; a new holder or generation
--                      needs a higher generation and, for another holder,
--                      an expired lease (the takeover's compare-and-swap);
--                      an expired lease is never extended. Only holder,
--                      generation, expiry, TTL and request id may change.
--   ledger.lease_grants a grant names the lease row it made.
--
-- The checks of ledger.events, ledger.heads and ledger.event_ids are
-- statement triggers over transition tables: one set-based query per
-- statement, whatever the batch's size, so the append's single INSERT
-- keeps its shape. They run at the end of the statement, after the rows
-- themselves passed PostgreSQL's own checks; the append's probe for bad
-- rows (pkg/fence, isolate) tells the two apart by SQLSTATE.
--
--   LF001  a row is not under its partition's unexpired lease (as
--          ledger.fence_check: the append decides the batch again)
--   LF005  a row or a head breaks the dense versions or names no row
--   LF006  a lease moves in a way the fence refuses
--
-- The schema's owner (and superusers) pass unchecked: migrations,
-- ledgerctl archive, restore and rebuild run as the owner and move rows
-- the way only the owner may.

-- ledger.fence_enforced tells whether the current role is held to the
-- fence: every role without the rights of the ledger schema's owner.
--
-- The trigger functions that query run with search_path set to pg_catalog,
-- so that no object of the session's choosing stands in for one of
-- PostgreSQL's. fence_enforced names everything by schema instead, which
-- lets it be inlined; heads_moved_from names nothing. A function-level
-- SET costs every call, and these two run on every statement or row.
-- +goose StatementBegin
CREATE FUNCTION ledger.fence_enforced() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE')
    FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'ledger'
$$;
-- +goose StatementEnd

-- ledger.heads.moved_from is the version a head moved from in the
-- statement that last moved it (0 for a new head). A row trigger writes
-- it from the row's old version, whatever the statement wrote, so the
-- statement triggers can tell where each head moved from without joining
-- old and new rows.
ALTER TABLE ledger.heads ADD COLUMN moved_from bigint;

-- +goose StatementBegin
CREATE FUNCTION ledger.heads_moved_from() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.moved_from := 0;
    ELSE
        NEW.moved_from := OLD.version;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- The rows of a statement, per task: under their partition's unexpired
-- lease, and exactly the versions the task's head moved over in the same
-- statement (from moved_from + 1 to the head, each once, the head's seq
-- the last one's). Events exist only at or below their head, and a head
-- only rises, so no version is ever written twice or skipped.
-- +goose StatementBegin
CREATE FUNCTION ledger.events_fence() RETURNS trigger
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

-- A head rises, and lands on a row that carries its version: one probe of
-- the log by seq for each head the statement moved, over the seq range of
-- the statement's heads. Which rows it moved over, the events trigger of
-- the same statement checks; a head moved by a statement that inserts no
-- event of its task finds no row of its version at its seq (an event is
-- refused above its head).
-- +goose StatementBegin
CREATE FUNCTION ledger.heads_fence() RETURNS trigger
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
CREATE FUNCTION ledger.event_ids_fence() RETURNS trigger
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

-- A lease moves as the lease service moves it (pkg/fence, lease.go). The
-- clock is read when the trigger runs, after the statement's own WHERE: a
-- renewal that races its lease's expiry is refused (LF006) rather than
-- extend an expired lease, and the service answers it as lost.
-- +goose StatementBegin
CREATE FUNCTION ledger.leases_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT FROM ledger.lease_grants g WHERE g.partition = NEW.partition AND g.generation >= NEW.generation) THEN
            RAISE EXCEPTION 'ledger leases: partition % was granted generation % or later already', NEW.partition, NEW.generation
                USING ERRCODE = 'LF006';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'ledger leases: the generation of partition % would fall from % to %', OLD.partition, OLD.generation, NEW.generation
            USING ERRCODE = 'LF006';
    END IF;
    IF NEW.holder <> OLD.holder OR NEW.generation <> OLD.generation THEN
        IF NEW.generation = OLD.generation THEN
            RAISE EXCEPTION 'ledger leases: partition % changes holder without a new generation', OLD.partition
                USING ERRCODE = 'LF006';
        END IF;
        IF NEW.holder <> OLD.holder AND OLD.expires_at > clock_timestamp() THEN
            RAISE EXCEPTION 'ledger leases: the lease of partition % by % has not expired', OLD.partition, OLD.holder
                USING ERRCODE = 'LF006';
        END IF;
    ELSIF NEW.expires_at > OLD.expires_at AND OLD.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION 'ledger leases: the lease of partition % expired and is not renewed', OLD.partition
            USING ERRCODE = 'LF006';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION ledger.lease_grants_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT FROM ledger.leases l
                   WHERE l.partition = NEW.partition AND l.generation = NEW.generation AND l.holder = NEW.holder) THEN
        RAISE EXCEPTION 'ledger leases: no lease of partition % by % at generation % to record', NEW.partition, NEW.holder, NEW.generation
            USING ERRCODE = 'LF006';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER events_fence AFTER INSERT ON ledger.events
    REFERENCING NEW TABLE AS new_events FOR EACH STATEMENT EXECUTE FUNCTION ledger.events_fence();
CREATE TRIGGER heads_moved_from BEFORE INSERT OR UPDATE ON ledger.heads
    FOR EACH ROW EXECUTE FUNCTION ledger.heads_moved_from();
CREATE TRIGGER heads_fence_insert AFTER INSERT ON ledger.heads
    REFERENCING NEW TABLE AS new_heads FOR EACH STATEMENT EXECUTE FUNCTION ledger.heads_fence();
CREATE TRIGGER heads_fence_update AFTER UPDATE ON ledger.heads
    REFERENCING NEW TABLE AS new_heads FOR EACH STATEMENT EXECUTE FUNCTION ledger.heads_fence();
CREATE TRIGGER event_ids_fence AFTER INSERT ON ledger.event_ids
    REFERENCING NEW TABLE AS new_ids FOR EACH STATEMENT EXECUTE FUNCTION ledger.event_ids_fence();
CREATE TRIGGER leases_fence BEFORE INSERT OR UPDATE ON ledger.leases
    FOR EACH ROW EXECUTE FUNCTION ledger.leases_fence();
-- After the statement: the grant is written by the statement that moves
-- the lease, and is checked against the moved row.
CREATE TRIGGER lease_grants_fence AFTER INSERT ON ledger.lease_grants
    FOR EACH ROW EXECUTE FUNCTION ledger.lease_grants_fence();

-- The heads' task, partition and first seq, and a lease's partition, never
-- change: the statement triggers match old and new rows by them. (A row
-- lock needs UPDATE on one column; the append's FOR KEY SHARE keeps it.)
REVOKE UPDATE ON ledger.heads, ledger.leases FROM ledger_ingest;
GRANT UPDATE (version, seq, type) ON ledger.heads TO ledger_ingest;
GRANT UPDATE (holder, generation, expires_at, ttl_ms, request_id) ON ledger.leases TO ledger_ingest;
GRANT EXECUTE ON FUNCTION ledger.fence_enforced() TO ledger_ingest, ledger_projector, ledger_operator;

-- ledger.ensure_partitions makes partitions ahead of the newest seq drawn,
-- never ahead of a seq its caller names beyond that: upto is clamped to the
-- newest seq drawn. Any caller may ask; none can make more than
-- partitions_ahead partitions past the log's end (it was any number).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.ensure_partitions(upto bigint, OUT partitions_end bigint, OUT rows_per_partition bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ahead  integer;
    drawn  bigint;
    want   bigint;
    pname  text;
BEGIN
    SELECT p.rows_per_partition, p.partitions_ahead INTO rows_per_partition, ahead FROM ledger.partitioning p;
    SELECT coalesce(max(e.hi), 1) INTO partitions_end FROM ledger.event_partitions e;
    drawn := coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledger.events', 'seq')::regclass), 0);
    want := drawn + ahead * rows_per_partition;
    IF upto > drawn THEN
        RAISE NOTICE 'ledger.ensure_partitions: seq % is past the newest seq drawn (%); partitions are made past %', upto, drawn, drawn;
    END IF;
    IF partitions_end >= want THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(7236281929003008869); -- 'ledger.ensure_partitions'
    SELECT coalesce(max(e.hi), 1) INTO partitions_end FROM ledger.event_partitions e;
    WHILE partitions_end < want LOOP
        pname := 'events_' || lpad(partitions_end::text, 19, '0');
        EXECUTE format('CREATE TABLE ledger.%I (LIKE ledger.events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', pname);
        EXECUTE format('ALTER TABLE ledger.events ATTACH PARTITION ledger.%I FOR VALUES FROM (%s) TO (%s)',
                       pname, partitions_end, partitions_end + rows_per_partition);
        INSERT INTO ledger.event_partitions (lo, hi, name)
        VALUES (partitions_end, partitions_end + rows_per_partition, pname);
        partitions_end := partitions_end + rows_per_partition;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.ensure_partitions(upto bigint, OUT partitions_end bigint, OUT rows_per_partition bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ahead  integer;
    drawn  bigint;
    want   bigint;
    pname  text;
BEGIN
    SELECT p.rows_per_partition, p.partitions_ahead INTO rows_per_partition, ahead FROM ledger.partitioning p;
    SELECT coalesce(max(e.hi), 1) INTO partitions_end FROM ledger.event_partitions e;
    drawn := coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledger.events', 'seq')::regclass), 0);
    want := greatest(upto, drawn) + ahead * rows_per_partition;
    IF partitions_end >= want THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(7236281929003008869); -- 'ledger.ensure_partitions'
    SELECT coalesce(max(e.hi), 1) INTO partitions_end FROM ledger.event_partitions e;
    WHILE partitions_end < want LOOP
        pname := 'events_' || lpad(partitions_end::text, 19, '0');
        EXECUTE format('CREATE TABLE ledger.%I (LIKE ledger.events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', pname);
        EXECUTE format('ALTER TABLE ledger.events ATTACH PARTITION ledger.%I FOR VALUES FROM (%s) TO (%s)',
                       pname, partitions_end, partitions_end + rows_per_partition);
        INSERT INTO ledger.event_partitions (lo, hi, name)
        VALUES (partitions_end, partitions_end + rows_per_partition, pname);
        partitions_end := partitions_end + rows_per_partition;
    END LOOP;
END
$$;
-- +goose StatementEnd
REVOKE UPDATE ON ledger.heads, ledger.leases FROM ledger_ingest;
GRANT UPDATE ON ledger.heads, ledger.leases TO ledger_ingest;
DROP TRIGGER lease_grants_fence ON ledger.lease_grants;
DROP TRIGGER leases_fence ON ledger.leases;
DROP TRIGGER event_ids_fence ON ledger.event_ids;
DROP TRIGGER heads_fence_update ON ledger.heads;
DROP TRIGGER heads_fence_insert ON ledger.heads;
DROP TRIGGER heads_moved_from ON ledger.heads;
DROP TRIGGER events_fence ON ledger.events;
DROP FUNCTION ledger.lease_grants_fence();
DROP FUNCTION ledger.leases_fence();
DROP FUNCTION ledger.event_ids_fence();
DROP FUNCTION ledger.heads_fence();
DROP FUNCTION ledger.heads_moved_from();
ALTER TABLE ledger.heads DROP COLUMN moved_from;
DROP FUNCTION ledger.events_fence();
DROP FUNCTION ledger.fence_enforced();
