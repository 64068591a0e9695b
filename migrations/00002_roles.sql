-- +goose Up
-- Least-privilege group roles (docs/operations.md, "PostgreSQL roles"). They
-- are NOLOGIN: a deployment creates its own LOGIN users IN ROLE one of them,
--   CREATE ROLE ingest_svc LOGIN PASSWORD '...' IN ROLE ledger_ingest;
--   GRANT CONNECT ON DATABASE ledger TO ingest_svc; -- see 00004_connect.sql
-- and only the schema's owner runs migrations.
--
--   ledger_ingest     the ingest service: appends events, records rejections
--                     and grants, and moves leases. It can never delete,
--                     truncate or rewrite history.
--   ledger_projector  the projector: reads, to re-fetch missing versions.
--   ledger_operator   people and ledgerctl: the tables of CONTRACT §7, read only.
--
-- Roles belong to the whole PostgreSQL cluster, not to this database: several
-- ledger databases on one server (and test databases migrated at the same
-- time) share them. So each is created only if missing, and a concurrent
-- creation by another database's migration is tolerated: it surfaces as
-- duplicate_object, or as unique_violation on pg_authid when both
-- transactions checked before either committed.
--
-- CREATE ROLE needs CREATEROLE. Where the migrating user does not have it,
-- an administrator runs deploy/postgres/roles.sql first; this migration then
-- only grants.
-- +goose StatementBegin
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
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'ledger roles: % cannot create roles', current_user
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Run deploy/postgres/roles.sql as a user with CREATEROLE, then migrate again.';
END
$$;
-- +goose StatementEnd

GRANT USAGE ON SCHEMA ledger TO ledger_ingest, ledger_projector, ledger_operator;

-- Append-only: INSERT and SELECT, never UPDATE, DELETE or TRUNCATE.
GRANT SELECT, INSERT ON ledger.events, ledger.rejections, ledger.lease_grants TO ledger_ingest;
-- Leases move by UPDATE (takeover, renew, release); the fenced append's
-- SELECT ... FOR SHARE needs UPDATE too. Lease rows are never deleted.
GRANT SELECT, INSERT, UPDATE ON ledger.leases TO ledger_ingest;
-- Identity columns draw from their sequence without a grant; this keeps
-- nextval working should a column ever become a plain sequence default.
GRANT USAGE ON ALL SEQUENCES IN SCHEMA ledger TO ledger_ingest;

GRANT SELECT ON ledger.events, ledger.rejections, ledger.lease_grants, ledger.leases
    TO ledger_projector, ledger_operator;

-- Reading the applied versions lets these roles pass the services'
-- migrations readiness check, and makes `-migrate` a no-op for them once the
-- owner has migrated (migrations.VersionTable).
GRANT SELECT ON public.ledger_schema_version TO ledger_ingest, ledger_projector, ledger_operator;

-- A later migration that adds a table grants on it in the same file.

-- +goose Down
-- The roles stay: other databases on the server may use them. Drop them by
-- hand once no database refers to them (docs/operations.md).
REVOKE ALL ON public.ledger_schema_version FROM ledger_ingest, ledger_projector, ledger_operator;
REVOKE ALL ON ALL TABLES IN SCHEMA ledger FROM ledger_ingest, ledger_projector, ledger_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA ledger FROM ledger_ingest, ledger_projector, ledger_operator;
REVOKE ALL ON SCHEMA ledger FROM ledger_ingest, ledger_projector, ledger_operator;
