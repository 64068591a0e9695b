package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
)

// storedTasksMax bounds a lane's memory of the versions whose copies it
// stored; past it the memory starts afresh, which costs lookups, not order.
const storedTasksMax = 1 << 16

// storedCopy is a task's last copy as a lane knows it: its version and
// where LEDGER_LOG stored it.
type storedCopy struct {
	version int64
	seq     uint64
}

// precedingCopies returns the committed events whose LEDGER_LOG copies must
// be stored before the batch's own, so that LEDGER_LOG holds every task's
// events in commit order across processes: when a batch holds version v of
// a task and neither the batch (before v) nor this lane stored v-1, another
// process committed v-1 and its copy may still be on its way (or died with
// that process, or with a server's unsynced tail). The last copy of the task
// in LEDGER_LOG tells (looked, per task looked up); the versions it lacks
// are read from PostgreSQL, to be published first. A copy stored twice is
// deduplicated by its event id.
//
// Every copy of the batch is looked at, not only a task's first: after a
// loss a batch can hold a re-sent duplicate of an old version, sorted
// before the task's new versions, and the versions between them may be
// missing too.
func (s *Service) precedingCopies(ctx context.Context, l *lane, logged []*fence.Committed) (
	before []*fence.Committed, looked map[string]storedCopy, err error) {
	need := map[string]*fence.Committed{}
	upTo := map[string]int64{} // per task, the highest version the set must hold first
	top := map[string]int64{}
	for _, c := range logged {
		have, ok := top[c.Task]
		if !ok {
			have = l.stored[c.Task].version
		}
		if c.Version > have+1 {
			need[c.Task] = c
			upTo[c.Task] = c.Version - 1
		}
		top[c.Task] = max(have, c.Version)
	}
	if len(need) == 0 {
		return nil, nil, nil
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	looked = make(map[string]storedCopy, len(need))
	sem := make(chan struct{}, 16)
	for task, c := range need {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			last, rows, err := s.missingUpTo(ctx, c, upTo[task])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				first = cmp.Or(first, err)
				return
			}
			looked[task] = last
			before = append(before, rows...)
		}()
	}
	wg.Wait()
	return before, looked, first
}

// missingUpTo returns c's task's last copy in LEDGER_LOG (zero if none, or
// if it does not read) and the committed events of the task up to version
// upTo that LEDGER_LOG lacks after it, oldest first.
func (s *Service) missingUpTo(ctx context.Context, c *fence.Committed, upTo int64) (storedCopy, []*fence.Committed, error) {
	last, err := s.logStream.GetLastMsgForSubject(ctx, s.subjects.Log(c.Partition, c.Task))
	var have storedCopy
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return have, nil, fmt.Errorf("last log copy of task %s: %w", c.Task, err)
	default:
		lc, err := s.subjects.DecodeLog(last.Subject, last.Header, last.Data)
		if err != nil {
			// Not a copy this ledger wrote (only the ingest and an operator
			// may publish there): it says nothing of what LEDGER_LOG holds.
			// Retrying could not change it, so every earlier version is
			// published again, from PostgreSQL; those already stored within
			// the stream's window are deduplicated by their event ids.
			s.log.Warn("the last log copy of a task does not read; publishing its earlier versions again",
				slog.String("task", c.Task), slog.Uint64("stream_seq", last.Sequence), slog.String("error", err.Error()))
			break
		}
		have = storedCopy{version: lc.Version, seq: last.Sequence}
	}
	if have.version >= upTo {
		return have, nil, nil
	}
	rows, err := s.store.Between(ctx, c.Task, have.version, upTo+1)
	if err != nil {
		return have, nil, err
	}
	out := make([]*fence.Committed, len(rows))
	for i := range rows {
		out[i] = &rows[i]
	}
	return have, out, nil
}

// plannedCopy is one message of a batch's copies, in publish order.
type plannedCopy struct {
	msg     *nats.Msg
	task    string // "" for a dead letter
	version int64
	// after is the index of the task's first copy in the same plan, or -1.
	// A copy is published only once that one is stored.
	after int
	// expect, when known, is the sequence of the copy of the version
	// before, stored earlier (the lane remembers it, or a lookup found it).
	expect uint64
	known  bool
	stored bool
	seq    uint64
	// letter is a dead letter's index among the batch's (cb.out after its
	// log copies). A letter stored once is left out of a plan made again,
	// as is a log copy of a version LEDGER_LOG holds.
	letter int
}

// planCopies orders the copies to publish: before (the versions LEDGER_LOG
// lacks), then the batch's own (cb.out: its log copies, then dead letters).
//
// A task's first copy in the plan names the copy of its previous version
// that the lane stored or found: Nats-Expected-Last-Subject-Sequence is that
// copy's sequence. The stream refuses a copy whose predecessor it no longer
// holds (errWrongLastSeq), and the lane forgets the task and looks its last
// copy up again.
//
// The task's later copies in the plan go in a second round, once the first
// is stored: a refused first copy then takes none of them past the hole.
// They carry no expectation. A clustered stream refuses one while the
// subject's last message is not applied yet (10164), which would let the
// next copy, sent behind it, overtake it. So a batch costs at most two
// round trips, however many versions of a task it holds; chaining every
// version cost an R3 deployment 0.4x its throughput. With oneRound (a
// test's switch) every copy goes at once.
func planCopies(l *lane, before []*fence.Committed, looked map[string]storedCopy, cb *committedBatch,
	logCopy func(*fence.Committed) *nats.Msg, oneRound bool) []plannedCopy {
	plan := make([]plannedCopy, 0, len(before)+len(cb.out))
	type head struct {
		first   int // the task's first copy in the plan
		version int64
	}
	heads := map[string]head{}
	add := func(c *fence.Committed, m *nats.Msg) {
		p := plannedCopy{msg: m, task: c.Task, version: c.Version, after: -1, letter: -1}
		h, inPlan := heads[c.Task]
		switch {
		case inPlan && c.Version <= h.version:
			return // the same version twice in the plan
		case inPlan:
			if !oneRound {
				p.after = h.first
			}
			heads[c.Task] = head{first: h.first, version: c.Version}
			plan = append(plan, p)
			return
		case !inPlan:
			base, ok := looked[c.Task]
			if !ok {
				base, ok = l.stored[c.Task]
			}
			if ok && c.Version <= base.version {
				// An old version again (a duplicate's copy, a re-send):
				// LEDGER_LOG holds it, before the later one this lane
				// stored or found. Stored again, past the duplicate
				// window, it would be the task's last copy and the
				// next version's expectation would refuse every new one.
				return
			}
			if ok && c.Version == base.version+1 && base.seq > 0 {
				p.expect, p.known = base.seq, true
			}
		}
		heads[c.Task] = head{first: len(plan), version: c.Version}
		plan = append(plan, p)
	}
	for _, c := range before {
		add(c, logCopy(c))
	}
	for i, m := range cb.out {
		if i < len(cb.logged) {
			add(cb.logged[i], m)
			continue
		}
		if k := i - len(cb.logged); !cb.letterStored(k) {
			plan = append(plan, plannedCopy{msg: m, after: -1, letter: k})
		}
	}
	return plan
}

// remember notes the copies the lane stored, and where.
func (l *lane) remember(plan []plannedCopy) {
	if len(l.stored)+len(plan) > storedTasksMax {
		clear(l.stored)
	}
	for _, p := range plan {
		if p.task != "" && p.stored && p.seq > 0 && p.version > l.stored[p.task].version {
			l.stored[p.task] = storedCopy{version: p.version, seq: p.seq}
		}
	}
}
