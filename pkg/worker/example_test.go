package worker_test

import (
	"context"
	"errors"
	"log"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/worker"
)

// A worker takes a partition's lease, publishes its task's events, and
// treats an event as done only once its commit receipt says so. When the
// lease is lost (not renewed in time, or taken over) the lease's context
// ends and nothing more is published under it.
func Example() {
	holder := "reports.pod-1" // <principal>.<instance>
	nc, err := nats.Connect(nats.DefaultURL, worker.InboxOption(holder))
	if err != nil {
		log.Fatal(err)
	}
	c, err := worker.New(nc, worker.Config{Holder: holder})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	task := "report-7"
	lease, err := c.Acquire(ctx, c.PartitionOf(task))
	if errors.Is(err, worker.ErrHeld) {
		return // another worker holds the partition; AcquireWait would wait for it
	} else if err != nil {
		log.Fatal(err)
	}

	for _, step := range []struct {
		typ     string
		payload any
	}{
		{"running", map[string]string{"started_by": holder}},
		{"completed", map[string]string{"url": "s3://reports/7.pdf"}},
	} {
		// The lease's context stops the publish once the lease is gone.
		p, err := lease.PublishJSON(lease.Context(), task, step.typ, step.payload)
		if err != nil {
			log.Fatal(err) // ErrLeaseLost once the lease is gone
		}
		// The receipt, not the publish ack, is the durable commit. Wait
		// with your own context: the lease's ends with the lease, and a
		// stale verdict would go unseen.
		if err := p.Wait(ctx); err != nil {
			log.Fatal(err) // a *RejectedError carries the verdict and reason
		}
	}
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
}

// A standby waits for the partition, resumes each task after its head, and
// goes back to waiting when the lease is lost.
func ExampleClient_AcquireWait() {
	holder := "reports.pod-2"
	nc, err := nats.Connect(nats.DefaultURL, worker.InboxOption(holder))
	if err != nil {
		log.Fatal(err)
	}
	c, err := worker.New(nc, worker.Config{Holder: holder})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background() // in a process: signal.NotifyContext
	task := "report-7"
	for ctx.Err() == nil {
		lease, err := c.AcquireWait(ctx, c.PartitionOf(task))
		if err != nil {
			log.Fatal(err)
		}
		head, err := c.TaskHead(ctx, task) // after acquiring: now it cannot move
		if err != nil {
			log.Fatal(err)
		}
		if head.Type != nil && *head.Type == "completed" {
			_ = lease.Release(ctx)
			return
		}
		p, err := lease.PublishJSON(lease.Context(), task, "completed", map[string]int64{"resumed_after": head.Version})
		if err != nil {
			continue // lost already: stand by again
		}
		if err := p.Wait(ctx); err != nil {
			continue
		}
		_ = lease.Release(ctx)
		return
	}
}
