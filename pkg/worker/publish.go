package worker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/pkg/wire"
)

// taskState is what a lease knows of one task. mu serialises the task's
// version assignment and publishing, so a task's events leave in version
// order; the counters are guarded by the lease's mu.
//
// Until the task's head is known, its events queue here, in call order,
// and one lookup (asked together with other tasks', headBatcher) is under
// way; when the head comes they get their versions and leave. So a worker
// that starts on many fresh tasks does not wait a round trip per task.
type taskState struct {
	mu      sync.Mutex
	known   bool      // next was learned from the ledger
	next    int64     // the version the next event gets
	looking bool      // a head lookup for queue is under way
	pinned  error     // the task is pinned to another partition (for good)
	queue   []*queued // events waiting for the head, in call order
	// resync is set while ResyncTask runs, and closed when it ends:
	// publishes to the task wait for it.
	resync chan struct{}

	inflight int           // events queued or without receipt (lease mu)
	refused  *wire.Receipt // first refusal since the last resync (lease mu)
}

// queued is an event waiting for its task's head.
type queued struct {
	p       *Pending
	typ     string
	payload []byte
	ctx     context.Context
}

func (l *Lease) task(task string) *taskState {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := l.tasks[task]
	if ts == nil {
		ts = &taskState{}
		l.tasks[task] = ts
	}
	return ts
}

// Publish sends one event of task to the ledger under the lease and
// returns at once with its Pending; the verdict comes later as its receipt.
//
// On the lease's first event of a task, Publish does not wait for the
// task's head: the event is queued and Publish returns; the head is asked
// for (together with other new tasks') and the task's queued events then
// get versions head+1, head+2, ... in call order and leave. If the task
// turns out to be pinned to another partition, or the lookup fails, the
// queued events are not sent and their Pending ends with that error
// (ErrWrongPartition, ...); so does one whose ctx ended before its version
// was assigned. Pending.Version waits for the assignment. typ must be 1..64 of
// [A-Za-z0-9_.:-]; payload a JSON value (empty means null) of at most
// Config.MaxPayload bytes.
//
// Publish blocks while Config.MaxInFlight events of the lease wait for
// their receipts, until a slot frees or ctx ends. A ctx that is done (when
// Publish is called, or before the event's version is assigned) sends
// nothing: the error wraps ctx.Err() and says the event was not sent. It
// fails with an error matching ErrLeaseLost once the lease is lost (checked
// against the local deadline, not only the keep-alive), ErrReleased while
// it is released, and ErrResyncNeeded after an earlier event of the task
// was refused.
//
// The event goes to <prefix>.in.<principal>.<instance>.<partition>.<task>
// with the contract's headers, built by wire.Subjects.InboundMsg:
// Nats-Msg-Id (a new ULID and the content token), Ledger-Generation,
// Ledger-Version and Ledger-Type. A publish whose JetStream ack fails or times out is sent
// again with the same id while the lease lasts; JetStream deduplicates it
// within its window, and the ledger by event id after it.
//
// ctx bounds sending only; wait for the verdict with Pending.Wait and a
// context of your own. The lease's context is a fine ctx here (nothing is
// sent once the lease is gone), but not for the wait: it ends with the
// lease, and a stale verdict of an event already sent would go unseen.
func (l *Lease) Publish(ctx context.Context, task, typ string, payload []byte) (*Pending, error) {
	return l.publishKind(ctx, task, typ, payload, false)
}

// PublishSnapshot is Publish for a snapshot task (docs/contract.md §14):
// payload is the task's complete state, and the event carries the header
// Ledger-Kind: snapshot. Its version is assigned as Publish assigns it,
// above every version this lease published of the task, but the ledger
// commits it without waiting for versions it skips, and the projection is
// the newest snapshot committed. The task's first committed event chooses
// its kind for ever: a snapshot of a task applied event by event, or an
// event Publish sends to a snapshot task, is refused as invalid/wrong_kind.
func (l *Lease) PublishSnapshot(ctx context.Context, task, typ string, payload []byte) (*Pending, error) {
	return l.publishKind(ctx, task, typ, payload, true)
}

