-- +goose Up
-- Each partition's events are decided by one ingest process at a time.
-- ledger.ingest_claims holds, per partition, the ingest that decides it and
-- the claim's epoch: a fencing token of the ingests, as a lease's generation
-- is of the workers. Every append of a claimed batch locks its claim rows
-- FOR KEY SHARE and checks owner and epoch in its own transaction
-- (ledger.claim_check); a takeover locks the row FOR UPDATE, so it waits for
-- those appends, and raises the epoch. An ingest that was paused or cut off
-- and wakes up after a takeover cannot commit or reject anything for the
-- partition it lost. Expiry only says when another ingest may take over; a
-- renewal is a plain UPDATE of expires_at and waits for no append.
--
-- ledger.ingest_members lists the live ingest processes, so that each can
-- take its share of the partitions (docs/operations.md, "Several ingests").
CREATE TABLE ledger.ingest_claims (
    partition  integer PRIMARY KEY,
    owner      text NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch >= 1),
    expires_at timestamptz NOT NULL,
    claimed_at timestamptz NOT NULL
);

CREATE TABLE ledger.ingest_members (
    owner      text PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    joined_at  timestamptz NOT NULL
);

-- ledger.claim_check raises unless an append holds every claim it names
-- (held = wanted). SQLSTATE LF003 is the ledger's own. It returns false so
-- that it can sit in a WHERE clause that yields no row.
-- +goose StatementBegin
CREATE FUNCTION ledger.claim_check(held bigint, wanted bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF held <> wanted THEN
        RAISE EXCEPTION 'ledger claims: this ingest holds % of the % partition claims its batch needs', held, wanted
            USING ERRCODE = 'LF003',
                  HINT = 'another ingest took the partition over; this one must stop deciding it';
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

-- Claims are never deleted: a released or expired claim keeps its epoch, so
-- the next raises it. Members that left long ago are deleted.
GRANT SELECT, INSERT, UPDATE ON ledger.ingest_claims TO ledger_ingest;
GRANT SELECT, INSERT, UPDATE, DELETE ON ledger.ingest_members TO ledger_ingest;
GRANT SELECT ON ledger.ingest_claims, ledger.ingest_members TO ledger_projector, ledger_operator;
GRANT EXECUTE ON FUNCTION ledger.claim_check(bigint, bigint) TO ledger_ingest;

-- +goose Down
DROP FUNCTION ledger.claim_check(bigint, bigint);
DROP TABLE ledger.ingest_members;
DROP TABLE ledger.ingest_claims;
