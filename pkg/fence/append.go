package fence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"

	"github.com/flowness/ledger/pkg/wire"
)

// NotYet is the one outcome of Append that is not a contract verdict: the
// event's version is ahead of its task's head + 1 and its gap window is still
// open. Nothing was written; the caller offers the event again later, with
// Final set once the window has closed.
const NotYet wire.Verdict = "not_yet"

// Event is one generation-tagged event to append.
type Event struct {
	// ID is the event id, a ULID: the idempotency key.
	ID        string
	Partition int
	Task      string
	Version   int64
	Type      string
	// Payload is raw JSON; empty means null.
	Payload    []byte
	Holder     string
	Generation int64
	// Final marks an event whose gap window has closed: if its version is
	// still ahead of head + 1 it gets the gap verdict instead of NotYet.
	Final bool
	// GapReason is the reason of that gap verdict; default gap_timeout.
	GapReason string
	// Snapshot marks an event of a snapshot task (wire.KindSnapshot): its
	// version must rise above the task's head, and need not be head + 1.
	// The first committed event of a task pins its kind; an event of the
	// other kind is invalid (wrong_kind).
	Snapshot bool
}

// Committed is an event as the ledger stored it: exactly what its
// LEDGER_LOG copy carries. Its Payload is the event's JSON as published
// for an event committed by this call, as PostgreSQL renders the stored
// jsonb for an earlier one; the two are equal as JSON values, not
// necessarily as bytes.
type Committed = wire.LogCopy

// Result is the outcome of one event of an Append.
type Result struct {
	// Verdict is a contract verdict or NotYet.
	Verdict wire.Verdict
	// Reason qualifies the verdict (wire.Reason*); empty for committed.
	Reason string
	// Detail says in words what was wrong, for invalid events.
	Detail string
	// Seq is the event's position in the log (committed), or the original's
	// (duplicate).
	Seq int64
	// CurrentGeneration and CurrentHolder describe the partition's lease as
	// the append saw it (zero if the partition was never leased).
	CurrentGeneration int64
	CurrentHolder     string
	// Committed is the stored copy, for committed and duplicate.
	Committed *Committed
	// FenceMode is the partition's effective fence mode when the event
	// was decided: ModeEnforce or ModeObserve (modes.go).
	FenceMode string
	// WouldReject, on a commit under ModeObserve, is what ModeEnforce
	// would have answered instead, as "stale/<reason>"; empty otherwise.
	WouldReject string
	// Repeat is set when Verdict and Reason are the ones an earlier append
	// recorded for this event id (ledger.rejections), or an earlier event of
	// this batch with the same id got: an event id has one final verdict,
	// so another copy gets it again, whatever its content or stamp, and
	// nothing more is written.
	Repeat bool
}

const maxAttempts = 8

// errRetryBatch asks Append to run the batch again from the start: the
// fenced insert refused rows whose lease expired after it was read, or the
// reads raced with another writer.
var errRetryBatch = errors.New("fence: batch raced, retrying")

// Append decides every event and commits the committed ones, in one
// transaction: see the package documentation for the checks and invariants.
// It returns one Result per event, in input order. An error means nothing of
// the batch was written (or, if the error came from COMMIT itself, that it is
// unknown whether it was: running the batch again is always safe, as every
// event is idempotent); IsTransient tells whether to retry.
func (s *Store) Append(ctx context.Context, events []Event) ([]Result, error) {
	return s.appendBatch(ctx, nil, events)
}

