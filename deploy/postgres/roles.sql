-- The ledger's group roles, for servers where the user that migrates the
-- ledger may not create roles (no CREATEROLE, as on many managed services).
-- An administrator runs this once per PostgreSQL server:
--   psql "$ADMIN_DATABASE_URL" -f deploy/postgres/roles.sql
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
