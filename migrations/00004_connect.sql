-- +goose Up
-- Only the ledger's roles may connect to the ledger's database.
--
-- PostgreSQL gives PUBLIC the CONNECT privilege on every new database, so
-- any LOGIN role of the server (another application's user, say) could open
-- a session here and read whatever PUBLIC may read. CONNECT is taken from
-- PUBLIC and given to the three group roles of 00002_roles.sql; the owner
-- and superusers keep it through ownership.
--
-- The group roles belong to the whole server: this keeps other users out,
-- not one ledger's services out of another ledger's database on the same
-- server. docs/security.md ("PostgreSQL roles") says how to narrow CONNECT
-- to each ledger's own LOGIN users.
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
        EXECUTE format('GRANT CONNECT ON DATABASE %I TO ledger_ingest, ledger_projector, ledger_operator', db);
    EXCEPTION WHEN insufficient_privilege THEN
        NULL; -- decided by the check below
    END;
    IF EXISTS (SELECT FROM pg_catalog.pg_database d,
                      pg_catalog.aclexplode(coalesce(d.datacl, pg_catalog.acldefault('d', d.datdba))) a
               WHERE d.datname = db AND a.grantee = 0 AND a.privilege_type = 'CONNECT')
       OR NOT has_database_privilege('ledger_ingest', db, 'CONNECT')
       OR NOT has_database_privilege('ledger_projector', db, 'CONNECT')
       OR NOT has_database_privilege('ledger_operator', db, 'CONNECT') THEN
        RAISE EXCEPTION 'ledger connect: % cannot take CONNECT on database % from PUBLIC and give it to the ledger''s roles', current_user, db
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
    EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM ledger_ingest, ledger_projector, ledger_operator', current_database());
END
$$;
-- +goose StatementEnd
