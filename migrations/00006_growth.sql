-- +goose Up
-- A ledger that only grows, at a cost that does not (pkg/fence/doc.go,
-- "Growth"; docs/scaling.md):
--
--   ledger.events       partitioned by seq range: the indexes an append
--                       touches at random are the newest partition's, and
--                       old history leaves by dropping whole partitions
--                       (ledgerctl archive), never by DELETE.
--   ledger.heads        one row per task: its partition, last version and
--                       seq. An append reads it instead of searching the
--                       log, and moves it in its own insert; its row lock
--                       is what serialises two writers of one task, the job
--                       the unique index on (task_id, version) did over all
--                       history.
--   ledger.event_ids    every event id of the hot log, unique: idempotency
--                       by id, the job of the unique index on event_id. An
--                       archive removes the ids it moves, and raises the id
--                       floor below which the ledger no longer promises to
--                       recognise an id (ledger.horizon).
--   ledger.horizon      what was archived: every event below below_seq, and
--                       the event ids minted before id_floor_at.
--   ledger.event_partitions  every partition of ledger.events, made or
--                       archived, and for an archived one its file.
--   ledger.partitioning the size of a partition and how many are kept ready
--                       ahead of the newest seq.
--
-- The existing rows become the first partition, as they are: their unique
-- constraints give way to the partitioned table's index on (task_id,
-- version), built here once; heads and event ids are read from them.

CREATE TABLE ledger.partitioning (
    singleton          boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- rows_per_partition bounds the size of the indexes new rows go into:
    -- 4,194,304 rows are about 1.5 GB of table and 200 MB of the (task_id,
    -- version) index. A change applies to partitions made afterwards.
    rows_per_partition bigint  NOT NULL DEFAULT 4194304 CHECK (rows_per_partition >= 1),
    -- partitions_ahead is how many partitions beyond the newest seq exist.
    partitions_ahead   integer NOT NULL DEFAULT 2 CHECK (partitions_ahead >= 1)
);
INSERT INTO ledger.partitioning DEFAULT VALUES;

CREATE TABLE ledger.event_partitions (
    lo                 bigint      PRIMARY KEY,
    hi                 bigint      NOT NULL CHECK (hi > lo),
    name               text        NOT NULL UNIQUE,
    created_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Set by ledgerctl archive once the partition's rows are in file and
    -- the partition is dropped.
    archived_at        timestamptz,
    rows               bigint,
    file               text,
    sha256             text,
    bytes              bigint,
    first_committed_at timestamptz,
    last_committed_at  timestamptz
);

CREATE TABLE ledger.horizon (
    singleton    boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Every event with seq < below_seq is archived (or being archived).
    below_seq    bigint      NOT NULL DEFAULT 1,
    -- id_floor is the first 10 characters of a ULID minted at id_floor_at:
    -- an event id whose first 10 characters, in upper case, sort below it
    -- was minted before the floor. '' while nothing is archived.
    id_floor     text        NOT NULL DEFAULT '',
    id_floor_at  timestamptz,
    moved_at     timestamptz
);
INSERT INTO ledger.horizon DEFAULT VALUES;

-- +goose StatementBegin
DO $$
DECLARE
    top bigint;
BEGIN
    ALTER TABLE ledger.events RENAME TO events_legacy;
    ALTER TABLE ledger.events_legacy RENAME CONSTRAINT events_pkey TO events_legacy_pkey;
    ALTER TABLE ledger.events_legacy DROP CONSTRAINT events_event_id_key;
    ALTER TABLE ledger.events_legacy DROP CONSTRAINT events_task_version_key;
    SELECT max(seq) INTO top FROM ledger.events_legacy;
    -- The partitioned table draws seq from a sequence of its own, which
    -- continues where the old one stood.
    ALTER TABLE ledger.events_legacy ALTER COLUMN seq DROP IDENTITY;

    CREATE TABLE ledger.events (
        seq          bigint      GENERATED ALWAYS AS IDENTITY,
        event_id     text        NOT NULL,
        partition    integer     NOT NULL,
        task_id      text        NOT NULL,
        version      bigint      NOT NULL,
        type         text        NOT NULL,
        payload      jsonb       NOT NULL,
        holder       text        NOT NULL,
        generation   bigint      NOT NULL,
        committed_at timestamptz NOT NULL,
        CONSTRAINT events_pkey PRIMARY KEY (seq),
        -- Named as the old table's, so that its rows attach as they are.
        CONSTRAINT events_version_check CHECK (version >= 1),
        CONSTRAINT events_generation_check CHECK (generation >= 1)
    ) PARTITION BY RANGE (seq);
    -- Not unique: a unique index of a partitioned table must hold seq.
    -- ledger.heads keeps versions dense and ledger.event_ids ids unique.
    CREATE INDEX events_task_version_idx ON ledger.events (task_id, version);

    IF top IS NULL THEN
        DROP TABLE ledger.events_legacy;
    ELSE
        PERFORM setval(pg_get_serial_sequence('ledger.events', 'seq'), top + 1, false);
        -- The check lets the attach skip its own scan of the rows.
        EXECUTE format('ALTER TABLE ledger.events_legacy ADD CONSTRAINT events_legacy_range CHECK (seq >= 1 AND seq < %s)', top + 1);
        EXECUTE format('ALTER TABLE ledger.events ATTACH PARTITION ledger.events_legacy FOR VALUES FROM (1) TO (%s)', top + 1);
        ALTER TABLE ledger.events_legacy DROP CONSTRAINT events_legacy_range;
        INSERT INTO ledger.event_partitions (lo, hi, name) VALUES (1, top + 1, 'events_legacy');
    END IF;
END
$$;
-- +goose StatementEnd

