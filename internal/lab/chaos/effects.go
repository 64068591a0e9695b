package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fencecheck"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker/effect"
)

// Side effects in a run (docs/side-effects.md). Every event of type
// effectType is an intent: the run's effect runner performs the committed
// ones on the downstream database, keyed by event id ("log" path). A writer
// also performs each such effect directly (the "direct" path), with its
// fence, through ledger_fence.admit, zombies included. The checker reads
// the downstream's rows.
const (
	// effectType is the type of the events that are effect intents.
	effectType = "checkpoint"
	// effectResource is the one downstream resource the fences guard.
	effectResource = "chaos"
	// downstreamDB is the downstream's database, in the run's PostgreSQL.
	downstreamDB = "downstream"
	// effectRunner names the run's effect runner (its durable consumer is
	// effects-chaos).
	effectRunner = "chaos"
)

// Paths an effect takes to the downstream.
const (
	pathLog    = "log"
	pathDirect = "direct"
)

// sqlEffectsTable is the downstream's own table. seq orders the direct
// effects of a partition as the fence check serialised them: a row is
// inserted while ledger_fence.admit holds its partition's row lock.
const sqlEffectsTable = `CREATE TABLE IF NOT EXISTS chaos_effects (
    seq bigserial PRIMARY KEY, key text NOT NULL UNIQUE, event_id text NOT NULL, path text NOT NULL,
    partition integer NOT NULL, holder text NOT NULL, generation bigint NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`

const sqlInsertEffect = `INSERT INTO chaos_effects (key, event_id, path, partition, holder, generation)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING`

const sqlEffects = `SELECT seq, event_id, path, partition, holder, generation FROM chaos_effects ORDER BY seq`

// EffectRow is a row of the downstream's chaos_effects: one applied effect.
type EffectRow struct {
	Seq        int64
	EventID    string
	Path       string
	Partition  int
	Holder     string
	Generation int64
}

// setupDownstream creates the downstream database next to the ledger's,
// applies the fence check and the effects table, and returns its URL and
// a pool on it.
func setupDownstream(ctx context.Context, admin *pgxpool.Pool, ledgerURL string) (string, *pgxpool.Pool, error) {
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+downstreamDB); err != nil {
		return "", nil, fmt.Errorf("chaos: create the downstream database: %w", err)
	}
	u, err := url.Parse(ledgerURL)
	if err != nil {
		return "", nil, fmt.Errorf("chaos: database URL: %w", err)
	}
	u.Path = "/" + downstreamDB
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return "", nil, fmt.Errorf("chaos: downstream database: %w", err)
	}
	if err := fencecheck.Apply(ctx, pool); err != nil {
		pool.Close()
		return "", nil, err
	}
	if _, err := pool.Exec(ctx, sqlEffectsTable); err != nil {
		pool.Close()
		return "", nil, fmt.Errorf("chaos: create chaos_effects: %w", err)
	}
	return u.String(), pool, nil
}

