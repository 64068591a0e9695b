-- +goose Up
-- ledger.heads.moved_from is still the version a head moved from in the
-- statement that last moved it (0 for a new head), whatever the statement
-- wrote (migration 00012). The append now writes that value itself, so the
-- row trigger runs only for a row that says anything else: a statement of
-- an ingest from before this migration (a rolling upgrade) or one that
-- names a wrong value. Such a row still gets the old version, as before.
-- The trigger's condition is evaluated without a PL/pgSQL call, which the
-- append paid for every head it moved (docs/internals/benchmarks.md, "The
-- database's own fence").
DROP TRIGGER heads_moved_from ON ledger.heads;
CREATE TRIGGER heads_moved_from_insert BEFORE INSERT ON ledger.heads
    FOR EACH ROW WHEN (NEW.moved_from IS DISTINCT FROM 0)
    EXECUTE FUNCTION ledger.heads_moved_from();
CREATE TRIGGER heads_moved_from_update BEFORE UPDATE ON ledger.heads
    FOR EACH ROW WHEN (NEW.moved_from IS DISTINCT FROM OLD.version)
    EXECUTE FUNCTION ledger.heads_moved_from();
GRANT UPDATE (moved_from) ON ledger.heads TO ledger_ingest;

-- +goose Down
REVOKE UPDATE (moved_from) ON ledger.heads FROM ledger_ingest;
DROP TRIGGER heads_moved_from_update ON ledger.heads;
DROP TRIGGER heads_moved_from_insert ON ledger.heads;
CREATE TRIGGER heads_moved_from BEFORE INSERT OR UPDATE ON ledger.heads
    FOR EACH ROW EXECUTE FUNCTION ledger.heads_moved_from();
