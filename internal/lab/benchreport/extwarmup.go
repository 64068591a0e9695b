package benchreport

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// warmUp sends Warmup events through the ledger at full speed from raw
// worker processes, over tasks of their own, and waits until they have
// their receipts and, with a projector, until it has folded every
// LEDGER_LOG copy: what is measured next starts on a running ledger. It
// returns how many events went through.
func (e *external) warmUp(ctx context.Context) (int, error) {
	if e.o.Warmup <= 0 {
		return 0, nil
	}
	sp := workerSpec{id: runID(), workers: e.o.Workers, events: e.o.Warmup, tasks: taskCount(e.o.Warmup), raw: true}
	e.prog.say("warm-up: %s events over other tasks", group(int64(sp.events)))
	if _, err := e.runWorkers(ctx, sp); err != nil {
		return 0, fmt.Errorf("benchreport: warm-up: %w", err)
	}
	if e.o.Latency { // no projector
		return sp.events, nil
	}
	return sp.events, e.projectorIdle(ctx)
}

// projectorIdle waits until the projector's consumer has nothing pending:
// every LEDGER_LOG copy folded and acked.
func (e *external) projectorIdle(ctx context.Context) error {
	js, err := jetstream.New(e.d.NATS())
	if err != nil {
		return err
	}
	cfg, err := streams.Consumer("projector", streams.Options{})
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, wire.StreamLog, cfg.Durable)
	if err != nil {
		return fmt.Errorf("benchreport: the projector's consumer: %w", err)
	}
	deadline := time.Now().Add(ReceiptTimeout)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("benchreport: the projector's consumer: %w", err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("benchreport: warm-up: the projector still had %d copies to fold after %v",
				info.NumPending+uint64(info.NumAckPending), ReceiptTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(projectorPoll):
		}
	}
}

// runWorkers starts the spec's worker processes, tells them to go once all
// hold their leases, and returns their done lines, having checked that
// they published the spec's events in all.
func (e *external) runWorkers(ctx context.Context, sp workerSpec) ([]workerLine, error) {
	ws, err := e.startWorkers(ctx, sp)
	defer ws.stop()
	if err != nil {
		return nil, err
	}
	for _, w := range ws {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			return nil, fmt.Errorf("start worker %d: %w", w.n, err)
		}
	}
	lines := make([]workerLine, 0, len(ws))
	got := 0
	for _, w := range ws {
		res := w.result()
		if res.err != nil {
			return nil, res.err
		}
		lines = append(lines, res.line)
		got += res.line.Events
	}
	if got != sp.events {
		return nil, fmt.Errorf("the workers published %d events, %d were asked for", got, sp.events)
	}
	return lines, nil
}