// publishKind is Publish, of a snapshot task's event when snapshot is set.
func (l *Lease) publishKind(ctx context.Context, task, typ string, payload []byte, snapshot bool) (*Pending, error) {
	switch {
	case !wire.ValidID(task):
		return nil, fmt.Errorf("worker: publish: task id %q is not 1..128 of [A-Za-z0-9_-]: %w", task, ErrInvalid)
	case !wire.ValidType(typ):
		return nil, fmt.Errorf("worker: publish: event type %q is not 1..64 of [A-Za-z0-9_.:-]: %w", typ, ErrInvalid)
	case len(payload) > l.c.cfg.MaxPayload:
		return nil, fmt.Errorf("worker: publish: payload of %d bytes is above %d: %w", len(payload), l.c.cfg.MaxPayload, ErrInvalid)
	case len(payload) > 0 && !wire.ValidJSON(payload):
		return nil, fmt.Errorf("worker: publish: payload is not JSON: %w", ErrInvalid)
	}
	// The lease, then ctx, are checked before the select: a select on a
	// free slot and a done ctx picks either at random, and a worker told to
	// stop must not send. The lease comes first so that a lost lease says
	// so, also to a caller that passed the lease's own context.
	if err := l.usable(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, notSent(task, err)
	}
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		if l.ctx.Err() != nil {
			return nil, context.Cause(l.ctx)
		}
		return nil, notSent(task, fmt.Errorf("waiting for one of %d in-flight slots: %w", l.c.cfg.MaxInFlight, ctx.Err()))
	case <-l.ctx.Done():
		return nil, context.Cause(l.ctx)
	}
	p, err := l.publish(ctx, task, typ, payload, snapshot)
	if err != nil {
		<-l.slots
		return nil, err
	}
	return p, nil
}

// newPending is an event of task about to be published.
func (l *Lease) newPending(task string) *Pending {
	return &Pending{lease: l, id: newULID(), task: task}
}

// PublishJSON is Publish with v encoded by encoding/json as the payload.
// A value that cannot be encoded (a channel, a func, a NaN, a cycle) fails
// with an error matching ErrInvalid, and nothing is sent.
func (l *Lease) PublishJSON(ctx context.Context, task, typ string, v any) (*Pending, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("worker: publish to task %s not sent: payload cannot be encoded as JSON: %w: %w", task, ErrInvalid, err)
	}
	return l.Publish(ctx, task, typ, payload)
}

// notSent is Publish's error when ctx ended before the event was sent.
func notSent(task string, err error) error {
	return fmt.Errorf("worker: publish to task %s not sent: %w", task, err)
}

func (l *Lease) publish(ctx context.Context, task, typ string, payload []byte, snapshot bool) (*Pending, error) {
	ts := l.task(task)
	ts.mu.Lock()
	for ts.resync != nil {
		ch := ts.resync
		ts.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, notSent(task, ctx.Err())
		}
		ts.mu.Lock()
	}
	defer ts.mu.Unlock()
	if ts.pinned != nil {
		return nil, ts.pinned
	}
	p := l.newPending(task)
	p.snapshot = snapshot
	if ts.known {
		if err := l.send(ctx, ts, p, typ, payload, false); err != nil {
			return nil, err
		}
		return p, nil
	}
	// The head is not known yet: queue the event, counted in flight (so
	// Release waits for it), and make sure a lookup is under way.
	l.mu.Lock()
	if err := l.admitLocked(ts, task, false); err != nil {
		l.mu.Unlock()
		return nil, err
	}
	l.countLocked(ts)
	l.mu.Unlock()
	ts.queue = append(ts.queue, &queued{p: p, typ: typ, payload: payload, ctx: ctx})
	if !ts.looking {
		ts.looking = true
		go l.fillHead(task, ts)
	}
	return p, nil
}

// admitLocked says whether an event of task may be published now; l.mu is
// held. A queued event was accepted by Publish before a Release began, so
// Release waits for it rather than refusing it.
func (l *Lease) admitLocked(ts *taskState, task string, queued bool) error {
	if err := l.usableLocked(); err != nil && !(queued && l.state == stateReleasing && !l.pastDeadline()) {
		return err
	}
	if r := ts.refused; r != nil {
		return fmt.Errorf("worker: publish to task %s: event %s (version %d) was refused %s/%s: %w",
			task, r.EventID, r.Version, r.Verdict, r.Reason, ErrResyncNeeded)
	}
	return nil
}

