package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// Inboxes. Workers' events arrive in LEDGER_IN, or, in a deployment that
// gives each principal a share of its own, in LEDGER_IN_<principal>
// (streams.Inboxes). A claimed partition has a consumer on every inbox, so
// a principal's flood queues in its own stream only. Each consumer hands
// its messages to the partition's lane one at a time, and a lane takes
// waiting senders in turn: the principals of a partition are served round
// robin, and one principal's backlog waits behind the others' events, never
// in front of them. A task is its principal's, so its events keep their
// order within that principal's stream.
//
// The inboxes are looked at again on every beat, so the stream of a
// principal added later gets its consumers within a beat.

// inboxSet is the inbox streams this process consumes, by name.
type inboxSet struct {
	mu     sync.Mutex
	byName map[string]jetstream.Stream
	// order is each inbox's place among them, sorted by name, replaced
	// whole on a change: laneOf reads it for every message.
	order atomic.Pointer[map[string]int]
	// failed are the inboxes this process could not read (its credential
	// may not, or the server did not answer), each tried again after its
	// backoff, and after the inboxes that could be read.
	failed map[string]*inboxFailure
}

// inboxFailure is an inbox's run of failed readings.
type inboxFailure struct {
	times int
	next  time.Time // not tried again before
}

const (
	// inboxReadTimeout bounds the reading of one inbox: a request the
	// credential may not make is never answered.
	inboxReadTimeout = 2 * time.Second
	// inboxRetryMax bounds the wait before an inbox that could not be
	// read is tried again.
	inboxRetryMax = 15 * time.Second
)

// names lists the inboxes, sorted.
func (b *inboxSet) names() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.byName))
	for n := range b.byName {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// reorder numbers the inboxes anew (laneOf).
func (b *inboxSet) reorder() {
	order := map[string]int{}
	for i, n := range b.names() {
		order[n] = i
	}
	b.order.Store(&order)
}

// stream is the inbox named name, or nil.
func (b *inboxSet) stream(name string) jetstream.Stream {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byName[name]
}

// listInboxes reads which inbox streams exist now and returns those added
// and removed since the last listing. While LEDGER_IN exists it is the only
// inbox (no principal's inbox can hold its subjects beside it), and no
// listing is asked for: a credential written before inboxes per principal
// may not list streams.
func (s *Service) listInboxes(ctx context.Context) (added, removed []string, err error) {
	names := []string{wire.StreamIn}
	if _, err := s.js.Stream(ctx, wire.StreamIn); errors.Is(err, jetstream.ErrStreamNotFound) {
		if names, err = streams.Inboxes(ctx, s.js, s.cfg.Prefix); err != nil {
			return nil, nil, err
		}
	} else if err != nil {
		return nil, nil, fmt.Errorf("stream %s: %w", wire.StreamIn, err)
	}
	if len(names) == 0 {
		return nil, nil, errors.New("no inbox stream (LEDGER_IN or LEDGER_IN_<principal>) exists")
	}
	have := s.inboxes.names()
	var failures []error
	for _, n := range s.inboxes.toRead(names, have) {
		if ctx.Err() != nil {
			break // the rest on the next listing
		}
		ictx, cancel := context.WithTimeout(ctx, inboxReadTimeout)
		st, err := s.readInbox(ictx, n)
		cancel()
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			// One inbox this process cannot read must not keep it from
			// the others: they were read first, and it waits its turn.
			s.inboxes.fail(n, time.Now())
			failures = append(failures, fmt.Errorf("stream %s: %w", n, err))
			continue
		}
		s.inboxes.mu.Lock()
		s.inboxes.byName[n] = st
		delete(s.inboxes.failed, n)
		s.inboxes.mu.Unlock()
		added = append(added, n)
	}
	err = errors.Join(failures...)
	if ctx.Err() != nil && len(failures) == 0 && len(added) < len(names)-len(have) {
		err = fmt.Errorf("listing the inboxes: %w", ctx.Err())
	}
	for _, n := range have {
		if !slices.Contains(names, n) {
			s.inboxes.mu.Lock()
			delete(s.inboxes.byName, n)
			s.inboxes.mu.Unlock()
			removed = append(removed, n)
		}
	}
	if len(added)+len(removed) > 0 || s.inboxes.order.Load() == nil {
		s.inboxes.reorder()
	}
	return added, removed, err
}

// readInbox applies inbox n (unless it is LEDGER_IN) and reads it.
func (s *Service) readInbox(ctx context.Context, n string) (jetstream.Stream, error) {
	if p, _ := wire.InboxPrincipal(n); n != wire.StreamIn {
		// Its subjects are the deployment's partitions, as LEDGER_IN's
		// are made at start; a create that matches costs no update.
		o := streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas, Partitions: s.store.Partitions()}
		if err := streams.ApplyInboxes(ctx, s.js, o, []string{p}); err != nil {
			s.log.Warn("applying an inbox stream failed; consuming it as it is", slog.String("stream", n),
				slog.String("error", err.Error()))
		}
	}
	return s.js.Stream(ctx, n)
}

// toRead is which of names, not in have, to read now: those that never
// failed first, then those whose backoff is over, fewest failures first.
func (b *inboxSet) toRead(names, have []string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var out []string
	for _, n := range names {
		if f := b.failed[n]; !slices.Contains(have, n) && (f == nil || !now.Before(f.next)) {
			out = append(out, n)
		}
	}
	slices.SortStableFunc(out, func(x, y string) int {
		return cmp.Compare(b.failures(x), b.failures(y))
	})
	return out
}

