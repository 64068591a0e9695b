package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// maxLookupBytes bounds a batch of lookups' body: the ledger's limit for
// one, which is the NATS server's default max_payload.
const maxLookupBytes = 1 << 20

// lookupBatcher asks the ledger for the verdicts of events whose receipt
// did not come, many in one request, as headBatcher does for heads (coalescer). After a
// loss thousands of events wait at once; one request each was refused busy
// by the principal's fair share of the lease service, and most events
// waited several more ReceiptTimeouts. Against a ledger older than the
// batch form it asks one event at a time, as SDKs before it did.
type lookupBatcher struct {
	c *Client
	q coalescer[*lookupCall]
	// single is set once the ledger answered that it does not know the
	// batch form.
	single atomic.Bool
	// refusals logs busy and rate_limited refusals once per run of them.
	refusals refusalRun
}

func newLookupBatcher(c *Client) *lookupBatcher {
	b := &lookupBatcher{c: c}
	b.q.take, b.q.ask = b.take, b.ask
	return b
}

type lookupCall struct {
	p     *Pending
	done  chan struct{}
	reply wire.TaskHeadEventReply
	err   error
}

// lookup asks for p's verdict together with whatever other lookups wait;
// it returns the ledger's answer about p.
func (b *lookupBatcher) lookup(ctx context.Context, p *Pending) (wire.TaskHeadEventReply, error) {
	if b.c.cfg.LookupBatchMax == 1 || b.single.Load() {
		return b.one(ctx, p)
	}
	call := &lookupCall{p: p, done: make(chan struct{})}
	b.q.add(call)
	select {
	case <-call.done:
		return call.reply, call.err
	case <-ctx.Done():
		return wire.TaskHeadEventReply{}, ctx.Err()
	}
}

// take is how many waiting calls the next request carries: at most
// LookupBatchMax, and as many as fit maxLookupBytes and the server's
// max_payload (at least one). A payload grows at most twofold as a JSON
// string, and the other members of a lookup take at most 512 bytes.
func (b *lookupBatcher) take(wait []*lookupCall) int {
	limit := min(maxLookupBytes, int(b.c.nc.MaxPayload()))
	size := 16
	for i, call := range wait {
		if size += 2*len(call.p.in.Payload) + 512; i == b.c.cfg.LookupBatchMax || (i > 0 && size > limit) {
			return i
		}
	}
	return len(wait)
}

// ask sends one request for calls and settles each; against a ledger
// without the batch form it asks for each alone.
func (b *lookupBatcher) ask(calls []*lookupCall) {
	if !b.single.Load() && b.batch(calls) {
		return
	}
	for _, call := range calls {
		call.reply, call.err = b.one(b.c.ctx, call.p)
		close(call.done)
	}
}

// batch sends calls in one request and settles them, unless the ledger
// refused the batch as invalid: then it returns false, and each is asked
// alone. An older ledger refuses a batch for its size before it reads a
// field, and a newer one so isolates the lookup it refuses.
func (b *lookupBatcher) batch(calls []*lookupCall) bool {
	req := wire.TaskHeadRequest{Lookups: make([]wire.VerdictLookup, len(calls))}
	for i, call := range calls {
		req.Lookups[i] = lookupOf(call.p)
	}
	var r wire.TaskHeadEventsReply
	err := b.c.request(b.c.ctx, b.c.subj.TaskHead(), req, &r)
	b.refusals.note(b.c.log, err, len(calls))
	if unknownBatch(err) && !b.single.Swap(true) {
		b.c.log.Info("the ledger answers no batch of verdict lookups (an older ledger); asking for each event alone",
			slog.String("error", err.Error()))
	}
	if errors.Is(err, ErrInvalid) {
		return false
	}
	if err == nil && len(r.Heads) != len(calls) {
		err = fmt.Errorf("%w: %d answers to %d lookups", ErrUnavailable, len(r.Heads), len(calls))
	}
	for i, call := range calls {
		switch {
		case err != nil:
			call.err = err
		case r.Heads[i].Task != call.p.task:
			call.err = fmt.Errorf("the service answered for task %.40q: %w", r.Heads[i].Task, ErrUnavailable)
		default:
			call.reply = r.Heads[i]
		}
		close(call.done)
	}
	return true
}

// one asks for p's verdict alone, in a lookup's single form.
func (b *lookupBatcher) one(ctx context.Context, p *Pending) (wire.TaskHeadEventReply, error) {
	l := lookupOf(p)
	req := wire.TaskHeadRequest{Task: l.Task, EventID: l.EventID, Version: l.Version, Type: l.Type, Payload: l.Payload}
	var reply wire.TaskHeadEventReply
	err := b.c.request(ctx, b.c.subj.TaskHead(), req, &reply)
	b.refusals.note(b.c.log, err, 1)
	return reply, err
}

// lookupOf is the lookup of p. The content goes along, so that the
// ledger answers committed only for what it stored under the id.
func lookupOf(p *Pending) wire.VerdictLookup {
	payload := string(p.in.Payload)
	return wire.VerdictLookup{Task: p.task, EventID: p.id, Version: p.version, Type: p.in.Type, Payload: &payload}
}

// unknownBatch reports whether err is a ledger's refusal of the batch form
// itself: an ingest older than it reads "lookups" as an unknown field.
func unknownBatch(err error) bool {
	var se *ServiceError
	return errors.As(err, &se) && se.Code == wire.ErrCodeInvalid &&
		strings.Contains(se.Message, "unknown field") && strings.Contains(se.Message, `"lookups"`)
}

// refusalRun logs the lease service's busy and rate_limited refusals of
// verdict lookups once per run of them, with how many lookups were
// refused, and once more when lookups are served again. One line per
// event, as before, said nothing at the default level and too much at
// debug.
type refusalRun struct {
	mu      sync.Mutex
	since   time.Time
	refused int
}

// note counts the answer to a request of n lookups.
func (r *refusalRun) note(log *slog.Logger, err error, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case errors.Is(err, ErrBusy):
		if r.refused == 0 {
			r.since = time.Now()
			log.Warn("the lease service refuses verdict lookups: this principal is over its share; asking again later",
				slog.Int("lookups", n), slog.String("error", err.Error()))
		}
		r.refused += n
	case err == nil && r.refused > 0:
		log.Info("verdict lookups served again", slog.Int("refused", r.refused),
			slog.String("after", time.Since(r.since).Round(time.Millisecond).String()))
		r.refused = 0
	}
}
