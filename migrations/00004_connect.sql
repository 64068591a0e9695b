-- +goose Up
-- Only the ledger's own LOGIN users may connect to the ledger's database.
--
-- PostgreSQL gives PUBLIC the CONNECT privilege on every new database, so
-- any LOGIN role of the server (another application's user, say) could open
-- a session here and read whatever PUBLIC may read. CONNECT is taken from
-- PUBLIC, and from the three group roles of 00002_roles.sql: those belong
-- to the whole server, so CONNECT granted to them would admit one ledger's
-- services into every other ledger's database on the same server. The
-- owner and superusers keep CONNECT through ownership; each LOGIN user of
-- this ledger gets it by name, from the administrator who creates it
-- (docs/operations.md, "PostgreSQL roles"):
--   CREATE ROLE ingest_svc LOGIN PASSWORD '...' IN ROLE ledger_ingest;
--   GRANT CONNECT ON DATABASE ledger TO ingest_svc;
--
-- GRANT and REVOKE need the database's name as an identifier, so they run
-- as dynamic SQL on current_database(). Only the database's owner (or a
-- superuser) can change its privileges; anyone else gets a warning and no
-- change, so the result is checked rather than assumed. Where an
-- administrator already ran deploy/postgres/roles.sql connected to this
-- database, the check passes whoever migrates.
--
-- CREATE DATABASE ... TEMPLATE and pg_dump without --create do not copy a
-- database's privileges: a ledger database made that way has PUBLIC CONNECT
-- again until roles.sql is run in it.
-- +goose StatementBegin
DO $$
DECLARE
    db text := current_database();
BEGIN
    BEGIN
        EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM PUBLIC', db);
        EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM ledger_ingest, ledger_projector, ledger_operator', db);
    EXCEPTION WHEN insufficient_privilege THEN
        NULL; -- decided by the check below
    END;
    IF EXISTS (SELECT FROM pg_catalog.pg_database d,
                      pg_catalog.aclexplode(coalesce(d.datacl, pg_catalog.acldefault('d', d.datdba))) a
               WHERE d.datname = db AND a.privilege_type = 'CONNECT'
                 AND a.grantee IN (0, 'ledger_ingest'::regrole, 'ledger_projector'::regrole, 'ledger_operator'::regrole)) THEN
        RAISE EXCEPTION 'ledger connect: % cannot take CONNECT on database % from PUBLIC and the ledger''s shared group roles', current_user, db
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Migrate as the database''s owner, or have an administrator run deploy/postgres/roles.sql connected to this database, then migrate again.';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO PUBLIC', current_database());
END
$$;
-- +goose StatementEnd
