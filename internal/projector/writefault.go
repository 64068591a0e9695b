package projector

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/projection"
)

// writeFault is what a failed write means for its state.
type writeFault int

const (
	faultTransient writeFault = iota // retry
	faultConflict                    // the key has another revision
	faultTooLarge                    // this value will never be taken
	faultFull                        // the bucket or the server is out of space
)

// classify tells the faults of a write apart by JetStream error code.
func classify(err error) writeFault {
	if errors.Is(err, nats.ErrMaxPayload) {
		return faultTooLarge
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return faultTransient
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return faultConflict
	case jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return faultTooLarge
	case errCodeStoreFailed, errCodeStorageExceeded, errCodeInsufficientResources, errCodeAccountResourcesExceeded:
		return faultFull
	}
	return faultTransient
}

// JetStream error codes (nats-server's jetstream_errors_generated.go) that
// nats.go does not name: a write refused for lack of space.
const (
	// errCodeStoreFailed: the stream refused to store the message; with
	// discard "new" (every KV bucket) it is "maximum bytes exceeded".
	errCodeStoreFailed              jetstream.ErrorCode = 10077
	errCodeStorageExceeded          jetstream.ErrorCode = 10047
	errCodeInsufficientResources    jetstream.ErrorCode = 10023
	errCodeAccountResourcesExceeded jetstream.ErrorCode = 10002
)

// failed handles a write that did not go through; size is the value's size
// and without tells whether it was already the value without data.
func (s *Service) failed(ctx context.Context, st projection.State, size int, without bool, err error, retry map[string]projection.State) {
	task := st.Task
	switch classify(err) {
	case faultConflict:
		if s.resolveConflict(ctx, st) {
			retry[task] = st
		}
	case faultTooLarge:
		if without || size == 0 {
			// Even the value without data is refused: the bucket's
			// max_value_size is absurdly small. Do not wedge on it.
			s.log.Error("bucket refuses even the projection without its data", slog.String("task", task),
				slog.Int("bytes", size), slog.String("error", err.Error()))
			s.hold(st, err)
			return
		}
		// The server's limit is below the estimate: learn it, and write
		// this one (and anything as large) without data.
		s.valueLimit = min(s.valueLimit, size-1)
		retry[task] = st
	case faultFull:
		s.hold(st, err)
	default:
		s.log.Warn("writing a projection failed; retrying", slog.String("task", task), slog.String("error", err.Error()))
		retry[task] = st
	}
}

// hold keeps a state the bucket refused, to write it again later.
func (s *Service) hold(st projection.State, err error) {
	s.metrics.kvRefused.Inc()
	h := s.held[st.Task]
	if h == nil {
		h = &heldTask{delay: s.cfg.RetryMin}
		s.held[st.Task] = h
		s.log.Warn("bucket refused a projection; the task is held and written later", slog.String("task", st.Task),
			slog.Int64("version", st.Version), slog.String("error", err.Error()))
	} else {
		h.delay = min(2*h.delay, s.cfg.RetryMax)
	}
	h.st, h.next = st, time.Now().Add(h.delay)
}

// resolveConflict handles a lost compare-and-set: the key's revision is not
// the one we knew. If the stored value is newer than ours, ours is dropped
// and the task is reloaded from the bucket the next time it is seen. If it
// is the same state, gap included, nothing is left to write. Otherwise ours
// is written again on top of the stored revision: a gap that ours records
// must never be lost to a stored value of the same version without it.
func (s *Service) resolveConflict(ctx context.Context, ours projection.State) (again bool) {
	ctx, cancel := context.WithTimeout(ctx, markTimeout)
	defer cancel()
	task := ours.Task
	entry, err := s.kv.Get(ctx, task)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// Deleted or purged: write over the marker that says so.
		if rev, err := s.lastRevision(ctx, task); err == nil {
			s.revs[task] = rev
		}
		return true
	}
	if err != nil {
		return true
	}
	s.revs[task] = entry.Revision()
	var stored projection.State
	if json.Unmarshal(entry.Value(), &stored) != nil {
		return true
	}
	switch {
	case stored.Version > ours.Version || (stored.Version == ours.Version && stored.Seq > ours.Seq):
		s.engine.Evict(task)
		delete(s.revs, task)
		delete(s.held, task)
		return false
	case stored.Version == ours.Version && stored.Seq == ours.Seq && stored.Gap == nil && ours.Gap == nil:
		return false
	}
	return true
}

// lastRevision is the revision of a key's last entry, a delete marker
// included (kv.Get does not report one), or 0.
func (s *Service) lastRevision(ctx context.Context, task string) (uint64, error) {
	str, err := s.js.Stream(ctx, "KV_"+s.tasks)
	if err != nil {
		return 0, err
	}
	m, err := str.GetLastMsgForSubject(ctx, "$KV."+s.tasks+"."+task)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}
