package ingest

import (
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

// precedingCopies returns the LEDGER_LOG copies that must be stored before
// the batch's own, so that LEDGER_LOG holds every task's events in commit
// order across processes: when a batch holds version v of a task and
// neither the batch (before v) nor this lane stored v-1, another process
// committed v-1 and its copy may still be on its way (or died with that
// process, or with a server's unsynced tail). The last copy of the task in
// LEDGER_LOG tells; the versions it lacks are read from PostgreSQL and
// published first. A copy stored twice is deduplicated by its event id.
//
// Every copy of the batch is looked at, not only a task's first: after a
// loss a batch can hold a re-sent duplicate of an old version, sorted
// before the task's new versions, and the versions between them may be
// missing too.
func (s *Service) precedingCopies(ctx context.Context, l *lane, logged []*fence.Committed) ([]*nats.Msg, error) {
	need := map[string]*fence.Committed{}
	upTo := map[string]int64{} // per task, the highest version the set must hold first
	top := map[string]int64{}
	for _, c := range logged {
		have, ok := top[c.Task]
		if !ok {
			have = l.stored[c.Task]
		}
		if c.Version > have+1 {
			need[c.Task] = c
			upTo[c.Task] = c.Version - 1
		}
		top[c.Task] = max(have, c.Version)
	}
	if len(need) == 0 {
		return nil, nil
	}
	var (
		mu    sync.Mutex
		out   []*nats.Msg
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, 16)
	for task, c := range need {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			msgs, err := s.missingUpTo(ctx, c, upTo[task])
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			out = append(out, msgs...)
		}()
	}
	wg.Wait()
	return out, first
}

// missingUpTo returns the copies of c's task up to version upTo that
// LEDGER_LOG lacks, oldest first.
func (s *Service) missingUpTo(ctx context.Context, c *fence.Committed, upTo int64) ([]*nats.Msg, error) {
	last, err := s.logStream.GetLastMsgForSubject(ctx, s.subjects.Log(c.Partition, c.Task))
	var have int64
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return nil, fmt.Errorf("last log copy of task %s: %w", c.Task, err)
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
			lc.Version = 0
		}
		have = lc.Version
	}
	if have >= upTo {
		return nil, nil
	}
	rows, err := s.store.Between(ctx, c.Task, have, upTo+1)
	if err != nil {
		return nil, err
	}
	out := make([]*nats.Msg, len(rows))
	for i := range rows {
		out[i] = s.logCopy(&rows[i])
	}
	return out, nil
}

// remember notes the versions whose copies the lane stored.
func (l *lane) remember(logged []*fence.Committed) {
	if len(l.stored)+len(logged) > storedTasksMax {
		clear(l.stored)
	}
	for _, c := range logged {
		if c.Version > l.stored[c.Task] {
			l.stored[c.Task] = c.Version
		}
	}
}