// appendBatch is Append, under claims when c is not nil (AppendClaimed).
func (s *Store) appendBatch(ctx context.Context, c *Claims, events []Event) ([]Result, error) {
	res := make([]Result, len(events))
	b := s.prepare(events, res)
	b.claims, b.noClaimCheck = c, s.hooks.noClaimCheck
	if len(b.order) == 0 {
		return res, nil
	}
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			if werr := sleepCtx(ctx, time.Duration(attempt)*time.Millisecond); werr != nil {
				return nil, werr
			}
		}
		err = s.appendAttempt(ctx, b, res)
		if err == nil {
			return res, nil
		}
		code := sqlState(err)
		switch {
		case code == sqlStateClaimCheck:
			return nil, fmt.Errorf("%w: append %d events: %w", ErrNotClaimed, len(events), err)
		case code == sqlStatePrimaryCheck:
			return nil, fmt.Errorf("%w: append %d events: %w", ErrSupersededPrimary, len(events), err)
		case code == sqlStateUnwitnessed:
			// A newer primary than the witness knows: once it records it,
			// the batch runs again.
			if ok, lerr := s.learnTimeline(ctx, err); !ok {
				return nil, fmt.Errorf("fence: append %d events: %w", len(events), errors.Join(err, lerr))
			}
		case errors.Is(err, errRetryBatch):
		case code == pgerrcode.UniqueViolation:
			// An event hit a stored key the optimistic read did not look up
			// (an id reused under another task, a head moved on by another
			// process, or a concurrent writer won the race): the next attempt
			// reads every head from the database and looks every event up.
			b.fullLookup = true
			s.forgetHeads(b)
		case code == pgerrcode.DeadlockDetected, code == pgerrcode.SerializationFailure:
		case isNoPartition(err) && !s.hooks.noPartitionKeeping:
			// The partitions ran out (making them in the background failed):
			// make them now. A fault of the deployment, never a verdict.
			if _, _, perr := s.parts.ensure(ctx, 0); perr != nil {
				return nil, fmt.Errorf("fence: append %d events: %w (%w)", len(events), err, perr)
			}
		case code == "" || IsTransient(err) || !isDataError(code):
			// Transient: the caller retries. A fault of the database or the
			// deployment (privileges, schema): no event is to blame, and it
			// must not become anyone's verdict.
			return nil, fmt.Errorf("fence: append %d events: %w", len(events), err)
		default:
			// PostgreSQL refused something of the batch's data: find the
			// events it came from, make them invalid, and run the rest.
			n, ierr := s.isolate(ctx, b, res)
			if ierr != nil {
				return nil, fmt.Errorf("fence: append %d events: %w (finding the event it came from: %v)", len(events), err, ierr)
			}
			if n == 0 {
				return nil, fmt.Errorf("fence: append %d events: %w (no event of the batch reproduces it on its own)", len(events), err)
			}
			if len(b.order) == 0 {
				return res, nil
			}
		}
	}
	return nil, fmt.Errorf("fence: append %d events: still racing after %d attempts: %w", len(events), maxAttempts, err)
}

// isDataError reports whether SQLSTATE code blames the data of a statement
// rather than the database or the deployment: data exceptions (class 22,
// such as a number out of range or an untranslatable character),
// integrity constraint violations (23), program limits (54, such as a
// value too large to render or a statement too complex), and exceptions
// raised by PL/pgSQL (P0, such as a trigger refusing a row).
func isDataError(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "22", "23", "54", "P0":
		return true
	}
	return false
}

// rememberHeads caches the heads the batch committed.
func (s *Store) rememberHeads(b *batch, commits []int) {
	if s.heads == nil || len(commits) == 0 {
		return
	}
	heads := make(map[string]taskHead, len(commits))
	for _, i := range commits {
		e := &b.events[i]
		if e.Version > heads[e.Task].version {
			// Only the owner's events commit (classify), or any principal's
			// on a task that has none: caching the committer as the owner
			// can cost such a task a careful rereading, never a verdict.
			heads[e.Task] = taskHead{partition: e.Partition, version: e.Version, owner: wire.Principal(e.Holder),
				snapshot: e.Snapshot}
		}
	}
	s.heads.raise(heads)
}

// forgetHeads drops the batch's tasks from the cache after a failure that
// leaves their heads in doubt.
func (s *Store) forgetHeads(b *batch) {
	if s.heads == nil {
		return
	}
	tasks := make([]string, 0, len(b.order))
	for _, i := range b.order {
		tasks = append(tasks, b.events[i].Task)
	}
	s.heads.forget(tasks)
}

