// Command effects runs side effects from the ledger's committed log, to
// copy: a worker records each effect's intent as an event, and a runner
// performs the committed intents, at least once, with the event id as the
// idempotency key.
//
// Run the runner (as many processes as you like: one is active, the others
// stand by), then a worker that records intents:
//
//	go run ./examples/effects -runner -instance r1
//	go run ./examples/effects -runner -instance r2
//	go run ./examples/effects -intents 5 -task order-1
//
// With -downstream URL the runner POSTs each intent's payload there, with
// the headers Idempotency-Key (the event id) and Ledger-Fence (the fence it
// was committed under); without it, it prints the effect. An intent of a
// worker whose lease was taken over is refused by the ledger (stale), so it
// never runs. It imports only the SDK and nats.go.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
	"github.com/flowness/ledger/pkg/worker/effect"
)

// intentType is the event type of this example's intents.
const intentType = "mail.send"

type options struct {
	natsURL, principal, instance, task, downstream string
	runner                                         bool
	intents                                        int
}

func main() {
	var o options
	flag.StringVar(&o.natsURL, "nats-url", envOr("NATS_URL", nats.DefaultURL), "NATS servers (env NATS_URL)")
	flag.StringVar(&o.principal, "principal", "mailer", "principal")
	flag.StringVar(&o.instance, "instance", fmt.Sprintf("pid-%d", os.Getpid()), "this process among the principal's")
	flag.BoolVar(&o.runner, "runner", false, "run committed intents instead of recording them")
	flag.IntVar(&o.intents, "intents", 3, "intents to record (worker mode)")
	flag.StringVar(&o.task, "task", "order-1", "task the intents belong to (worker mode)")
	flag.StringVar(&o.downstream, "downstream", "", "URL to POST each effect to (runner mode); empty: print it")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	holder := o.principal + "." + o.instance
	nc, err := nats.Connect(o.natsURL, worker.InboxOption(holder), nats.Name(holder), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	if o.runner {
		return runEffects(ctx, o, nc)
	}
	return recordIntents(ctx, o, nc, holder)
}

// recordIntents publishes o.intents intents under the task's partition
// lease and waits for each verdict.
func recordIntents(ctx context.Context, o options, nc *nats.Conn, holder string) error {
	c, err := worker.New(nc, worker.Config{Holder: holder})
	if err != nil {
		return err
	}
	defer c.Close()
	lease, err := c.AcquireWait(ctx, c.PartitionOf(o.task))
	if err != nil {
		return err
	}
	defer lease.Release(context.WithoutCancel(ctx)) //nolint:errcheck // the lease expires anyway
	for i := range o.intents {
		p, err := lease.PublishJSON(lease.Context(), o.task, intentType,
			map[string]any{"to": fmt.Sprintf("user-%d@example.com", i), "subject": "your order"})
		if err != nil {
			return err
		}
		if err := p.Wait(ctx); err != nil {
			return fmt.Errorf("intent %s: %w", p.ID(), err)
		}
		fmt.Printf("recorded intent %s (version %d) under fence %s\n", p.ID(), p.Version(), lease.Fence())
	}
	return nil
}

// runEffects runs the committed intents until ctx ends.
func runEffects(ctx context.Context, o options, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	r, err := effect.New(js, effect.Config{Name: "mailer", Types: []string{intentType}},
		func(ctx context.Context, e effect.Effect) error { return perform(ctx, o.downstream, e) })
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer r.Stop()
	fmt.Printf("runner %s: consuming %s (one active runner per consumer)\n", o.instance, r.Consumer())
	<-ctx.Done()
	return nil
}

// perform is the handler: it passes the event id downstream as the
// idempotency key, so a repeated delivery is absorbed there.
func perform(ctx context.Context, downstream string, e effect.Effect) error {
	if downstream == "" {
		fmt.Printf("effect %s of %s: %s (delivery %d, decided by %s)\n", e.ID, e.Task, e.Payload, e.Delivery, e.Fence)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, downstream, bytes.NewReader(e.Payload))
	if err != nil {
		return fmt.Errorf("build request for %s: %w", e.ID, err)
	}
	req.Header.Set("Idempotency-Key", e.ID)
	req.Header.Set(wire.HeaderFence, e.Fence.String())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("post effect %s: %w", e.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return errors.New("downstream answered " + resp.Status)
	}
	fmt.Printf("effect %s of %s: done downstream (%s)\n", e.ID, e.Task, resp.Status)
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
