-- The ledger's group roles, for servers where the user that migrates the
-- ledger may not create roles (no CREATEROLE, as on many managed services)
-- or is not the owner of the ledger's database. An administrator runs this
-- connected to the ledger's database, once per ledger database (the roles
-- are made once per server; CONNECT is granted per database, to each of
-- its LOGIN users by name):
--   psql "postgres://admin@db.example/ledger" -f deploy/postgres/roles.sql
-- Migration 00002_roles.sql then only grants privileges to these roles. It is
-- safe to run again. docs/operations.md, "PostgreSQL roles", says what each
-- role may do and how to add LOGIN users to them.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'ledger_ingest') THEN
        BEGIN
            CREATE ROLE ledger_ingest NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'ledger_projector') THEN
        BEGIN
            CREATE ROLE ledger_projector NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'ledger_operator') THEN
        BEGIN
            CREATE ROLE ledger_operator NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
END
$$;

-- Only the ledger's own LOGIN users may connect to the ledger's database
-- (the same statements as migrations/00004_connect.sql, which the owner's
-- migration runs too): CONNECT is taken from PUBLIC and from the shared
-- group roles, and each LOGIN user of this ledger is granted it by name
-- (GRANT CONNECT ON DATABASE ledger TO ingest_svc). Run this script
-- connected to the ledger's database, once per ledger database. Connected
-- to a maintenance database instead, it leaves that database alone rather
-- than lock its other users out.
DO $$
DECLARE
    db text := current_database();
BEGIN
    IF db IN ('postgres', 'template0', 'template1') THEN
        RAISE NOTICE 'ledger roles: connected to %, not to a ledger database: CONNECT left as it is', db;
        RETURN;
    END IF;
    EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM PUBLIC', db);
    EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM ledger_ingest, ledger_projector, ledger_operator', db);
END
$$;
