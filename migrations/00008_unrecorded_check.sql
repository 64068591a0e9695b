-- +goose Up
-- ledger.unrecorded_check raises when event ids an append is about to
-- commit already have a verdict in ledger.rejections. An append that
-- predicts its whole batch commits (every head cached, every lease as it
-- last read it) sends its lease lock, this check, its fenced insert and its
-- COMMIT in one round trip, without reading the recorded verdicts first:
-- raising here aborts the transaction before the insert, and the append
-- decides the batch again from what it reads (pkg/fence, fast.go). An id
-- with a recorded verdict keeps it (docs/contract.md §3).
--
-- It returns false so that it can sit in a WHERE clause that yields no row.
-- SQLSTATE LF002 is the ledger's own.
-- +goose StatementBegin
CREATE FUNCTION ledger.unrecorded_check(recorded bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF recorded <> 0 THEN
        RAISE EXCEPTION 'ledger verdicts: % event ids of the batch already have a recorded verdict', recorded
            USING ERRCODE = 'LF002';
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

GRANT EXECUTE ON FUNCTION ledger.unrecorded_check(bigint) TO ledger_ingest;

-- +goose Down
DROP FUNCTION ledger.unrecorded_check(bigint);