// send gives p the task's next version and publishes it; ts.mu is held.
// counted says p is already counted in flight (it was queued); an error
// leaves the counts as they were before send (a queued event stays
// counted, for drop to undo).
func (l *Lease) send(ctx context.Context, ts *taskState, p *Pending, typ string, payload []byte, counted bool) error {
	// Checking the lease, assigning the version and counting the event in
	// flight happen under one lock, so Release either refuses this event
	// or waits for its receipt.
	l.mu.Lock()
	if err := l.admitLocked(ts, p.task, counted); err != nil {
		l.mu.Unlock()
		return err
	}
	// The head lookup may have outlasted ctx: the last moment a
	// cancellation can still keep the event from leaving.
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return notSent(p.task, err)
	}
	p.version = ts.next
	ts.next++
	if !counted {
		l.countLocked(ts)
	}
	l.mu.Unlock()
	p.markAssigned()

	in := l.inbound(p, typ, payload)
	p.in = in
	err := ErrClosed
	if l.c.register(p) {
		if l.c.batching() {
			l.add(p, in) // a failed batch is sent again event by event
			err = nil
		} else {
			_, err = l.c.js.PublishMsgAsync(p.message())
		}
	}
	if err != nil {
		l.c.unregister(p)
		l.mu.Lock()
		ts.next-- // nothing later was assigned: ts.mu is held
		if !counted {
			l.uncountLocked(ts)
		}
		l.mu.Unlock()
		return fmt.Errorf("worker: publish event of task %s: %w", p.task, err)
	}
	return nil
}

