package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

type leaseState int

const (
	stateActive    leaseState = iota
	stateReleasing            // Release waits for receipts; Publish is refused
	stateEnded                // lost, released or closed
)

// Lease is a partition's lease held by a Client: the right to publish
// events on the partition under its generation. A keep-alive goroutine
// renews it every Config.RenewEvery until Release, Client.Close or its
// loss. It is safe for concurrent use.
type Lease struct {
	c          *Client
	partition  int
	generation int64
	ttl        time.Duration

	ctx    context.Context
	cancel context.CancelCauseFunc
	lost   chan struct{}
	// slots bounds the events without a receipt (Config.MaxInFlight).
	slots chan struct{}
	// kaCtx stops the keep-alive, including a renewal in flight.
	kaCtx    context.Context
	kaCancel context.CancelFunc
	kaDone   chan struct{}

	mu        sync.Mutex
	state     leaseState
	deadline  time.Time   // local: no renewal confirmed, no trust after it
	timer     *time.Timer // fires at deadline
	expiresAt time.Time   // as the database last reported it
	tasks     map[string]*taskState
	inflight  int
	// batch gathers the events that leave in one message (batch.go).
	batch batcher
	// changed, made by a waitIdle, is closed and dropped when an event gets
	// its receipt: nil while no one waits, so that a receipt makes no
	// channel.
	changed chan struct{}
}

// Acquire takes partition's lease for the client's holder, asking for
// Config.TTL, and starts keeping it alive. It fails with an error matching
// ErrHeld (a *ServiceError naming the current holder and its expiry) when
// another holder has a valid lease, ErrLeaseActive when this client already
// holds the partition, ErrInvalid for a partition the service does not
// have, ErrUnavailable when the service cannot be reached in time, and
// ErrLeaseLost in the rare case of a grant that came too late to be kept
// (see below) whose renewal then failed. AcquireWait is Acquire for a
// standby: it waits for a held lease to end.
//
// The request carries a request_id (a ULID), and a request that is not
// answered (a timeout, no responders, a service whose database is down) is
// sent again with the same id until ctx ends; with a ctx without deadline,
// at most three times, each bounded by Config.RequestTimeout. However many
// times it is sent, the service grants it once: a retry of the request that
// made the current generation gets that same grant (docs/contract.md §1),
// so a slow service never makes a holder fence itself. The local deadline
// of the lease counts from the first send, the only moment known to precede
// the grant; when the grant comes so late that less than two thirds of the
// TTL is left before that deadline, Acquire renews the lease at once, so a
// late grant is kept rather than lost at its first renewal.
//
// Acquire by a holder that already holds the partition in another process
// (the same holder id restarted) succeeds with the next generation and
// fences the earlier one.
func (c *Client) Acquire(ctx context.Context, partition int) (*Lease, error) {
	return c.acquireAs(ctx, partition, &acquireRequest{id: newULID()})
}

// acquireRequest is one acquire request across its sends: its id, and when
// it was first sent (zero before).
type acquireRequest struct {
	id    string
	first time.Time
}

