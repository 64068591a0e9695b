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
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	c, err := worker.New(nc, worker.Config{Holder: "report-worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	task := "report-7"
	lease, err := c.Acquire(ctx, c.PartitionOf(task))
	if errors.Is(err, worker.ErrHeld) {
		return // another worker holds the partition
	} else if err != nil {
		log.Fatal(err)
	}

	for _, step := range []struct{ typ, payload string }{
		{"running", `{"started_by":"report-worker-1"}`},
		{"completed", `{"url":"s3://reports/7.pdf"}`},
	} {
		p, err := lease.Publish(lease.Context(), task, step.typ, []byte(step.payload))
		if err != nil {
			log.Fatal(err) // ErrLeaseLost once the lease is gone
		}
		// The receipt, not the publish ack, is the durable commit.
		if err := p.Wait(lease.Context()); err != nil {
			log.Fatal(err) // a *RejectedError carries the verdict and reason
		}
	}
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
}