// fillHead learns task's head for its queued events, then sends them in
// order, or ends them with the lookup's error.
func (l *Lease) fillHead(task string, ts *taskState) {
	h, err := l.head(l.ctx, task)
	if err != nil && l.ctx.Err() != nil {
		err = context.Cause(l.ctx)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.looking = false
	q := ts.queue
	ts.queue = nil
	if errors.Is(err, ErrWrongPartition) {
		ts.pinned = err // a task never moves: later publishes fail at once
	}
	if err == nil {
		ts.known, ts.next = true, h.Version+1
	}
	for _, e := range q {
		if err == nil {
			if serr := l.send(e.ctx, ts, e.p, e.typ, e.payload, true); serr != nil {
				l.drop(ts, e.p, serr)
			}
			continue
		}
		l.drop(ts, e.p, err)
	}
}

// drop ends a queued event that is not sent: it leaves the in-flight
// count, frees its slot and its Pending ends with err.
func (l *Lease) drop(ts *taskState, p *Pending, err error) {
	l.mu.Lock()
	l.uncountLocked(ts)
	l.mu.Unlock()
	<-l.slots
	p.fail(err)
}

// newULID returns a ULID with crypto/rand entropy, for event ids and
// acquire request ids: an event id is the ledger's idempotency key across
// every worker, and a request id makes a retry return an earlier grant, so
// neither may come from a time-seeded generator two processes could share.
func newULID() string { return ulid.MustNew(ulid.Now(), rand.Reader).String() }

// usableLocked is usable for a caller that holds l.mu; it never ends the
// lease itself (that needs the lock), so a passed deadline is reported and
// left to the timer.
func (l *Lease) usableLocked() error {
	switch {
	case l.state == stateEnded:
		return context.Cause(l.ctx)
	case l.pastDeadline():
		return l.deadlineError()
	case l.state == stateReleasing:
		return fmt.Errorf("worker: partition %d: %w", l.partition, ErrReleased)
	}
	return nil
}

// head looks up task's head; a task pinned to another partition than the
// lease's is ErrWrongPartition.
func (l *Lease) head(ctx context.Context, task string) (wire.TaskHeadReply, error) {
	h, err := l.c.heads.lookup(ctx, task)
	if err == nil && h.Partition != nil && *h.Partition != l.partition {
		err = fmt.Errorf("worker: task %s is pinned to partition %d, the lease is on %d: %w",
			task, *h.Partition, l.partition, ErrWrongPartition)
	}
	return h, err
}

func (l *Lease) learnHead(ctx context.Context, task string, ts *taskState) error {
	h, err := l.head(ctx, task)
	if err != nil {
		return err
	}
	ts.known, ts.next = true, h.Version+1
	return nil
}

// inbound is an event as its LEDGER_IN message carries it (docs/contract.md
// §2), alone or in a batch.
func (l *Lease) inbound(p *Pending, typ string, payload []byte) wire.Inbound {
	in := wire.Inbound{ID: p.id, Partition: l.partition, Task: p.task, Holder: l.c.cfg.Holder,
		Generation: l.generation, Version: p.version, Type: typ, Payload: payload}
	if p.snapshot {
		in.Kind = wire.KindSnapshot
	}
	return in
}

// ResyncTask learns task's head again, after an event of the task was
// refused (ErrResyncNeeded) or when another writer may have moved it. It
// first waits until every event of the task published under this lease has
// its receipt (bounded by ctx), because those may still commit: events
// waiting behind a refused version get their gap verdict only when the
// ledger's gap window (30 s by default) closes. It returns the head version.
func (l *Lease) ResyncTask(ctx context.Context, task string) (int64, error) {
	if !wire.ValidID(task) {
		return 0, fmt.Errorf("worker: resync: task id %q is not 1..128 of [A-Za-z0-9_-]: %w", task, ErrInvalid)
	}
	if err := l.usable(); err != nil {
		return 0, err
	}
	ts := l.task(task)
	ts.mu.Lock()
	for ts.resync != nil {
		ch := ts.resync
		ts.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("worker: resync task %s: %w", task, ctx.Err())
		}
		ts.mu.Lock()
	}
	done := make(chan struct{})
	ts.resync = done // new publishes of the task wait for the resync
	ts.mu.Unlock()
	defer func() {
		ts.mu.Lock()
		ts.resync = nil
		ts.mu.Unlock()
		close(done)
	}()
	// Queued events get their versions and leave (their lookup does not
	// need the resync), and every event sent gets its receipt.
	if err := l.waitIdle(ctx, ts); err != nil {
		return 0, fmt.Errorf("worker: resync task %s: %w", task, err)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.known = false
	if err := l.learnHead(ctx, task, ts); err != nil {
		return 0, err
	}
	l.mu.Lock()
	ts.refused = nil
	l.mu.Unlock()
	return ts.next - 1, nil
}

// Pending is one published event on its way to its verdict. It is safe for
// concurrent use.
type Pending struct {
	lease   *Lease
	id      string
	task    string
	version int64
	// in is the event as send gave it its version. Its own LEDGER_IN
	// message is built from it once, when first needed (message).
	in      wire.Inbound
	msgOnce sync.Once
	msg     *nats.Msg
	// snapshot marks an event of a snapshot task (PublishSnapshot).
	snapshot bool

	done     signal // closed with the receipt (or err)
	acked    signal // closed with the publish ack's outcome
	assigned signal // closed once version is set (or err)

	mu      sync.Mutex
	receipt wire.Receipt
	ack     *jetstream.PubAck
	ackErr  error
	// err ends an event that was never sent (Publish queued it, and its
	// head lookup failed or its ctx ended first).
	err error
	// lookup is the timer of the next lookup of the verdict
	// (Client.awaitVerdict); lookupsOver is set once none is wanted.
	lookup      *time.Timer
	lookupsOver bool
	// unknown counts the lookups the ledger answered with no record of
	// the event (Client.publishAgain).
	unknown int
	// resent is set once the client sent a copy of the event itself
	// (publishAgain, resendAcked): a duplicate answer is then its commit.
	resent atomic.Bool
}

// message is p's own LEDGER_IN message, nil before send gave p its
// version. A batched event needs it only when its batch fails or it is
// sent again, and building it for every event (a SHA-256 token, five
// headers) was a fifth of the Go SDK's CPU in `ledgerlab bench -only sdk`.
func (p *Pending) message() *nats.Msg {
	if p.in.ID == "" {
		return nil
	}
	p.msgOnce.Do(func() { p.msg = p.lease.c.subj.InboundMsg(p.in) })
	return p.msg
}

// ID returns the event id (a ULID), the key of its idempotency.
func (p *Pending) ID() string { return p.id }

// Task returns the event's task id.
func (p *Pending) Task() string { return p.task }

// Version returns the version the event was published with. For the first
// events of a task Publish returns before the task's head is known; Version
// then waits until the event's version is assigned, and returns 0 if the
// event ends unsent (Receipt says why).
func (p *Pending) Version() int64 {
	<-p.assigned.wait()
	return p.version
}

// markAssigned lets Version return.
func (p *Pending) markAssigned() { p.assigned.close() }

// fail ends an event that will never be sent.
func (p *Pending) fail(err error) {
	p.mu.Lock()
	p.err, p.ackErr = err, err
	p.mu.Unlock()
	p.markAssigned()
	p.acked.close()
	p.done.close()
}

// Done returns a channel that is closed when the event has its verdict:
// its receipt arrived, or the ledger told it after the receipt was lost.
func (p *Pending) Done() <-chan struct{} { return p.done.wait() }

// PubAck waits for JetStream's publish ack: LEDGER_IN has stored the
// event (replicated as the stream is configured; on a single node file
// store not necessarily synced to disk yet) and it awaits its verdict. The
// ack is not the success signal; the receipt is.
//
// A failed attempt is published again with the same event id while the
// lease lasts. PubAck returns an error once that stops (the lease ended or
// the client closed) without an ack; the event may still have been stored,
// so a receipt can follow. It returns a nil ack and nil error when the
// receipt came and the ack was then lost: the receipt proves storage.
func (p *Pending) PubAck(ctx context.Context) (*jetstream.PubAck, error) {
	select {
	case <-p.acked.wait():
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.ack, p.ackErr
	case <-ctx.Done():
		return nil, fmt.Errorf("worker: publish ack of event %s: %w", p.id, ctx.Err())
	}
}

// Receipt waits for the event's verdict. Verdict committed is the success
// signal: the event is a row of ledger.events, durable in Postgres, under
// the lease's fence; duplicate means it (or identical content at its
// version) was committed earlier. The package documentation lists what
// every verdict promises.
//
// Receipts are sent on core NATS, at least once in the normal flow (an
// ingest that crashed after committing sends a duplicate receipt when the
// event is redelivered), but one is lost if it is sent while this client
// is disconnected. The client then asks the ledger for the recorded
// verdict once Config.ReceiptTimeout has passed since the publish ack, and
// Receipt returns that, in the receipt's shape (see the package
// documentation for what it carries and for the two verdicts the ledger
// does not record). The wait is bounded by ctx. It returns ErrClosed after
// Client.Close.
func (p *Pending) Receipt(ctx context.Context) (wire.Receipt, error) {
	if p.done.isClosed() {
		return p.getReceipt()
	}
	select {
	case <-p.done.wait():
		return p.getReceipt()
	case <-ctx.Done():
		return wire.Receipt{}, fmt.Errorf("worker: receipt of event %s: %w", p.id, ctx.Err())
	case <-p.lease.c.closedCh:
		return wire.Receipt{}, ErrClosed
	}
}

// Wait waits for the receipt like Receipt and returns nil if the event is
// committed (verdict committed or duplicate), or a *RejectedError matching
// ErrRejected with the receipt.
func (p *Pending) Wait(ctx context.Context) error {
	r, err := p.Receipt(ctx)
	if err != nil {
		return err
	}
	if r.Verdict == wire.VerdictCommitted || r.Verdict == wire.VerdictDuplicate {
		return nil
	}
	return &RejectedError{Receipt: r}
}

func (p *Pending) getReceipt() (wire.Receipt, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.receipt, p.err
}

func (p *Pending) resolve(r wire.Receipt) {
	p.mu.Lock()
	p.receipt = r
	p.mu.Unlock()
	p.done.close()
}

// stopLookups stops the next lookup of p's verdict for good: p has its
// verdict, or the client is closed.
func (p *Pending) stopLookups() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lookupsOver = true
	if p.lookup != nil {
		p.lookup.Stop()
	}
}

