// Command standby is a primary/standby worker of the ledger, to copy: run
// two (or more) with the same principal and different instances, and one
// works while the others stand by.
//
// The primary holds one partition's lease and works through its tasks: each
// task is a run of steps, one event per step ("running", then "completed"
// after the last), and a task resumes after its head, so a new primary
// carries on where the old one stopped. On losing the lease (not renewed in
// time: the process was paused, cut off or overloaded; or taken over) it
// stops at once and stands by again. On SIGTERM or SIGINT it releases the
// lease, so a standby takes over without waiting for the TTL, and exits 0.
//
//	go run ./examples/standby -principal reports -instance a -tasks report-1,report-2
//	go run ./examples/standby -principal reports -instance b -tasks report-1,report-2
//
// It imports only the SDK and nats.go, and prints one line per step of its
// life on stdout; the SDK's warnings go to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/worker"
)

// completed is the type of a task's last event: a new primary skips a task
// whose head has it.
const completed = "completed"

type options struct {
	natsURL, creds, user, password string
	principal, instance            string
	partition                      int
	tasks                          []string
	steps                          int64
	every, ttl                     time.Duration
}

func main() {
	o := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		say(o, "error: %v", err)
		os.Exit(1)
	}
}

func parseFlags() options {
	var o options
	var tasks string
	flag.StringVar(&o.natsURL, "nats-url", env("NATS_URL", nats.DefaultURL), "NATS servers (env NATS_URL)")
	flag.StringVar(&o.creds, "nats-creds", os.Getenv("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	flag.StringVar(&o.user, "nats-user", os.Getenv("NATS_USER"), "NATS user (env NATS_USER; the password from NATS_PASSWORD)")
	flag.StringVar(&o.principal, "principal", env("LEDGER_PRINCIPAL", "reports"), "principal: the NATS user in an authenticated deployment (env LEDGER_PRINCIPAL)")
	flag.StringVar(&o.instance, "instance", env("LEDGER_INSTANCE", defaultInstance()), "this process among the principal's (env LEDGER_INSTANCE; default host-pid)")
	flag.IntVar(&o.partition, "partition", -1, "partition to hold; -1: the partition of the first task")
	flag.StringVar(&tasks, "tasks", env("LEDGER_TASKS", "report-1"), "comma-separated task ids (env LEDGER_TASKS)")
	flag.Int64Var(&o.steps, "steps", 10, "running steps of each task before its completed event")
	flag.DurationVar(&o.every, "every", time.Second, "how long one step works")
	flag.DurationVar(&o.ttl, "ttl", 0, "lease TTL; 0: the SDK's default (3s)")
	flag.Parse()
	o.password = os.Getenv("NATS_PASSWORD")
	o.tasks = strings.Split(tasks, ",")
	return o
}

func run(ctx context.Context, o options) error {
	holder := o.principal + "." + o.instance
	opts := []nats.Option{worker.InboxOption(holder), nats.Name(holder), nats.MaxReconnects(-1)}
	switch {
	case o.creds != "":
		opts = append(opts, nats.UserCredentials(o.creds))
	case o.user != "":
		opts = append(opts, nats.UserInfo(o.user, o.password))
	}
	nc, err := nats.Connect(o.natsURL, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Partitions left 0: the client asks the service, so PartitionOf
	// agrees with the ingest's -partitions.
	c, err := worker.New(nc, worker.Config{Holder: holder, TTL: o.ttl, Logger: logger})
	if err != nil {
		return err
	}
	defer c.Close()
	partition := o.partition
	if partition < 0 {
		partition = c.PartitionOf(o.tasks[0])
	}

	for {
		say(o, "standby: waiting for partition %d", partition)
		lease, err := c.AcquireWait(ctx, partition)
		if ctx.Err() != nil {
			say(o, "stopped while standing by")
			return nil
		}
		if err != nil {
			return err
		}
		say(o, "primary: holds partition %d at generation %d", partition, lease.Generation())
		err = work(ctx, o, c, lease)
		switch {
		case ctx.Err() != nil:
			return release(o, lease)
		case lease.Context().Err() != nil:
			say(o, "lost partition %d (generation %d): %v", partition, lease.Generation(), context.Cause(lease.Context()))
			continue // stand by again
		case err != nil:
			_ = release(o, lease)
			return err
		}
		say(o, "primary: every task is completed; holding the partition until told to stop")
		select {
		case <-ctx.Done():
			return release(o, lease)
		case <-lease.Context().Done():
			say(o, "lost partition %d (generation %d): %v", partition, lease.Generation(), context.Cause(lease.Context()))
		}
	}
}

// release gives the lease back on the way out. Its context is a fresh one:
// the process's is done (that is why we are here), and the lease's ends
// with the lease. Release waits for the receipts of events in flight first.
func release(o options, lease *worker.Lease) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		say(o, "release of partition %d: %v", lease.Partition(), err)
		return err
	}
	say(o, "released partition %d (generation %d); exiting", lease.Partition(), lease.Generation())
	return nil
}

// work runs every task under the lease, each resumed after its head. It
// returns when they are done, the lease is lost or ctx ends.
func work(ctx context.Context, o options, c *worker.Client, lease *worker.Lease) error {
	// The work stops, and nothing more is published, as soon as the lease
	// ends or the process is told to stop, whichever comes first.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(lease.Context(), cancel)()
	for _, task := range o.tasks {
		// The head is read after the lease was acquired: no one else can
		// move it now.
		head, err := c.TaskHead(ctx, task)
		if err != nil {
			return err
		}
		if head.Type != nil && *head.Type == completed {
			say(o, "%s: completed at version %d; nothing to do", task, head.Version)
			continue
		}
		say(o, "%s: resuming after version %d", task, head.Version)
		for step := head.Version + 1; step <= o.steps+1; step++ {
			if err := runStep(ctx, o, lease, task, step); err != nil {
				return err
			}
		}
	}
	return nil
}

func runStep(ctx context.Context, o options, lease *worker.Lease, task string, step int64) error {
	select { // the step's work
	case <-time.After(o.every):
	case <-ctx.Done():
		return ctx.Err()
	}
	typ := "running"
	if step > o.steps {
		typ = completed
	}
	// ctx ends with the lease: nothing is sent once the lease is gone (or
	// the process told to stop), even if the select above chose the timer.
	p, err := lease.PublishJSON(ctx, task, typ,
		map[string]any{"step": step, "of": o.steps, "by": o.principal + "." + o.instance})
	if err != nil {
		return err
	}
	say(o, "%s: published version %d (%s), event %s", task, p.Version(), typ, p.ID())
	// The receipt is waited for with a context of our own, not the lease's:
	// if the lease ends meanwhile, a stale verdict must still be seen.
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rej *worker.RejectedError
	switch err := p.Wait(wctx); {
	case errors.As(err, &rej):
		say(o, "%s: version %d refused: %s/%s", task, p.Version(), rej.Receipt.Verdict, rej.Receipt.Reason)
		return err
	case err != nil:
		return err
	}
	say(o, "%s: version %d committed", task, p.Version())
	return nil
}

func say(o options, format string, args ...any) {
	fmt.Printf("%s %s.%s %s\n", time.Now().Format("15:04:05.000"), o.principal, o.instance, fmt.Sprintf(format, args...))
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// defaultInstance is host-pid, made a valid instance id: 1..64 of
// [A-Za-z0-9_-].
func defaultInstance() string {
	host, _ := os.Hostname()
	id := regexp.MustCompile(`[^A-Za-z0-9_-]+`).ReplaceAllString(fmt.Sprintf("%s-%d", host, os.Getpid()), "-")
	return strings.Trim(id[max(0, len(id)-64):], "-")
}
