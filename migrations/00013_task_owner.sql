-- +goose Up
-- A task belongs to the principal that wrote its first version
-- (docs/contract.md §3, not_owner). ledger.heads.owner keeps it: written
-- with the head of version 1, never changed (the ingest may update only a
-- head's version, seq and type: migration 00012). Tasks committed before
-- this migration take the principal of their version 1's holder where the
-- hot log still holds it; a task whose version 1 is archived keeps no
-- owner, and any principal may write it, as before.
ALTER TABLE ledger.heads ADD COLUMN owner text;
UPDATE ledger.heads h SET owner = split_part(e.holder, '.', 1)
FROM ledger.events e WHERE e.seq = h.first_seq AND e.task_id = h.task_id AND e.version = 1;

-- +goose Down
ALTER TABLE ledger.heads DROP COLUMN owner;
