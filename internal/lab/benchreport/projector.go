package benchreport

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/localstack"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// The projector section reads ledger.events as a rebuild does: in seq
// order, in chunks of this many rows (the projector's own chunk).
const (
	rebuildChunk = 20_000
	sqlScanCount = `SELECT count(*) FROM ledger.events`
	sqlScan      = `
SELECT task_id, partition, version, seq, type, payload::text FROM ledger.events
WHERE seq > $1 AND partition = ANY($2::int[]) ORDER BY seq LIMIT $3`
)

// projectorBench measures the projector on the stack: catching up on a
// backlog of LEDGER_LOG, and rebuilding from PostgreSQL, each beside a
// raw read of the same messages or rows.
type projectorBench struct {
	stack *localstack.Stack
	raw   *rawBench
	o     Options
	prog  *progress
	js    jetstream.JetStream
	// durable is the projector's consumer on LEDGER_LOG.
	durable string
}

func newProjectorBench(s *localstack.Stack, raw *rawBench, o Options, prog *progress) (*projectorBench, error) {
	js, err := jetstream.New(s.NC)
	if err != nil {
		return nil, err
	}
	cfg, err := streams.Consumer("projector", streams.Options{})
	if err != nil {
		return nil, err
	}
	return &projectorBench{stack: s, raw: raw, o: o, prog: prog, js: js, durable: cfg.Durable}, nil
}

// run fills the section's four rows.
func (b *projectorBench) run(ctx context.Context, r *Report) error {
	from, to, started, err := b.backlog(ctx, r)
	if err != nil {
		return fmt.Errorf("benchreport: projector catch-up: %w", err)
	}
	n := int(to - from)
	var left atomic.Int64
	left.Store(int64(n))
	b.prog.begin(LabelCatchUp, n, func() int64 { return int64(n) - left.Load() })
	err = b.drained(ctx, &left)
	b.prog.end()
	if err != nil {
		return fmt.Errorf("benchreport: projector catch-up: %w", err)
	}
	// Rates are of events: with log batches a message holds several.
	r.CatchUp = throughputRow(LabelCatchUp, b.o.Events, time.Since(started))
	if r.LogRead, err = b.readLog(ctx, from+1, n, b.o.Events); err != nil {
		return fmt.Errorf("benchreport: %s: %w", LabelLogRead, err)
	}
	if r.Rebuild, err = b.rebuild(ctx); err != nil {
		return fmt.Errorf("benchreport: %s: %w", LabelRebuild, err)
	}
	if r.EventsRead, err = b.readEvents(ctx); err != nil {
		return fmt.Errorf("benchreport: %s: %w", LabelEventsRead, err)
	}
	return nil
}

// backlog stops the projector, publishes Events events through the full
// pipeline while it is down, and starts it again. It returns the LEDGER_LOG
// sequences the restarted projector has to go through, (from, to], and
// when it was started; r.Backlog is the rate the ingest committed them at.
func (b *projectorBench) backlog(ctx context.Context, r *Report) (from, to uint64, started time.Time, err error) {
	err = b.stack.RestartProjector(ctx, func() error {
		c, err := b.consumer(ctx)
		if err != nil {
			return err
		}
		from = c.AckFloor.Stream
		if err := b.raw.hold(ctx); err != nil {
			return err
		}
		defer b.raw.letGo()
		rate, _, err := b.raw.fullRound(ctx, "projector: its backlog through the ingest", b.o.Events)
		if err != nil {
			return err
		}
		r.Backlog = throughputRow(LabelBacklog, b.o.Events, time.Duration(float64(b.o.Events)/rate*float64(time.Second)))
		if err := b.raw.checkCommitted(ctx); err != nil {
			return err
		}
		st, err := b.js.Stream(ctx, wire.StreamLog)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		to, started = info.State.LastSeq, time.Now()
		return nil
	})
	return from, to, started, err
}

func (b *projectorBench) consumer(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	c, err := b.js.Consumer(ctx, wire.StreamLog, b.durable)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", b.durable, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", b.durable, err)
	}
	return info, nil
}

