-- +goose Up
-- ledger.wal_timeline is the timeline this server writes WAL on: it rises
-- with every promotion of a standby, so an old primary that came back
-- writable is on a lower timeline than the one the ledger last wrote to.
-- ledger.primary_check raises unless the server is at least on the given
-- timeline; every append calls it, with the newest timeline its ingest
-- knows of (pkg/fence, primary.go). SQLSTATE LF004 is the ledger's own.
-- +goose StatementBegin
CREATE FUNCTION ledger.wal_timeline() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

CREATE FUNCTION ledger.primary_check(min_timeline bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tl bigint := ledger.wal_timeline();
BEGIN
    IF tl < min_timeline THEN
        RAISE EXCEPTION 'ledger primary: this server writes on timeline %, but the ledger has written to timeline %: it is a superseded primary', tl, min_timeline
            USING ERRCODE = 'LF004',
                  HINT = 'fence or remove the old primary; the ledger commits only on the newest one';
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

GRANT EXECUTE ON FUNCTION ledger.wal_timeline() TO ledger_ingest, ledger_projector, ledger_operator;
GRANT EXECUTE ON FUNCTION ledger.primary_check(bigint) TO ledger_ingest;

-- +goose Down
DROP FUNCTION ledger.primary_check(bigint);
DROP FUNCTION ledger.wal_timeline();
