-- +goose Up
-- An acquire may carry a request id (CONTRACT §1): a retry with the id of
-- the grant that made the current generation gets that same grant back
-- instead of a second bump. The lease row keeps the id of its last grant,
-- and every grant records its own.
ALTER TABLE ledger.leases ADD COLUMN request_id text;
ALTER TABLE ledger.lease_grants ADD COLUMN request_id text;

-- +goose Down
ALTER TABLE ledger.lease_grants DROP COLUMN request_id;
ALTER TABLE ledger.leases DROP COLUMN request_id;
