-- +goose Up
-- ledger.primary_check(min, max) raises unless the server writes on a
-- timeline between min and max. An ingest passes the newest timeline the
-- ledger witnessed (bucket ledger_witness) as both: below it the server is
-- a superseded primary (LF004); above it the server was promoted and the
-- witness has not recorded it yet (LF005), so nothing may commit there
-- until it has, or an ingest that starts against the old primary in that
-- moment would still take it for the newest (pkg/fence, primary.go). The
-- detail of LF005 is the server's timeline. The one-argument form stays
-- for ingests of an earlier version during a rolling upgrade.
-- +goose StatementBegin
CREATE FUNCTION ledger.primary_check(min_timeline bigint, max_timeline bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tl bigint := ledger.wal_timeline();
BEGIN
    IF tl < min_timeline THEN
        RAISE EXCEPTION 'ledger primary: this server writes on timeline %, but the ledger has written to timeline %: it is a superseded primary', tl, min_timeline
            USING ERRCODE = 'LF004',
                  HINT = 'fence or remove the old primary; the ledger commits only on the newest one';
    END IF;
    IF tl > max_timeline THEN
        RAISE EXCEPTION 'ledger primary: this server writes on timeline %, newer than the witnessed timeline %', tl, max_timeline
            USING ERRCODE = 'LF005',
                  DETAIL = tl::text,
                  HINT = 'the ingest records the newer timeline and tries again';
    END IF;
    RETURN false;
END
$$;
-- +goose StatementEnd

GRANT EXECUTE ON FUNCTION ledger.primary_check(bigint, bigint) TO ledger_ingest;

-- +goose Down
DROP FUNCTION ledger.primary_check(bigint, bigint);
