// Package demo runs the ledger end to end in one process and plays the two
// stories the ledger was born from: a task's "completed" arriving before its
// "running", and a paused worker whose late write must not overwrite the
// work of the worker that replaced it. Every line of the timeline it prints
// is read back from the ledger (receipts, the task head, the DLQ, the KV
// bucket), not from what the script expects.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/internal/localstack"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// Options configure a demo run.
type Options struct {
	// DatabaseURL is the PostgreSQL to use; when empty or unreachable a
	// throwaway cluster is started from the local installation.
	DatabaseURL string
	// Out receives the timeline; default os.Stdout.
	Out io.Writer
	// Logger receives the services' logs; default discards them.
	Logger *slog.Logger
	// External plays the stories against a ledger that is already running
	// (DatabaseURL and NATS required) instead of starting one.
	External bool
	// NATS connects to the running ledger's NATS servers, for External.
	NATS func(opts ...nats.Option) (*nats.Conn, error)
}

// Summary counts the verdicts the demo's events received.
type Summary struct {
	Committed, Duplicates int
	// Rejected counts the other verdicts by "verdict/reason".
	Rejected map[string]int
}

// run holds one demo's state.
type run struct {
	out   io.Writer
	start time.Time
	s     *localstack.Stack
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	id    string // suffix that keeps this run's tasks and holders apart
	log   *slog.Logger

	mu       sync.Mutex
	receipts map[string]wire.Receipt
	arrived  chan struct{}
}

// Run plays the demo and prints its timeline and summary.
func Run(ctx context.Context, o Options) (Summary, error) {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &run{out: o.Out, start: time.Now(), receipts: map[string]wire.Receipt{}, arrived: make(chan struct{}, 1), log: o.Logger}
	r.id = strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String()[20:])
	fmt.Fprintf(r.out, "ledger demo (run %s)\n\n", r.id)

	s, err := localstack.Start(ctx, localstack.Options{DatabaseURL: o.DatabaseURL, Logger: o.Logger,
		External: o.External, NATS: o.NATS,
		Say: func(format string, args ...any) { r.say("setup", format, args...) }})
	if err != nil {
		return Summary{}, err
	}
	defer s.Close()
	r.s = s
	if r.js, err = jetstream.New(s.NC); err != nil {
		return Summary{}, err
	}
	if r.kv, err = r.js.KeyValue(ctx, wire.BucketTasks); err != nil {
		return Summary{}, err
	}
	sub, err := s.NC.Subscribe(wire.Subjects{}.Receipt("*.*"), r.onReceipt)
	if err != nil {
		return Summary{}, err
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := s.NC.Flush(); err != nil {
		return Summary{}, err
	}

	if err := r.outOfOrder(ctx); err != nil {
		return Summary{}, fmt.Errorf("story 1: %w", err)
	}
	if err := r.zombie(ctx); err != nil {
		return Summary{}, fmt.Errorf("story 2: %w", err)
	}
	if err := r.snapshots(ctx); err != nil {
		return Summary{}, fmt.Errorf("story 3: %w", err)
	}
	return r.summary(), nil
}

func (r *run) say(who, format string, args ...any) {
	fmt.Fprintf(r.out, "%7.3fs  %-10s %s\n", time.Since(r.start).Seconds(), who, fmt.Sprintf(format, args...))
}

func (r *run) onReceipt(m *nats.Msg) {
	rs, _ := wire.ReceiptsOf(m.Header, m.Data) // the SDK's batches get batched receipts
	r.mu.Lock()
	for _, rc := range rs {
		r.receipts[rc.EventID] = rc
	}
	r.mu.Unlock()
	select {
	case r.arrived <- struct{}{}:
	default:
	}
}

