-- +goose Up
-- The shadow fence (CONTRACT §13): a partition's fence mode, enforce (the
-- default, no row) or observe. In observe, an event the fence would refuse
-- as stale commits anyway, and its row says what enforce would have
-- answered (would_reject, e.g. 'stale/superseded').
CREATE TABLE ledger.fence_modes (
    partition  integer     PRIMARY KEY CHECK (partition >= 0),
    mode       text        NOT NULL CHECK (mode IN ('enforce', 'observe')),
    changed_by text        NOT NULL,
    db_user    text        NOT NULL,
    changed_at timestamptz NOT NULL
);

ALTER TABLE ledger.events ADD COLUMN would_reject text;

-- A switch of mode is an operator action like a cordon.
ALTER TABLE ledger.lease_actions DROP CONSTRAINT lease_actions_action_check;
ALTER TABLE ledger.lease_actions ADD CONSTRAINT lease_actions_action_check
    CHECK (action IN ('revoke', 'cordon', 'uncordon', 'enforce', 'observe'));

-- ledger.set_fence_mode switches partition p. It takes the lease row FOR
-- UPDATE, so it waits for the appends in flight: each append decides and
-- commits under one mode.
-- +goose StatementBegin
CREATE FUNCTION ledger.set_fence_mode(p integer, new_mode text, actor text, why text)
RETURNS TABLE (holder text, generation bigint, at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    cur ledger.leases%ROWTYPE;
    now_at timestamptz;
BEGIN
    IF p < 0 OR new_mode NOT IN ('enforce', 'observe') THEN
        RAISE EXCEPTION 'ledger fence mode: partition % mode %', p, new_mode USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO cur FROM ledger.leases l WHERE l.partition = p FOR UPDATE;
    now_at := clock_timestamp();
    INSERT INTO ledger.fence_modes (partition, mode, changed_by, db_user, changed_at)
    VALUES (p, new_mode, actor, session_user, now_at)
    ON CONFLICT (partition) DO UPDATE
    SET mode = EXCLUDED.mode, changed_by = EXCLUDED.changed_by, db_user = EXCLUDED.db_user,
        changed_at = EXCLUDED.changed_at;
    INSERT INTO ledger.lease_actions (partition, action, holder, generation, by_name, reason, at)
    VALUES (p, new_mode, cur.holder, cur.generation, actor, why, now_at);
    RETURN QUERY SELECT cur.holder, cur.generation, now_at;
END
$$;
-- +goose StatementEnd

GRANT SELECT ON ledger.fence_modes TO ledger_ingest, ledger_projector, ledger_operator;
REVOKE EXECUTE ON FUNCTION ledger.set_fence_mode(integer, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger.set_fence_mode(integer, text, text, text) TO ledger_operator;

-- +goose Down
DROP FUNCTION ledger.set_fence_mode(integer, text, text, text);
ALTER TABLE ledger.lease_actions DROP CONSTRAINT lease_actions_action_check;
ALTER TABLE ledger.lease_actions ADD CONSTRAINT lease_actions_action_check
    CHECK (action IN ('revoke', 'cordon', 'uncordon'));
ALTER TABLE ledger.events DROP COLUMN would_reject;
DROP TABLE ledger.fence_modes;