// startEffectRunner runs the committed intents on the downstream until
// Stop: the log path.
func startEffectRunner(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, prefix string, log *slog.Logger) (*effect.Runner, error) {
	r, err := effect.New(js, effect.Config{Name: effectRunner, Types: []string{effectType}, Prefix: prefix,
		PinnedTTL: 2 * time.Second, AckWait: 5 * time.Second, RetryDelay: 200 * time.Millisecond, Logger: log},
		func(ctx context.Context, e effect.Effect) error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := pool.Exec(ctx, sqlInsertEffect, e.ID, e.ID, pathLog, e.Partition, e.Fence.Holder, e.Fence.Generation)
			if err != nil {
				return fmt.Errorf("apply effect %s: %w", e.ID, err)
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// effectsPending is how many log messages the effect runner has not acked
// yet (-1 if it cannot tell), and its consumer's state in words, for a run
// that does not drain: what the server delivered, what waits, its pin.
func effectsPending(ctx context.Context, js jetstream.JetStream) (int64, string) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := js.Consumer(cctx, wire.StreamLog, "effects-"+effectRunner)
	if err != nil {
		return -1, err.Error()
	}
	info, err := c.Info(cctx)
	if err != nil {
		return -1, err.Error()
	}
	pins := make([]string, 0, len(info.PriorityGroups))
	for _, g := range info.PriorityGroups {
		pins = append(pins, fmt.Sprintf("%s pinned %q since %v", g.Group, g.PinnedClientID, g.PinnedTS))
	}
	return int64(info.NumPending) + int64(info.NumAckPending),
		fmt.Sprintf("pending %d, ack pending %d, redelivered %d, waiting pulls %d, delivered to stream seq %d, ack floor %d, %v",
			info.NumPending, info.NumAckPending, info.NumRedelivered, info.NumWaiting, info.Delivered.Stream, info.AckFloor.Stream, pins)
}

// directEffect performs the effect of intent id directly, with the
// writer's fence of generation gen, and logs the attempt and its outcome.
func (w *writer) directEffect(ctx context.Context, gen int64, id string, zombie bool) {
	f := wire.Fence{Partition: w.cfg.Partition, Holder: w.cfg.Holder, Generation: gen}
	w.log.add(Record{Kind: KindEffect, ID: id, Gen: gen, Zombie: zombie})
	ctx, cancel := context.WithTimeout(ctx, max(w.cfg.TTL, time.Second))
	defer cancel()
	err := pgx.BeginFunc(ctx, w.cfg.Downstream, func(tx pgx.Tx) error {
		if err := fencecheck.Admit(ctx, tx, effectResource, f); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlInsertEffect, id+"/"+pathDirect, id, pathDirect, f.Partition, f.Holder, f.Generation)
		return err
	})
	rec := Record{Kind: KindEffectDone, ID: id, Verdict: "applied"}
	switch {
	case errors.Is(err, fencecheck.ErrSuperseded), errors.Is(err, fencecheck.ErrHolderMismatch):
		rec.Verdict = "refused"
	case err != nil:
		rec.Verdict, rec.Err = "error", err.Error()
	}
	w.log.add(rec)
}

// collectEffects reads the downstream's applied effects.
func collectEffects(ctx context.Context, pool *pgxpool.Pool, h *History) error {
	rows, err := pool.Query(ctx, sqlEffects)
	if err != nil {
		return fmt.Errorf("chaos: read chaos_effects: %w", err)
	}
	effects, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (EffectRow, error) {
		var e EffectRow
		err := row.Scan(&e.Seq, &e.EventID, &e.Path, &e.Partition, &e.Holder, &e.Generation)
		return e, err
	})
	if err != nil {
		return fmt.Errorf("chaos: read chaos_effects: %w", err)
	}
	h.Effects, h.EffectsRead = effects, true
	return nil
}

// effects checks the side effects of a history whose downstream was read:
// no direct effect of a partition is applied after one of a higher
// generation, and every committed intent has its log-path effect.
func (c *checker) effects() {
	for _, w := range c.h.Writers {
		for _, rec := range w.Records {
			if rec.Kind == KindEffectDone {
				c.r.DirectEffects[rec.Verdict]++
			}
		}
	}
	if !c.h.EffectsRead {
		return
	}
	c.r.EffectsChecked = true
	applied := map[string]bool{}
	highest := map[int]EffectRow{}
	rows := append([]EffectRow(nil), c.h.Effects...)
	sort.Slice(rows, func(i, j int) bool { return rows[i].Seq < rows[j].Seq })
	for _, e := range rows {
		if e.Path == pathLog {
			applied[e.EventID] = true
			continue
		}
		if top, ok := highest[e.Partition]; ok && e.Generation < top.Generation {
			c.r.add(Violation{Kind: SupersededEffect, EventID: e.EventID, Task: c.taskOf(e.EventID),
				Detail: fmt.Sprintf("direct effect of %s generation %d on partition %d applied after one of generation %d (%s)",
					e.Holder, e.Generation, e.Partition, top.Generation, top.Holder)})
			continue
		}
		highest[e.Partition] = e
	}
	for _, ev := range c.h.Events {
		if ev.Type != effectType {
			continue
		}
		c.r.Intents++
		if !applied[ev.EventID] {
			c.r.add(Violation{Kind: IntentWithoutEffect, EventID: ev.EventID, Task: ev.Task,
				Detail: fmt.Sprintf("committed intent (task %s version %d generation %d) has no applied effect", ev.Task, ev.Version, ev.Generation)})
		}
	}
}