// drained returns once the projector has acked everything in LEDGER_LOG,
// which it does once the message's effect is in the bucket; left, if not
// nil, follows how many messages it still has. It fails after
// ReceiptTimeout without progress.
func (b *projectorBench) drained(ctx context.Context, left *atomic.Int64) error {
	last, since := int64(-1), time.Now()
	for {
		c, err := b.consumer(ctx)
		if err != nil {
			return err
		}
		n := int64(c.NumPending) + int64(c.NumAckPending)
		if left != nil {
			left.Store(n)
		}
		if n == 0 {
			return nil
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > ReceiptTimeout {
			return fmt.Errorf("the projector left %d messages for %v", n, ReceiptTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// readLog reads n LEDGER_LOG messages from sequence first with an ordered
// consumer, fetching as the projector does, and does nothing with them;
// its row counts the events they hold.
func (b *projectorBench) readLog(ctx context.Context, first uint64, n, events int) (Row, error) {
	cons, err := b.js.OrderedConsumer(ctx, wire.StreamLog, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first})
	if err != nil {
		return Row{}, err
	}
	var read atomic.Int64
	b.prog.begin(LabelLogRead, n, read.Load)
	defer b.prog.end()
	start := time.Now()
	it, err := cons.Messages(jetstream.PullMaxBytes(projector.PullMaxBytes))
	if err != nil {
		return Row{}, err
	}
	defer it.Stop()
	for read.Load() < int64(n) {
		if _, err := it.Next(jetstream.NextMaxWait(ReceiptTimeout)); err != nil {
			return Row{}, fmt.Errorf("after %d of %d messages: %w", read.Load(), n, err)
		}
		read.Add(1)
	}
	return throughputRow(LabelLogRead, events, time.Since(start)), nil
}

// rebuild replays ledger.events into fresh projections with the projector
// stopped, as `projector -rebuild` does, and starts it again.
func (b *projectorBench) rebuild(ctx context.Context) (Row, error) {
	var row Row
	err := b.stack.RestartProjector(ctx, func() error {
		var total int64
		if err := b.stack.Pool.QueryRow(ctx, sqlScanCount).Scan(&total); err != nil {
			return fmt.Errorf("count ledger.events: %w", err)
		}
		p, err := projector.New(projector.Config{}, projector.Deps{NC: b.stack.NC, Pool: b.stack.Pool, Logger: b.o.Logger})
		if err != nil {
			return err
		}
		var done atomic.Int64
		b.prog.begin(LabelRebuild, int(total), done.Load)
		defer b.prog.end()
		start := time.Now()
		if err := p.Rebuild(ctx, func(pr projector.Progress) { done.Store(pr.Done) }); err != nil {
			return err
		}
		row = throughputRow(LabelRebuild, int(done.Load()), time.Since(start))
		return nil
	})
	return row, err
}

// readEvents reads every row of ledger.events as a rebuild reads them, in
// the same chunks, into the projector's event values.
func (b *projectorBench) readEvents(ctx context.Context) (Row, error) {
	var total int64
	if err := b.stack.Pool.QueryRow(ctx, sqlScanCount).Scan(&total); err != nil {
		return Row{}, fmt.Errorf("count ledger.events: %w", err)
	}
	parts := make([]int32, partitions)
	for p := range parts {
		parts[p] = int32(p)
	}
	var read atomic.Int64
	b.prog.begin(LabelEventsRead, int(total), read.Load)
	defer b.prog.end()
	start := time.Now()
	var cursor int64
	for {
		rows, err := b.stack.Pool.Query(ctx, sqlScan, cursor, parts, rebuildChunk)
		if err != nil {
			return Row{}, fmt.Errorf("scan after seq %d: %w", cursor, err)
		}
		events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (projection.Event, error) {
			var ev projection.Event
			var payload string
			err := r.Scan(&ev.Task, &ev.Partition, &ev.Version, &ev.Seq, &ev.Type, &payload)
			ev.Payload = json.RawMessage(payload)
			return ev, err
		})
		if err != nil {
			return Row{}, fmt.Errorf("scan after seq %d: %w", cursor, err)
		}
		if len(events) == 0 {
			break
		}
		cursor = events[len(events)-1].Seq
		read.Add(int64(len(events)))
	}
	return throughputRow(LabelEventsRead, int(read.Load()), time.Since(start)), nil
}