CREATE TABLE ledger.heads (
    task_id   text    PRIMARY KEY,
    partition integer NOT NULL,
    version   bigint  NOT NULL CHECK (version >= 1),
    seq       bigint  NOT NULL,
    type      text    NOT NULL,
    -- first_seq is the seq of version 1: a task's rows lie between
    -- first_seq and seq, which bounds a lookup to the partitions it spans.
    first_seq bigint  NOT NULL
) WITH (fillfactor = 80); -- room for the updates of a row to stay on its page

INSERT INTO ledger.heads (task_id, partition, version, seq, type, first_seq)
SELECT DISTINCT ON (task_id) task_id, partition, version, seq, type, min(seq) OVER (PARTITION BY task_id)
FROM ledger.events ORDER BY task_id, version DESC;

CREATE TABLE ledger.event_ids (
    event_id text   PRIMARY KEY,
    seq      bigint NOT NULL
);
INSERT INTO ledger.event_ids (event_id, seq) SELECT event_id, seq FROM ledger.events;

-- ledger.ensure_partitions makes partitions of ledger.events until they
-- reach partitions_ahead partitions past upto (or past the newest seq
-- drawn, whichever is higher) and returns where they end and the size of
-- a partition. The ingest calls it as its appends near the end, so
-- commits never wait for an operator. It runs as the schema's owner
-- (SECURITY DEFINER), since only the owner may attach a partition; the
-- ingest may call it and do nothing else of the kind.
--
-- A partition is made as a table and then attached, which locks
-- ledger.events SHARE UPDATE EXCLUSIVE: appends go on meanwhile.
-- +goose StatementBegin
CREATE FUNCTION ledger.ensure_partitions(upto bigint, OUT partitions_end bigint, OUT rows_per_partition bigint)
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

-- ledger.heads_check raises when fewer task heads moved than the append
-- planned: another writer committed a version of one of its tasks first.
-- It raises unique_violation, what the unique index on (task_id, version)
-- raised in the same race, and the append reads again and decides again.
-- +goose StatementBegin
CREATE FUNCTION ledger.heads_check(expected bigint, moved bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF moved <> expected THEN
        RAISE EXCEPTION 'ledger heads: % of % task heads moved as planned; another writer committed first', moved, expected
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

-- ledger.ids_check raises when fewer event ids were recorded than inserted:
-- some were minted before the id floor, which an archive raised after the
-- append read it. unique_violation, as for an id that exists, makes the
-- append read the horizon again and refuse them (invalid/before_horizon).
-- +goose StatementBegin
CREATE FUNCTION ledger.ids_check(expected bigint, recorded bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF recorded <> expected THEN
        RAISE EXCEPTION 'ledger ids: % of % event ids were minted before the archive horizon''s id floor', expected - recorded, expected
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

SELECT ledger.ensure_partitions(0);

GRANT SELECT, INSERT ON ledger.events, ledger.event_ids TO ledger_ingest;
GRANT SELECT, INSERT, UPDATE ON ledger.heads TO ledger_ingest;
GRANT SELECT ON ledger.horizon, ledger.event_partitions, ledger.partitioning TO ledger_ingest;
GRANT EXECUTE ON FUNCTION ledger.ensure_partitions(bigint), ledger.heads_check(bigint, bigint),
    ledger.ids_check(bigint, bigint) TO ledger_ingest;
GRANT SELECT ON ledger.events, ledger.heads, ledger.event_ids, ledger.horizon, ledger.event_partitions,
    ledger.partitioning TO ledger_projector, ledger_operator;
REVOKE EXECUTE ON FUNCTION ledger.ensure_partitions(bigint) FROM PUBLIC;

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    top bigint;
BEGIN
    IF EXISTS (SELECT FROM ledger.event_partitions WHERE archived_at IS NOT NULL) THEN
        RAISE EXCEPTION 'ledger: history was archived; the unpartitioned schema cannot hold a log with a hole';
    END IF;
    CREATE TABLE ledger.events_flat (
        seq          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id     text        NOT NULL,
        partition    integer     NOT NULL,
        task_id      text        NOT NULL,
        version      bigint      NOT NULL CHECK (version >= 1),
        type         text        NOT NULL,
        payload      jsonb       NOT NULL,
        holder       text        NOT NULL,
        generation   bigint      NOT NULL CHECK (generation >= 1),
        committed_at timestamptz NOT NULL,
        CONSTRAINT events_flat_event_id_key UNIQUE (event_id),
        CONSTRAINT events_flat_task_version_key UNIQUE (task_id, version)
    );
    INSERT INTO ledger.events_flat OVERRIDING SYSTEM VALUE SELECT * FROM ledger.events ORDER BY seq;
    SELECT max(seq) INTO top FROM ledger.events;
    PERFORM setval(pg_get_serial_sequence('ledger.events_flat', 'seq'), coalesce(top, 0) + 1, false);
    DROP TABLE ledger.events;
    ALTER TABLE ledger.events_flat RENAME TO events;
    ALTER TABLE ledger.events RENAME CONSTRAINT events_flat_pkey TO events_pkey;
    ALTER TABLE ledger.events RENAME CONSTRAINT events_flat_event_id_key TO events_event_id_key;
    ALTER TABLE ledger.events RENAME CONSTRAINT events_flat_task_version_key TO events_task_version_key;
END
$$;
-- +goose StatementEnd
GRANT SELECT, INSERT ON ledger.events TO ledger_ingest;
GRANT SELECT ON ledger.events TO ledger_projector, ledger_operator;
DROP FUNCTION ledger.ids_check(bigint, bigint);
DROP FUNCTION ledger.heads_check(bigint, bigint);
DROP FUNCTION ledger.ensure_partitions(bigint);
DROP TABLE ledger.event_ids, ledger.heads, ledger.horizon, ledger.event_partitions, ledger.partitioning;
