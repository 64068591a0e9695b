-- +goose Up
-- ledger.horizon and ledger.partitioning hold one row each. Never
-- analysed, a table is planned as about a thousand rows, and autovacuum
-- analyses a table only after 50 changes: these two change once per
-- archive. Queries that join one (the head lookups, the append's id
-- floor) were then costed a thousand times too high; the lookup of a
-- task's head, a one-row probe, crossed jit_above_cost and paid about
-- 10 ms of JIT compilation per call, which held an SDK over fresh tasks
-- to 85 events/s. The statistics are taken now, and autovacuum takes them
-- again after any change (a restore from pg_dump, which carries the
-- settings but not the statistics, included).
ALTER TABLE ledger.horizon SET (autovacuum_analyze_threshold = 0, autovacuum_analyze_scale_factor = 0);
ALTER TABLE ledger.partitioning SET (autovacuum_analyze_threshold = 0, autovacuum_analyze_scale_factor = 0);
ANALYZE ledger.horizon;
ANALYZE ledger.partitioning;

-- +goose Down
ALTER TABLE ledger.partitioning RESET (autovacuum_analyze_threshold, autovacuum_analyze_scale_factor);
ALTER TABLE ledger.horizon RESET (autovacuum_analyze_threshold, autovacuum_analyze_scale_factor);