// batch is the validated part of an Append.
type batch struct {
	events   []Event
	payloads []string // normalised payload of each event
	order    []int    // valid events, by (task, version, input position)
	// fullLookup makes readState look up every event by id and (task,
	// version), not only those at or below their head. It is set after an
	// insert skipped a row on a unique key.
	fullLookup bool
	// exclusive makes readState lock the batch's lease rows FOR UPDATE
	// instead of FOR KEY SHARE. It is set once the batch is found to record
	// a rejection.
	exclusive bool
	// careful keeps the batch off the fast path (fast.go): set once a
	// prediction of its outcome missed.
	careful bool
	// claims, when set, are the ingest claims the batch is appended under
	// (AppendClaimed).
	claims       *Claims
	noClaimCheck bool
	// primaryCheck and timeline are the check of this attempt's server's
	// WAL timeline (none if ""); set per attempt from Config.Primary.
	primaryCheck string
	timeline     int64
	// keyCache holds keys(), the batch's distinct partitions, tasks and ids.
	keyCache *batchKeys
	// canon holds the canonical form of payloads compared so far.
	canon map[int][]byte
	// locked are the leases the fast path read under their locks: the
	// fence modes its results report.
	locked map[int]leaseState
}

// batchKeys are a batch's distinct partitions, tasks and event ids.
type batchKeys struct {
	partitions []int32
	tasks, ids []string
}

func (s *Store) prepare(events []Event, res []Result) *batch {
	b := &batch{events: events, payloads: make([]string, len(events))}
	for i := range events {
		e := &events[i]
		reason, detail := s.validate(e)
		if reason == "" {
			p, err := normalizePayload(e.Payload, s.cfg.MaxPayload)
			switch {
			case err != nil && len(e.Payload) > s.cfg.MaxPayload:
				reason, detail = wire.ReasonPayloadTooLarge, err.Error()
			case err != nil:
				reason, detail = wire.ReasonBadPayload, err.Error()
			default:
				b.payloads[i] = string(p)
			}
		}
		if reason != "" {
			res[i] = Result{Verdict: wire.VerdictInvalid, Reason: reason, Detail: detail}
			continue
		}
		b.order = append(b.order, i)
	}
	slices.SortStableFunc(b.order, func(x, y int) int {
		ex, ey := &events[x], &events[y]
		if c := strings.Compare(ex.Task, ey.Task); c != 0 {
			return c
		}
		if ex.Version != ey.Version {
			if ex.Version < ey.Version {
				return -1
			}
			return 1
		}
		return x - y
	})
	return b
}

func (s *Store) validate(e *Event) (reason, detail string) {
	switch {
	case e.ID == "":
		return wire.ReasonMissingEventID, "event id is empty"
	case !wire.ValidEventID(e.ID):
		return wire.ReasonBadEventID, fmt.Sprintf("event id %q is not a ULID", e.ID)
	case e.Partition < 0 || e.Partition >= s.cfg.Partitions:
		return wire.ReasonBadPartition, fmt.Sprintf("partition %d is outside [0, %d)", e.Partition, s.cfg.Partitions)
	case !wire.ValidID(e.Task):
		return wire.ReasonBadTask, fmt.Sprintf("task id %q is not 1..128 of [A-Za-z0-9_-]", e.Task)
	case !wire.ValidHolder(e.Holder):
		return wire.ReasonBadHolder, fmt.Sprintf("holder %q is not <principal>.<instance>, each 1..64 of [A-Za-z0-9_-]", e.Holder)
	case !wire.ValidType(e.Type):
		return wire.ReasonBadType, fmt.Sprintf("type %q is not 1..64 of [A-Za-z0-9_.:-]", e.Type)
	case e.Version < 1:
		return wire.ReasonBadVersion, fmt.Sprintf("version %d is below 1", e.Version)
	case e.Generation < 1:
		return wire.ReasonBadGeneration, fmt.Sprintf("generation %d is below 1", e.Generation)
	}
	return "", ""
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// appendAttempt is appendOnce bounded by Config.AttemptTimeout: an attempt
// the database does not answer in time fails with ErrNoAnswer, whatever
// state its connection is in (mid-session or still connecting).
func (s *Store) appendAttempt(ctx context.Context, b *batch, res []Result) error {
	if s.cfg.AttemptTimeout <= 0 {
		return s.appendOnce(ctx, b, res)
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.AttemptTimeout)
	defer cancel()
	err := s.appendOnce(actx, b, res)
	// A deadline the caller did not set is this attempt's, or the connect
	// timeout of a fresh connection the pool opened for it: either way the
	// database did not answer.
	if err != nil && ctx.Err() == nil && (actx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("%w within %v: %w", ErrNoAnswer, s.cfg.AttemptTimeout, err)
	}
	return err
}
