-- +goose Up
-- The database fence's checks of a statement's ids and heads (migration
-- 00018) each probed ledger.events once a row: an index probe of the
-- partitioned table, pruned again for every row, about 2 µs each, a
-- millisecond for an append of 500 events. Each now reads the seq range
-- the statement's rows span once and joins it by hash: the rows of that
-- range are the statement's own and those of appends beside it. Without
-- nested loops the planner cannot go back to the probes: it does not know
-- how few rows the range holds. What each refuses is unchanged.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.event_ids_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_nestloop = off AS $$
DECLARE
    bad text;
BEGIN
    SELECT n.event_id INTO bad
    FROM new_ids n
    LEFT JOIN (SELECT e.seq, e.event_id FROM ledger.events e
               WHERE e.seq >= (SELECT min(m.seq) FROM new_ids m)
                 AND e.seq <= (SELECT max(m.seq) FROM new_ids m)) e ON e.seq = n.seq
    WHERE ledger.fence_enforced() AND e.event_id IS DISTINCT FROM n.event_id
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger ids: event id % names no row that carries it', bad
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
ALTER FUNCTION ledger.heads_fence() SET enable_nestloop = off;

-- +goose Down
ALTER FUNCTION ledger.heads_fence() RESET enable_nestloop;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger.event_ids_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
BEGIN
    SELECT n.event_id INTO bad FROM new_ids n
    WHERE ledger.fence_enforced()
      AND NOT EXISTS (SELECT FROM ledger.events e WHERE e.seq = n.seq AND e.event_id = n.event_id)
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger ids: event id % names no row that carries it', bad
            USING ERRCODE = 'LF005';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
