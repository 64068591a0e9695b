-- +goose Up
-- The ledger's tables (CONTRACT §7). Every time is decided by the database
-- clock; clients never send one.
CREATE SCHEMA IF NOT EXISTS ledger;

-- One row per partition that was ever leased. generation is the fencing
-- token: it only ever rises, and a released lease keeps it.
CREATE TABLE ledger.leases (
    partition  integer     PRIMARY KEY CHECK (partition >= 0),
    holder     text        NOT NULL,
    generation bigint      NOT NULL CHECK (generation >= 1),
    expires_at timestamptz NOT NULL,
    -- ttl_ms is the TTL of the last grant or renewal; a renewal without a
    -- TTL of its own reuses it.
    ttl_ms     integer     NOT NULL CHECK (ttl_ms > 0)
);

-- Every grant, in order: the audit trail the commit-order invariant is
-- checked against (an event of generation g must carry the holder granted g).
CREATE TABLE ledger.lease_grants (
    partition  integer     NOT NULL,
    generation bigint      NOT NULL,
    holder     text        NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (partition, generation)
);

-- The committed log. seq is the global position; (task_id, version) is dense
-- per task, and the unique index on it is what serialises concurrent writers
-- of one task. A task's partition is the partition of its version 1.
CREATE TABLE ledger.events (
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
    CONSTRAINT events_event_id_key UNIQUE (event_id),
    CONSTRAINT events_task_version_key UNIQUE (task_id, version)
);

-- Stale, conflicting and gap-timed-out events: what was refused and why.
CREATE TABLE ledger.rejections (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           text        NOT NULL,
    partition          integer     NOT NULL,
    task_id            text        NOT NULL,
    version            bigint      NOT NULL,
    holder             text        NOT NULL,
    generation         bigint      NOT NULL,
    verdict            text        NOT NULL,
    reason             text        NOT NULL,
    current_generation bigint,
    rejected_at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX rejections_event_id_idx ON ledger.rejections (event_id);
CREATE INDEX rejections_task_idx ON ledger.rejections (task_id, version);

-- +goose Down
DROP SCHEMA ledger CASCADE;
