package benchreport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// barePublisher is the bare pipeline of a paced external run, as a process
// of its own beside the deployment: it publishes its events into the bare
// stream and consumes them with the set-based fenced insert into
// ledger_bench, and times each from its publish to its commit. The
// coordinator made the stream, its consumer and ledger_bench, whose leases
// baselineHolder holds at generation 1.
type barePublisher struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	pool *pgxpool.Pool
	sink bareSink
	src  *rawSource
}

func newBarePublisher(ctx context.Context, nc *nats.Conn, o WorkerOptions, share *load) (_ *barePublisher, err error) {
	p := &barePublisher{nc: nc}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(RawInFlight)); err != nil {
		return nil, err
	}
	cons, err := p.js.Consumer(ctx, bareStream, bareDurable)
	if err != nil {
		return nil, fmt.Errorf("the bare pipeline's consumer: %w", err)
	}
	if p.pool, err = pgxpool.New(ctx, o.DatabaseURL); err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	subj := wire.Subjects{Prefix: barePrefix}
	p.sink = bareSink{cons: cons, subj: subj, pool: p.pool}
	var gens [partitions]int64
	for part := range gens {
		gens[part] = 1
	}
	p.src = newRawSource(subj, share, baselineHolder, gens)
	return p, nil
}

// publish publishes the share's events at rate into the bare stream while
// its consumers commit them, and times each event from its publish to the
// commit of its batch.
func (p *barePublisher) publish(ctx context.Context, counts []int, rate float64) (runTimes, error) {
	if rate <= 0 {
		return runTimes{}, fmt.Errorf("the bare pipeline runs paced only")
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	var times noteTimes
	lat := &histogram{}
	var mu sync.Mutex
	sent := make(map[string]int64, total) // event id → when it was published (Unix ns)
	committed := func(ids []string) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if t0, ok := sent[id]; ok {
				lat.add(time.Duration(now.UnixNano() - t0))
				delete(sent, id)
				times.received(now)
			}
		}
	}
	var done atomic.Int64
	err := p.sink.run(ctx, total, &done, committed, func(ctx context.Context) error {
		times.published(time.Now())
		_, err := pace(ctx, rate, total, func(int) error {
			m := p.src.next(1)[0]
			mu.Lock()
			sent[wire.EventIDOf(m.Header.Get(wire.HeaderMsgID))] = time.Now().UnixNano()
			mu.Unlock()
			_, err := p.js.PublishMsgAsync(m, jetstream.WithStallWait(ReceiptTimeout))
			return err
		})
		return err
	})
	if err != nil {
		return runTimes{}, err
	}
	rt := times.times()
	rt.lat = lat
	return rt, nil
}

func (p *barePublisher) close() {
	if p.pool != nil {
		p.pool.Close()
	}
	p.nc.Close()
}