// receipt waits for an event's verdict.
func (r *run) receipt(ctx context.Context, id string) (wire.Receipt, error) {
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	for {
		r.mu.Lock()
		rc, ok := r.receipts[id]
		r.mu.Unlock()
		if ok {
			return rc, nil
		}
		select {
		case <-ctx.Done():
			return rc, fmt.Errorf("no receipt for event %s", id)
		case <-r.arrived:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// hasReceipt reports whether an event has its verdict yet.
func (r *run) hasReceipt(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.receipts[id]
	return ok
}

func (r *run) sayReceipt(who string, rc wire.Receipt) {
	switch rc.Verdict {
	case wire.VerdictCommitted:
		r.say(who, "receipt: version %d %s (seq %d)", rc.Version, rc.Verdict, rc.Seq)
	case wire.VerdictDuplicate:
		r.say(who, "receipt: version %d %s/%s, nothing written (original seq %d)", rc.Version, rc.Verdict, rc.Reason, rc.Seq)
	case wire.VerdictStale:
		r.say(who, "receipt: version %d %s/%s (generation %d; the partition is at generation %d)",
			rc.Version, rc.Verdict, rc.Reason, rc.Generation, rc.CurrentGeneration)
	default:
		r.say(who, "receipt: version %d %s/%s, nothing written", rc.Version, rc.Verdict, rc.Reason)
	}
}

// projection reads a task's value; ok is false while it has none.
func (r *run) projection(ctx context.Context, task string) (projection.State, uint64, bool) {
	entry, err := r.kv.Get(ctx, task)
	if err != nil {
		return projection.State{}, 0, false
	}
	var st projection.State
	if json.Unmarshal(entry.Value(), &st) != nil {
		return projection.State{}, 0, false
	}
	return st, entry.Revision(), true
}

// awaitProjection waits until a task's projection reaches version.
func (r *run) awaitProjection(ctx context.Context, task string, version int64) (projection.State, uint64, error) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if st, rev, ok := r.projection(ctx, task); ok && st.Version >= version {
			return st, rev, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return projection.State{}, 0, fmt.Errorf("projection of %s never reached version %d", task, version)
}

func (r *run) sayProjection(st projection.State, rev uint64) {
	gap := "none"
	if st.Gap != nil {
		gap = fmt.Sprintf("waiting for version %d", st.Gap.NextVersion)
	}
	r.say("projection", "%s: version %d, status %q, data %s, gap %s (revision %d)", st.Task, st.Version, st.Status, st.Data, gap, rev)
}

// publishRaw publishes an event as any NATS client can (docs/contract.md §2).
func (r *run) publishRaw(ctx context.Context, partition int, task, holder string, gen, version int64, typ, payload string) (string, error) {
	id := ulid.MustNew(ulid.Now(), rand.Reader).String()
	m := wire.Subjects{}.InboundMsg(wire.Inbound{ID: id, Partition: partition, Task: task, Holder: holder,
		Generation: gen, Version: version, Type: typ, Payload: []byte(payload)})
	_, err := r.js.PublishMsg(ctx, m)
	return id, err
}

// publishSnapshotRaw publishes a snapshot task's event by hand: the same,
// with the header Ledger-Kind: snapshot (docs/contract.md §14).
func (r *run) publishSnapshotRaw(ctx context.Context, partition int, task, holder string, gen, version int64, payload string) (string, error) {
	id := ulid.MustNew(ulid.Now(), rand.Reader).String()
	m := wire.Subjects{}.InboundMsg(wire.Inbound{ID: id, Partition: partition, Task: task, Holder: holder,
		Generation: gen, Version: version, Type: "reading", Payload: []byte(payload), Kind: wire.KindSnapshot})
	_, err := r.js.PublishMsg(ctx, m)
	return id, err
}

// lease connects an SDK client as holder and acquires partition; the
// caller closes the client.
func (r *run) lease(ctx context.Context, holder string, partition int) (*worker.Client, *worker.Lease, error) {
	nc, err := r.s.Dial(worker.InboxOption(holder))
	if err != nil {
		return nil, nil, err
	}
	c, err := worker.New(nc, worker.Config{Holder: holder, Logger: r.log})
	if err != nil {
		return nil, nil, err
	}
	l, err := c.Acquire(ctx, partition)
	if err != nil {
		c.Close() //nolint:errcheck
		return nil, nil, err
	}
	return c, l, nil
}

// snapshots plays the third story: a gauge whose every event is its whole
// state, a snapshot task. A reading lost on the way does not hold the next
// one back, and a late one never overwrites a newer one.
func (r *run) snapshots(ctx context.Context) error {
	fmt.Fprintf(r.out, "\nStory 3: a gauge reports its whole state; a lost reading does not hold the next one back\n")
	task, holder := "gauge-3-"+r.id, wire.Holder("sensors-"+r.id, "pod-1")
	partition := wire.PartitionOf(task, wire.PartitionsDefault)
	c, l, err := r.lease(ctx, holder, partition)
	if err != nil {
		return err
	}
	defer c.Close() //nolint:errcheck
	p, err := l.PublishSnapshot(l.Context(), task, "reading", []byte(`{"temp_c":20.5}`))
	if err != nil {
		return err
	}
	if err := p.Wait(ctx); err != nil {
		return err
	}
	r.say(holder, "publishes snapshot version 1 with the SDK's PublishSnapshot: the task is a snapshot task")
	rc, err := r.receipt(ctx, p.ID())
	if err != nil {
		return err
	}
	r.sayReceipt("ledger", rc)
	v3, err := r.publishSnapshotRaw(ctx, partition, task, holder, l.Generation(), 3, `{"temp_c":23.1}`)
	if err != nil {
		return err
	}
	r.say(holder, "publishes version 3; version 2 was lost on the way")
	if rc, err = r.receipt(ctx, v3); err != nil {
		return err
	}
	r.sayReceipt("ledger", rc)
	v2, err := r.publishSnapshotRaw(ctx, partition, task, holder, l.Generation(), 2, `{"temp_c":21.7}`)
	if err != nil {
		return err
	}
	r.say(holder, "version 2 turns up late")
	if rc, err = r.receipt(ctx, v2); err != nil {
		return err
	}
	r.sayReceipt("ledger", rc)
	st, rev, err := r.awaitProjection(ctx, task, 3)
	if err != nil {
		return err
	}
	r.say("projection", "%s: kind %q, version %d, data %s: the newest snapshot, gap none (revision %d)", task, st.Kind, st.Version, st.Data, rev)
	return l.Release(ctx)
}

// head asks the lease service for a task's head.
func (r *run) head(task string) (wire.TaskHeadReply, error) {
	b, _ := json.Marshal(wire.TaskHeadRequest{Task: task})
	resp, err := r.s.NC.Request(wire.Subjects{}.TaskHead(), b, 5*time.Second)
	if err != nil {
		return wire.TaskHeadReply{}, err
	}
	var h wire.TaskHeadReply
	return h, json.Unmarshal(resp.Data, &h)
}

// outOfOrder plays the first story: "completed" (version 2) is published
// before "running" (version 1).
func (r *run) outOfOrder(ctx context.Context) error {
	fmt.Fprintf(r.out, "\nStory 1: a task's \"completed\" arrives before its \"running\"\n")
	task, holder := "report-7-"+r.id, wire.Holder("reports-"+r.id, "pod-1")
	partition := wire.PartitionOf(task, wire.PartitionsDefault)
	c, l, err := r.lease(ctx, holder, partition)
	if err != nil {
		return err
	}
	defer c.Close() //nolint:errcheck
	r.say(holder, "holds partition %d at generation %d", partition, l.Generation())

	v2, err := r.publishRaw(ctx, partition, task, holder, l.Generation(), 2, "completed", `{"pages":12,"url":"s3://reports/7.pdf"}`)
	if err != nil {
		return err
	}
	r.say(holder, "publishes version 2 (completed) first")
	time.Sleep(400 * time.Millisecond)
	h, err := r.head(task)
	if err != nil {
		return err
	}
	verdict := "no verdict yet"
	if r.hasReceipt(v2) {
		rc, _ := r.receipt(ctx, v2)
		verdict = "verdict " + string(rc.Verdict)
	}
	proj := "no projection yet"
	if st, _, ok := r.projection(ctx, task); ok {
		proj = fmt.Sprintf("projection at version %d", st.Version)
	}
	r.say("ledger", "holds version 2 until version 1 arrives: %s, task head is version %d, %s", verdict, h.Version, proj)

	v1, err := r.publishRaw(ctx, partition, task, holder, l.Generation(), 1, "running", `{"started_by":"`+holder+`"}`)
	if err != nil {
		return err
	}
	r.say(holder, "publishes version 1 (running)")
	for _, id := range []string{v1, v2} {
		rc, err := r.receipt(ctx, id)
		if err != nil {
			return err
		}
		r.sayReceipt("ledger", rc)
	}
	st, rev, err := r.awaitProjection(ctx, task, 2)
	if err != nil {
		return err
	}
	r.sayProjection(st, rev)

	again, err := r.publishRaw(ctx, partition, task, holder, l.Generation(), 2, "completed", `{"pages":12,"url":"s3://reports/7.pdf"}`)
	if err != nil {
		return err
	}
	r.say(holder, "publishes version 2 again (a retry, new event id)")
	rc, err := r.receipt(ctx, again)
	if err != nil {
		return err
	}
	r.sayReceipt("ledger", rc)
	time.Sleep(300 * time.Millisecond)
	st2, rev2, _ := r.projection(ctx, task)
	same := "unchanged"
	if rev2 != rev {
		same = fmt.Sprintf("changed from revision %d", rev)
	}
	r.say("projection", "%s: still version %d, status %q, revision %d %s", task, st2.Version, st2.Status, rev2, same)
	return l.Release(ctx)
}

// zombie plays the second story: worker A pauses past its lease, B takes
// over, and A's late write with its old generation is refused.
func (r *run) zombie(ctx context.Context) error {
	fmt.Fprintf(r.out, "\nStory 2: a paused worker wakes up after its partition was taken over\n")
	task := "invoice-42-" + r.id
	partition := wire.PartitionOf(task, wire.PartitionsDefault)
	// Two replicas of one service: one credential (principal), two
	// instances, each the other's standby.
	nameA, nameB := wire.Holder("invoices-"+r.id, "worker-a"), wire.Holder("invoices-"+r.id, "worker-b")
	nc, err := r.s.Dial(worker.InboxOption(nameA))
	if err != nil {
		return err
	}
	a, err := worker.New(nc, worker.Config{Holder: nameA, TTL: time.Second, Logger: r.log})
	if err != nil {
		return err
	}
	la, err := a.Acquire(ctx, partition)
	if err != nil {
		return err
	}
	r.say("worker A", "holds partition %d at generation %d (TTL 1 s)", partition, la.Generation())
	p, err := la.Publish(ctx, task, "running", []byte(`{"step":"rendering"}`))
	if err != nil {
		return err
	}
	rc, err := p.Receipt(ctx)
	if err != nil {
		return err
	}
	r.sayReceipt("worker A", rc)
	oldGen := la.Generation()
	if err := a.Close(); err != nil { // stops the keep-alive, as a frozen process would
		return err
	}
	r.say("worker A", "pauses (a long GC, a frozen VM): its lease is no longer renewed")

	b, err := worker.New(nc, worker.Config{Holder: nameB, Logger: r.log})
	if err != nil {
		return err
	}
	defer b.Close() //nolint:errcheck
	var lb *worker.Lease
	for {
		lb, err = b.Acquire(ctx, partition)
		if err == nil {
			break
		}
		if !errors.Is(err, worker.ErrHeld) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.say("worker B", "takes partition %d over once A's lease expired: generation %d", partition, lb.Generation())
	pb, err := lb.Publish(ctx, task, "completed", []byte(`{"result":"B's invoice","total":120}`))
	if err != nil {
		return err
	}
	rc, err = pb.Receipt(ctx)
	if err != nil {
		return err
	}
	r.sayReceipt("worker B", rc)

	late, err := r.publishRaw(ctx, partition, task, nameA, oldGen, 2, "completed", `{"result":"A's stale invoice","total":99}`)
	if err != nil {
		return err
	}
	r.say("worker A", "wakes up and writes its result with its old generation %d", oldGen)
	rc, err = r.receipt(ctx, late)
	if err != nil {
		return err
	}
	r.sayReceipt("ledger", rc)
	if err := r.sayDeadLetter(ctx, late); err != nil {
		return err
	}
	st, rev, err := r.awaitProjection(ctx, task, 2)
	if err != nil {
		return err
	}
	r.sayProjection(st, rev)
	if r.s.CanRestartProjector() {
		if err := r.catchUp(ctx, lb, task); err != nil {
			return err
		}
		r.say("projector", "started again: it resumes from its durable consumer")
		if st, rev, err = r.awaitProjection(ctx, task, 4); err != nil {
			return err
		}
		r.sayProjection(st, rev)
	}
	return lb.Release(ctx)
}

// catchUp stops the projector while B keeps writing, then starts a new one:
// the projection falls behind the ledger and catches up.
func (r *run) catchUp(ctx context.Context, lb *worker.Lease, task string) error {
	fmt.Fprintf(r.out, "\nThe projector goes down while worker B keeps writing\n")
	return r.s.RestartProjector(ctx, func() error {
		r.say("projector", "stopped")
		var last *worker.Pending
		for i, typ := range []string{"paid", "archived"} {
			p, err := lb.Publish(ctx, task, typ, []byte(fmt.Sprintf(`{"step":%q,"n":%d}`, typ, i+1)))
			if err != nil {
				return err
			}
			rc, err := p.Receipt(ctx)
			if err != nil {
				return err
			}
			r.sayReceipt("worker B", rc)
			last = p
		}
		time.Sleep(300 * time.Millisecond)
		st, _, _ := r.projection(ctx, task)
		r.say("projection", "%s is behind: version %d while the ledger is at version %d", task, st.Version, last.Version())
		return nil
	})
}

// sayDeadLetter finds an event's dead letter in LEDGER_DLQ.
func (r *run) sayDeadLetter(ctx context.Context, id string) error {
	s, err := r.js.Stream(ctx, wire.StreamDLQ)
	if err != nil {
		return err
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, err := c.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			continue
		}
		h := m.Headers()
		if wire.EventIDOf(h.Get(wire.HeaderMsgID)) == id {
			r.say("dlq", "%s: %s=%s %s=%s %s=%s", m.Subject(), wire.HeaderVerdict, h.Get(wire.HeaderVerdict),
				wire.HeaderReason, h.Get(wire.HeaderReason), wire.HeaderCurrentHolder, h.Get(wire.HeaderCurrentHolder))
			return nil
		}
	}
	return fmt.Errorf("no dead letter for %s", id)
}

func (r *run) summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Summary{Rejected: map[string]int{}}
	for _, rc := range r.receipts {
		if !strings.HasSuffix(rc.Task, r.id) {
			continue
		}
		switch rc.Verdict {
		case wire.VerdictCommitted:
			s.Committed++
		case wire.VerdictDuplicate:
			s.Duplicates++
		default:
			s.Rejected[string(rc.Verdict)+"/"+rc.Reason]++
		}
	}
	fmt.Fprintf(r.out, "\nSummary (from the receipts)\n  committed   %d\n  duplicates  %d\n", s.Committed, s.Duplicates)
	keys := make([]string, 0, len(s.Rejected))
	for k := range s.Rejected {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(r.out, "  rejected    %d  %s\n", s.Rejected[k], k)
	}
	return s
}
