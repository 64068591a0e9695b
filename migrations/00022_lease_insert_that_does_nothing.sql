-- +goose Up
-- An acquire first tries to insert the partition's lease row, ON CONFLICT
-- DO NOTHING, and moves the row that is there when one is. PostgreSQL runs
-- a BEFORE INSERT row trigger before it finds the conflict, so the
-- database's fence (migration 00012) refused that insert for any partition
-- leased before: its generation was not above the grants already made.
-- The ingest, as a user in ledger_ingest, then could not grant such a
-- partition to any new holder, only take it over by its generation. The
-- check now runs only when the partition has no lease row, the one case
-- in which an insert makes one. Where a row exists, the insert does nothing
-- or fails on the key, and a move of the row is checked as an update.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.leases_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NOT EXISTS (SELECT FROM ledger.leases l WHERE l.partition = NEW.partition)
           AND EXISTS (SELECT FROM ledger.lease_grants g WHERE g.partition = NEW.partition AND g.generation >= NEW.generation) THEN
            RAISE EXCEPTION 'ledger leases: partition % was granted generation % or later already', NEW.partition, NEW.generation
                USING ERRCODE = 'LF006';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'ledger leases: the generation of partition % would fall from % to %', OLD.partition, OLD.generation, NEW.generation
            USING ERRCODE = 'LF006';
    END IF;
    IF NEW.holder <> OLD.holder OR NEW.generation <> OLD.generation THEN
        IF NEW.generation = OLD.generation THEN
            RAISE EXCEPTION 'ledger leases: partition % changes holder without a new generation', OLD.partition
                USING ERRCODE = 'LF006';
        END IF;
        IF NEW.holder <> OLD.holder AND OLD.expires_at > clock_timestamp() THEN
            RAISE EXCEPTION 'ledger leases: the lease of partition % by % has not expired', OLD.partition, OLD.holder
                USING ERRCODE = 'LF006';
        END IF;
    ELSIF NEW.expires_at > OLD.expires_at AND OLD.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION 'ledger leases: the lease of partition % expired and is not renewed', OLD.partition
            USING ERRCODE = 'LF006';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.leases_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT ledger.fence_enforced() THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT FROM ledger.lease_grants g WHERE g.partition = NEW.partition AND g.generation >= NEW.generation) THEN
            RAISE EXCEPTION 'ledger leases: partition % was granted generation % or later already', NEW.partition, NEW.generation
                USING ERRCODE = 'LF006';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'ledger leases: the generation of partition % would fall from % to %', OLD.partition, OLD.generation, NEW.generation
            USING ERRCODE = 'LF006';
    END IF;
    IF NEW.holder <> OLD.holder OR NEW.generation <> OLD.generation THEN
        IF NEW.generation = OLD.generation THEN
            RAISE EXCEPTION 'ledger leases: partition % changes holder without a new generation', OLD.partition
                USING ERRCODE = 'LF006';
        END IF;
        IF NEW.holder <> OLD.holder AND OLD.expires_at > clock_timestamp() THEN
            RAISE EXCEPTION 'ledger leases: the lease of partition % by % has not expired', OLD.partition, OLD.holder
                USING ERRCODE = 'LF006';
        END IF;
    ELSIF NEW.expires_at > OLD.expires_at AND OLD.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION 'ledger leases: the lease of partition % expired and is not renewed', OLD.partition
            USING ERRCODE = 'LF006';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