func (b *inboxSet) failures(n string) int {
	if f := b.failed[n]; f != nil {
		return f.times
	}
	return 0
}

// fail counts a failed reading of inbox n and sets its backoff: a second,
// doubling up to inboxRetryMax. A server too slow to answer in time backs
// off a readable inbox too, for seconds at most.
func (b *inboxSet) fail(n string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed == nil {
		b.failed = map[string]*inboxFailure{}
	}
	f := b.failed[n]
	if f == nil {
		f = &inboxFailure{}
		b.failed[n] = f
	}
	f.times++
	f.next = now.Add(min(time.Second<<min(f.times-1, 4), inboxRetryMax))
}

// syncInboxes lists the inboxes again and gives every owned partition a
// consumer on each new one; those of a removed inbox stop. Under beatMu.
func (s *Service) syncInboxes(ctx context.Context) {
	// Bounded like the beat's own calls: a slow listing must not keep the
	// claims from being renewed.
	lctx, cancel := context.WithTimeout(ctx, s.cfg.ClaimTTL/3)
	added, removed, err := s.listInboxes(lctx)
	cancel()
	if err != nil {
		s.log.Warn("listing the inbox streams failed; trying again", slog.String("error", err.Error()))
	}
	for _, n := range added {
		s.log.Info("consuming an inbox stream", slog.String("stream", n))
	}
	if len(added)+len(removed) == 0 {
		return
	}
	for _, p := range s.claims.owned() {
		s.claims.mu.Lock()
		r := s.claims.runs[p]
		s.claims.mu.Unlock()
		if r == nil {
			continue
		}
		for _, n := range removed {
			if cc := r.consumers[n]; cc != nil {
				cc.Stop()
			}
		}
		for _, n := range added {
			cc, err := s.consumeInbox(ctx, r.claim, n)
			if err != nil {
				// The next beat finds it added again: it is not in runs.
				s.log.Warn("starting a partition's consumer on an inbox failed", slog.Int("partition", p),
					slog.String("stream", n), slog.String("error", err.Error()))
				s.inboxes.mu.Lock()
				delete(s.inboxes.byName, n)
				s.inboxes.mu.Unlock()
				continue
			}
			s.claims.mu.Lock()
			r.consumers[n] = cc
			s.claims.mu.Unlock()
		}
		s.claims.mu.Lock()
		for _, n := range removed {
			delete(r.consumers, n)
		}
		s.claims.mu.Unlock()
	}
}

// inboxFilters are the subjects of partition p's events in the inbox
// stream: its single events and its batches (docs/contract.md §2), of
// every principal in LEDGER_IN, of the stream's own in LEDGER_IN_<principal>.
func (s *Service) inboxFilters(stream string, p int) []string {
	principal, _ := wire.InboxPrincipal(stream)
	return []string{s.subjects.InPrincipalPartition(principal, p), s.subjects.InPrincipalBatchPartition(principal, p)}
}

// inboxForm is one form of a partition's events in an inbox, single events
// or batches, and its consumer under a claim.
type inboxForm struct {
	name, filter string
}

// inboxForms are partition cl's two consumers on the inbox stream, each
// filtered by one subject. One consumer with both filters made the server
// intersect the stream's subjects with two filters for each message it
// delivered: 42% of the nats-server's CPU with single events, 17% with the
// SDK's batches (ledgerlab bench -external -nats-profile). A partition's
// single events and batches then reach its lane each in stream order, not
// in order between them, which a task's versions do not need (they wait
// for their predecessors, and an earlier message still queued keeps an
// event from its gap).
func (s *Service) inboxForms(stream string, cl fence.Claim) []inboxForm {
	f := s.inboxFilters(stream, cl.Partition)
	name := consumerName(cl.Partition, cl.Epoch)
	return []inboxForm{{name: name, filter: f[0]}, {name: name + "-batches", filter: f[1]}}
}

// laneOf is the lane of in. With inboxes per principal the lanes are
// split among them: while there are no more inboxes than lanes, each
// inbox has lanes of its own, and its partitions are spread over them. A
// principal's flood then waits in its own lanes: another principal's
// events wait neither for its batches nor for their copies and acks. They
// meet it only in PostgreSQL, and at a partition's lease row when the flood
// is of events on their partition (each judged there, under the row's
// lock). With more inboxes than lanes, each partition's inboxes are spread
// over the lanes, and a lane takes its waiting senders in turn. A task's
// events are all in its principal's inbox, so they keep one lane and their
// order; when an inbox is added or removed a partition may move, which
// costs a task waiting for its previous version a redelivery (park.go) and
// a log lookup (order.go), never its order. LEDGER_IN alone keeps every
// partition in its own lane, as before, and so do log batches
// (logchain.go): a partition's chain has one writer.
func (s *Service) laneOf(in *inbound) int {
	lanes := len(s.lanes)
	order := s.inboxes.order.Load()
	if order == nil || len(*order) <= 1 || s.cfg.LogBatches {
		return in.part % lanes
	}
	i, n := (*order)[in.stream], len(*order)
	if n > lanes {
		return (in.part + i) % lanes
	}
	share := lanes / n
	return i*share + in.part%share
}