func (p *Pending) setAck(ack *jetstream.PubAck, err error) {
	p.mu.Lock()
	p.ack, p.ackErr = ack, err
	p.mu.Unlock()
	p.acked.close()
}

// republish publishes an event again after a failed attempt (same id, so
// JetStream and the ledger deduplicate it), for as long as the lease lasts
// and no receipt has come. It never sends after the lease ended: a lost
// lease publishes nothing more. It holds the event's place in c.wg until
// the event is back in c.acking or given up.
func (c *Client) republish(p *Pending, err error) {
	backoff := 50 * time.Millisecond
	for {
		if p.done.isClosed() {
			p.setAck(nil, nil) // the receipt came: the ack no longer matters
			c.wg.Done()
			return
		}
		if p.lease.ctx.Err() != nil {
			p.setAck(nil, fmt.Errorf("worker: event %s not acknowledged (%w), and not sent again after the lease ended: %w",
				p.id, err, context.Cause(p.lease.ctx)))
			c.awaitVerdict(p) // an attempt may have been stored all the same
			c.wg.Done()
			return
		}
		c.log.Debug("publish not acknowledged; sending again", slog.String("event_id", p.id), slog.String("error", err.Error()))
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-p.done.wait():
		case <-p.lease.ctx.Done():
		case <-c.closedCh:
			t.Stop()
			p.setAck(nil, ErrClosed)
			c.wg.Done()
			return
		}
		t.Stop()
		backoff = min(2*backoff, time.Second)
		if p.lease.ctx.Err() != nil || p.done.isClosed() {
			continue // decided at the top of the loop
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			p.setAck(nil, ErrClosed)
			c.wg.Done()
			return
		}
		c.acking[p.id] = p
		c.mu.Unlock()
		if _, err = c.js.PublishMsgAsync(p.message()); err == nil {
			return // the callbacks take it from here
		}
		if c.takeAckingID(p.id) == nil {
			return // resolved meanwhile by a callback
		}
	}
}

// takeAckingID removes an event from c.acking by id.
func (c *Client) takeAckingID(id string) *Pending {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.acking[id]
	delete(c.acking, id)
	return p
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