func (c *Client) acquireAs(ctx context.Context, partition int, req *acquireRequest) (*Lease, error) {
	if partition < 0 {
		return nil, fmt.Errorf("worker: acquire partition %d: negative partition: %w", partition, ErrInvalid)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if _, ok := c.leases[partition]; ok {
		c.mu.Unlock()
		return nil, fmt.Errorf("worker: acquire partition %d: %w", partition, ErrLeaseActive)
	}
	c.leases[partition] = nil // reserved while the request is in flight
	c.mu.Unlock()

	l, err := c.acquire(ctx, partition, req)

	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.closed {
		l.timer.Stop()
		l.cancel(ErrClosed)
		l, err = nil, ErrClosed // the grant expires by its TTL
	}
	if err != nil {
		delete(c.leases, partition)
		return nil, err
	}
	c.leases[partition] = l
	c.wg.Add(1)
	go l.keepAlive()
	return l, nil
}

// acquireAttemptsNoDeadline is how many times Acquire sends its request
// when the caller's context has no deadline.
const acquireAttemptsNoDeadline = 3

func (c *Client) acquire(ctx context.Context, partition int, ar *acquireRequest) (*Lease, error) {
	ttlMS := c.cfg.TTL.Milliseconds()
	req := wire.LeaseRequest{Partition: &partition, TTLMillis: &ttlMS, RequestID: ar.id}
	// The local deadline counts from the first send: the grant may have
	// been made while serving it, and its reply lost or late, so any later
	// send may follow the grant and count from too late.
	if ar.first.IsZero() {
		ar.first = time.Now()
	}
	first := ar.first
	reply, err := c.sendAcquire(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("worker: acquire partition %d: %w", partition, err)
	}
	l := &Lease{c: c, partition: partition, generation: reply.Generation, ttl: c.cfg.TTL,
		lost: make(chan struct{}), slots: make(chan struct{}, c.cfg.MaxInFlight),
		kaDone: make(chan struct{}), tasks: map[string]*taskState{}}
	granted := l.grantedTTL(reply)
	l.deadline = first.Add(granted - safetyMargin(granted))
	l.expiresAt, _ = time.Parse(time.RFC3339Nano, reply.ExpiresAt)
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	l.kaCtx, l.kaCancel = context.WithCancel(l.ctx)
	if time.Until(l.deadline) < granted*2/3 {
		if err := l.confirmLateGrant(ctx); err != nil {
			l.cancel(err)
			return nil, fmt.Errorf("worker: acquire partition %d: %w", partition, err)
		}
	}
	l.timer = time.AfterFunc(time.Until(l.Deadline()), l.onDeadline)
	c.log.Info("lease acquired", slog.Int("partition", partition), slog.Int64("generation", reply.Generation),
		slog.String("holder", c.cfg.Holder), slog.String("expires_at", reply.ExpiresAt))
	return l, nil
}

// sendAcquire sends an acquire request until it is answered: a request
// that timed out, found no responder or met a service without its database
// is sent again, with the same request_id, while ctx lasts (or
// acquireAttemptsNoDeadline times when ctx has no deadline); one that
// failed at once waits a growing backoff (20 ms to 500 ms) first.
func (c *Client) sendAcquire(ctx context.Context, req wire.LeaseRequest) (wire.LeaseReply, error) {
	subject := c.subj.Lease(wire.LeaseAcquire, c.cfg.Holder)
	_, bounded := ctx.Deadline()
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		var reply wire.LeaseReply
		sent := time.Now()
		err := c.request(ctx, subject, req, &reply)
		switch {
		case err == nil:
			return reply, nil
		case !errors.Is(err, ErrUnavailable) || ctx.Err() != nil:
			return reply, err
		case !bounded && attempt >= acquireAttemptsNoDeadline:
			return reply, fmt.Errorf("%d attempts: %w", attempt, err)
		}
		c.log.Debug("acquire not answered; sending it again with its request_id",
			slog.Int("partition", *req.Partition), slog.String("request_id", req.RequestID),
			slog.Int("attempt", attempt), slog.String("error", err.Error()))
		// A timed-out attempt has waited already; one that failed at once
		// (no responders, a service without its database) backs off.
		if err := sleepCtx(ctx, backoff-time.Since(sent)); err != nil {
			return reply, fmt.Errorf("%d attempts: %w", attempt, err)
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// confirmLateGrant renews a lease whose grant came late, before it is
// handed out: its deadline then counts from the renewal. A renewal succeeds
// only for the current generation of an unexpired lease, so even a grant
// whose local deadline has already passed is proven continuous by it (no
// takeover can come between: it would need the lease to expire). If the
// renewal fails for want of an answer while the deadline still holds, the
// lease is handed out and the keep-alive goes on trying.
func (l *Lease) confirmLateGrant(ctx context.Context) error {
	_, err := l.renewBy(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrLost) || errors.Is(err, ErrNoLease):
		return fmt.Errorf("%w: generation %d was granted too late to keep: its renewal was refused: %w",
			ErrLeaseLost, l.generation, err)
	case time.Now().Before(l.deadline):
		l.c.log.Warn("late lease grant not confirmed yet; the keep-alive goes on trying",
			slog.Int("partition", l.partition), slog.Int64("generation", l.generation),
			slog.String("left", time.Until(l.deadline).String()), slog.String("error", err.Error()))
		return nil
	}
	return fmt.Errorf("%w: generation %d was confirmed after its local deadline and could not be renewed: %w",
		ErrLeaseLost, l.generation, err)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// grantedTTL is the TTL the service granted, or the one asked for if the
// reply does not say.
func (l *Lease) grantedTTL(r wire.LeaseReply) time.Duration {
	if r.TTLMillis > 0 {
		return time.Duration(r.TTLMillis) * time.Millisecond
	}
	return l.ttl
}

// Partition returns the leased partition.
func (l *Lease) Partition() int { return l.partition }

// Generation returns the lease's generation, its fencing token.
func (l *Lease) Generation() int64 { return l.generation }

// Fence returns the lease's fence: its partition, the client's holder and
// the generation. Send it (wire.HeaderFence, Fence.String) with every call
// a downstream service should refuse once a later holder has acted; it
// stays the same for the life of the lease, renewals included.
func (l *Lease) Fence() wire.Fence {
	return wire.Fence{Partition: l.partition, Holder: l.c.cfg.Holder, Generation: l.generation}
}

// Context returns a context that is cancelled when the lease ends. Its
// cause (context.Cause) matches ErrLeaseLost when the lease was lost,
// ErrReleased after Release, or ErrClosed after Client.Close. Work done
// under the lease should stop when it is done.
func (l *Lease) Context() context.Context { return l.ctx }

// Lost returns a channel that is closed when the lease is lost (and only
// then: not on Release or Close). The cause is context.Cause(l.Context()).
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Deadline returns the local deadline of the lease: the monotonic time
// after which the client no longer trusts it unless a renewal is confirmed
// before. It is never later than the database's expiry (see the package
// documentation).
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// ExpiresAt returns the expiry the database reported with the last
// confirmed acquire or renewal, by the database clock.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// keepAlive renews the lease every RenewEvery, and sooner after a failed
// renewal, until the lease ends. It never decides expiry: onDeadline does,
// on its own timer, so a renewal stuck in flight cannot delay the loss.
func (l *Lease) keepAlive() {
	defer l.c.wg.Done()
	defer close(l.kaDone)
	every := l.c.cfg.RenewEvery
	retry := max(every/4, 10*time.Millisecond)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-l.kaCtx.Done():
			return
		case <-t.C:
		}
		sent, err := l.renew()
		switch {
		case err == nil:
			t.Reset(time.Until(sent.Add(every)))
		case l.kaCtx.Err() != nil:
			return
		case errors.Is(err, ErrLost) || errors.Is(err, ErrNoLease):
			l.end(fmt.Errorf("%w: partition %d generation %d: renewal refused: %w",
				ErrLeaseLost, l.partition, l.generation, err), true)
			return
		default:
			l.c.log.Warn("lease renewal failed; retrying until the local deadline",
				slog.Int("partition", l.partition), slog.Int64("generation", l.generation),
				slog.String("left", time.Until(l.Deadline()).String()), slog.String("error", err.Error()))
			t.Reset(retry)
		}
	}
}

// renew sends one renewal, bounded by the local deadline (a reply after it
// could not save the lease anyway) and by renewAttempt, and extends the
// deadline on success.
func (l *Lease) renew() (time.Time, error) {
	ctx, cancel := context.WithDeadline(l.kaCtx, l.Deadline())
	defer cancel()
	ctx, cancelAttempt := context.WithTimeout(ctx, l.renewAttempt())
	defer cancelAttempt()
	return l.renewBy(ctx)
}

// renewAttempt bounds one renewal request: half the renewal interval, at
// most the request timeout. A renewal whose reply is lost (an ingest killed
// while serving it, a dropped packet) is then sent again while the lease
// still has time: with the request timeout alone, at a 3 s TTL one lost
// reply used up the time left and the lease was lost.
func (l *Lease) renewAttempt() time.Duration {
	return min(max(l.c.cfg.RenewEvery/2, 50*time.Millisecond), l.c.cfg.RequestTimeout)
}

// renewBy sends one renewal bounded by ctx and, on success, moves the local
// deadline to TTL after its send (less the margin) if that is later.
func (l *Lease) renewBy(ctx context.Context) (time.Time, error) {
	ttlMS := l.ttl.Milliseconds()
	req := wire.LeaseRequest{Partition: &l.partition, Generation: &l.generation, TTLMillis: &ttlMS}
	var reply wire.LeaseReply
	sent := time.Now()
	if err := l.c.request(ctx, l.c.subj.Lease(wire.LeaseRenew, l.c.cfg.Holder), req, &reply); err != nil {
		return sent, err
	}
	ttl := l.grantedTTL(reply)
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := sent.Add(ttl - safetyMargin(ttl)); l.state != stateEnded && d.After(l.deadline) {
		l.deadline = d
		if l.timer != nil { // nil while Acquire confirms a late grant
			l.timer.Reset(time.Until(d))
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, reply.ExpiresAt); err == nil {
		l.expiresAt = t
	}
	return sent, nil
}

// The local deadline. The database clock decides when a lease expires: a
// grant or renewal sets expires_at = now() + TTL by its clock, at some
// moment while the request is served. The client cannot read that clock,
// so it keeps a more pessimistic deadline of its own:
//
//	local deadline = (monotonic time the confirmed request was SENT) + TTL − margin
//	margin         = 2% of TTL + 25 ms (safetyMargin)
//
// For an acquire sent more than once, the send is the first: a later copy
// may have left after the grant. The database's now() is later than the
// send, so its expiry is later than send + TTL. The margin covers the two
// clocks running at slightly different rates over one TTL (real drift is
// parts per million) and a timer that fires late. So the local deadline
// never comes after the database's expiry.
//
// A takeover succeeds only after the database's expiry (docs/contract.md
// §8), and the new holder commits only after its grant. A lease whose
// renewal is not confirmed by the local deadline is declared lost at that
// deadline, before any other holder could even be granted the partition.
// So a client whose renewals stop arriving (a network cut, the service
// down, the process paused) learns of the loss in time, from nobody.
// Losing the lease locally does not undo what was sent: events published
// before the loss may still commit until the database's expiry. An event
// that reaches the ledger after a takeover is refused by the fence.

// onDeadline runs when the local deadline passes without a confirmed
// renewal. The lease may still be valid in the database for a moment, but
// this client can no longer prove it, so it gives the lease up before a
// takeover could be granted.
func (l *Lease) onDeadline() {
	l.mu.Lock()
	if l.state == stateEnded {
		l.mu.Unlock()
		return
	}
	if left := time.Until(l.deadline); left > 0 && !l.pastDeadline() { // extended meanwhile
		l.timer.Reset(left)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.end(l.deadlineError(), true)
}

// pastDeadline reports whether the local deadline has passed by the
// monotonic clock or by the wall clock: after a host suspend only the wall
// clock has moved on, and a wall clock stepped forward only ends the lease
// early, which is safe. The caller holds l.mu.
func (l *Lease) pastDeadline() bool {
	now := time.Now()
	return !now.Before(l.deadline) || !now.Round(0).Before(l.deadline.Round(0))
}

func (l *Lease) deadlineError() error {
	return fmt.Errorf("%w: partition %d generation %d: no renewal confirmed before the local deadline "+
		"(TTL %v after the last confirmed request was sent, less a safety margin)",
		ErrLeaseLost, l.partition, l.generation, l.ttl)
}

// end ends the lease once, with cause: it stops the keep-alive and the
// deadline timer and cancels the lease's context. Events already published
// keep waiting for their receipts.
func (l *Lease) end(cause error, lost bool) {
	l.mu.Lock()
	if l.state == stateEnded {
		l.mu.Unlock()
		return
	}
	l.state = stateEnded
	l.timer.Stop()
	l.mu.Unlock()

	// The client forgets the lease before anyone is told it ended: a
	// standby woken by Lost or by the context calls AcquireWait at once,
	// and must not be refused with ErrLeaseActive for the lease it lost.
	l.c.mu.Lock()
	if l.c.leases[l.partition] == l {
		delete(l.c.leases, l.partition)
	}
	l.c.mu.Unlock()
	// The cause is set before Lost is closed, so a reader woken by Lost
	// always finds it.
	l.cancel(cause)
	l.kaCancel()
	if lost {
		close(l.lost)
		l.c.log.Warn("lease lost", slog.Int("partition", l.partition), slog.Int64("generation", l.generation),
			slog.String("cause", cause.Error()))
	}
}

// usable returns nil while events may be published: the lease is active
// and its local deadline has not passed. A passed deadline ends the lease
// here even if its timer has not run yet.
func (l *Lease) usable() error {
	l.mu.Lock()
	st, expired := l.state, l.pastDeadline()
	l.mu.Unlock()
	switch {
	case st == stateEnded:
		return context.Cause(l.ctx)
	case expired:
		l.end(l.deadlineError(), true)
		return context.Cause(l.ctx)
	case st == stateReleasing:
		return fmt.Errorf("worker: partition %d: %w", l.partition, ErrReleased)
	}
	return nil
}

// Release ends the lease cleanly: it refuses new events, waits until
// every event published under the lease has its receipt (or, if that was
// lost, its verdict from the ledger: Config.ReceiptTimeout), stops the
// keep-alive and then releases the lease in the ledger (the generation is
// kept; the next acquire bumps it). The lease's context is then cancelled
// with cause ErrReleased.
//
// Release is final whatever it returns. If ctx ends before the receipts
// arrived, the keep-alive stops but no release is sent, so events still in
// flight may commit until the lease expires by its TTL; the error wraps
// ctx's. If the lease is lost meanwhile, or the service refuses the release
// (errors.Is(err, ErrLost)), the error matches ErrLeaseLost or ErrLost.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	switch l.state {
	case stateReleasing:
		l.mu.Unlock()
		return fmt.Errorf("worker: release partition %d: already releasing: %w", l.partition, ErrReleased)
	case stateEnded:
		l.mu.Unlock()
		return context.Cause(l.ctx)
	}
	l.state = stateReleasing
	l.mu.Unlock()

	if err := l.waitIdle(ctx, nil); err != nil {
		if l.ctx.Err() == nil {
			l.end(fmt.Errorf("%w: abandoned with events in flight; the lease expires by its TTL", ErrReleased), false)
		}
		return fmt.Errorf("worker: release partition %d: %w", l.partition, err)
	}
	// The keep-alive must be stopped first: a renewal arriving after the
	// release would be refused and read as a loss.
	l.kaCancel()
	<-l.kaDone
	if err := l.usable(); err != nil && !errors.Is(err, ErrReleased) {
		return err
	}
	req := wire.LeaseRequest{Partition: &l.partition, Generation: &l.generation}
	var reply wire.ReleaseReply
	err := l.c.request(ctx, l.c.subj.Lease(wire.LeaseRelease, l.c.cfg.Holder), req, &reply)
	switch {
	case err == nil:
		l.end(ErrReleased, false)
		return nil
	case errors.Is(err, ErrLost) || errors.Is(err, ErrNoLease):
		err = fmt.Errorf("%w: partition %d generation %d: release refused: %w", ErrLeaseLost, l.partition, l.generation, err)
		l.end(err, true)
		return err
	default:
		l.end(fmt.Errorf("%w: release not confirmed (%v); the lease expires by its TTL", ErrReleased, err), false)
		return fmt.Errorf("worker: release partition %d: %w", l.partition, err)
	}
}

// countLocked counts an event of ts in flight (queued for its head, or
// sent and without its receipt); l.mu is held.
func (l *Lease) countLocked(ts *taskState) {
	ts.inflight++
	l.inflight++
}

// uncountLocked takes an event of ts out of the in-flight count and wakes
// whoever waits for the count to fall (waitIdle); l.mu is held.
func (l *Lease) uncountLocked(ts *taskState) {
	ts.inflight--
	l.inflight--
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// waitIdle waits until no event of the lease (or of task ts, if given)
// lacks its receipt. It fails when ctx ends or the lease ends.
func (l *Lease) waitIdle(ctx context.Context, ts *taskState) error {
	for {
		l.mu.Lock()
		n := l.inflight
		if ts != nil {
			n = ts.inflight
		}
		if n == 0 {
			l.mu.Unlock()
			return nil
		}
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%d events still without receipt: %w", n, ctx.Err())
		case <-l.ctx.Done():
			return context.Cause(l.ctx)
		}
	}
}

// noteRefusal marks p's task refused when r refuses it, so that its next
// publish fails with ErrResyncNeeded until ResyncTask.
func (l *Lease) noteRefusal(p *Pending, r wire.Receipt) {
	switch r.Verdict {
	case wire.VerdictInvalid, wire.VerdictConflict, wire.VerdictGap:
	default:
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ts := l.tasks[p.task]; ts.refused == nil {
		refused := r // copied here, so that a receipt that refuses nothing stays off the heap
		ts.refused = &refused
	}
}

// onReceipt accounts for an event's receipt: it frees the event's slot, a
// stale verdict ends the lease (the fence refused this generation, which
// can never hold again). noteRefusal marks a refused task before.
func (l *Lease) onReceipt(p *Pending, r wire.Receipt) {
	l.mu.Lock()
	l.uncountLocked(l.tasks[p.task])
	l.mu.Unlock()
	<-l.slots
	if r.Verdict == wire.VerdictStale {
		l.end(fmt.Errorf("%w: partition %d generation %d: event %s came back stale (%s, current generation %d)",
			ErrLeaseLost, l.partition, l.generation, r.EventID, r.Reason, r.CurrentGeneration), true)
	}
}
