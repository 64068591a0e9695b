-- +goose Up
-- ledger.fence_check raises when fewer rows passed the fence of a fenced
-- insert than the append expected: a lease expired between the append's
-- reads and its insert. Raising inside the insert's statement aborts the
-- transaction, so the append can send its insert and its COMMIT together in
-- one round trip and still never commit part of a batch it decided on a
-- lease that has since run out (pkg/fence: sqlAppendInsert).
--
-- It returns false so that it can sit in a WHERE clause that yields no row.
-- SQLSTATE LF001 is the ledger's own ("ledger fence").
-- +goose StatementBegin
CREATE FUNCTION ledger.fence_check(expected bigint, passed bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF passed <> expected THEN
        RAISE EXCEPTION 'ledger fence: % of % events passed the fence; a lease expired during the append', passed, expected
            USING ERRCODE = 'LF001';
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

-- The ingest's appends call it. PUBLIC may execute functions by default;
-- the explicit grant keeps the ingest working where a deployment revokes that.
GRANT EXECUTE ON FUNCTION ledger.fence_check(bigint, bigint) TO ledger_ingest;

-- +goose Down
DROP FUNCTION ledger.fence_check(bigint, bigint);
