package fence

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/pkg/canonjson"
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
}

// Committed is an event as the ledger stored it.
type Committed struct {
	Seq       int64
	EventID   string
	Partition int
	Task      string
	Version   int64
	Type      string
	// Payload is the event's JSON: as published for an event committed by
	// this call, as PostgreSQL renders the stored jsonb for an earlier one.
	// The two are equal as JSON values, not necessarily as bytes.
	Payload     []byte
	Holder      string
	Generation  int64
	CommittedAt time.Time
}

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
	res := make([]Result, len(events))
	b := s.prepare(events, res)
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
		err = s.appendOnce(ctx, b, res)
		if err == nil {
			return res, nil
		}
		code := sqlState(err)
		switch {
		case errors.Is(err, errRetryBatch):
		case code == pgerrcode.UniqueViolation:
			// An event hit a stored key the optimistic read did not look up
			// (an id reused under another task, a head moved on by another
			// process, or a concurrent writer won the race): the next attempt
			// reads every head from the database and looks every event up.
			b.fullLookup = true
			s.forgetHeads(b)
		case code == pgerrcode.DeadlockDetected, code == pgerrcode.SerializationFailure:
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
			heads[e.Task] = taskHead{partition: e.Partition, version: e.Version}
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
	// canon holds the canonical form of payloads compared so far.
	canon map[int][]byte
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
	case !wire.ValidID(e.Holder):
		return wire.ReasonBadHolder, fmt.Sprintf("holder %q is not 1..128 of [A-Za-z0-9_-]", e.Holder)
	case !wire.ValidType(e.Type):
		return wire.ReasonBadType, fmt.Sprintf("type %q is not 1..64 of [A-Za-z0-9_.:-]", e.Type)
	case e.Version < 1:
		return wire.ReasonBadVersion, fmt.Sprintf("version %d is below 1", e.Version)
	case e.Generation < 1:
		return wire.ReasonBadGeneration, fmt.Sprintf("generation %d is below 1", e.Generation)
	}
	return "", ""
}

type leaseState struct {
	holder string
	gen    int64
	valid  bool
}

type taskHead struct {
	partition int
	version   int64
}

// stored is a committed row that shares a key with a batch event.
type stored struct {
	c           Committed
	samePayload bool
}

// existing holds, per position in batch.order, the rows found by event id
// and by (task, version), and whether the event was looked up at all.
type existing struct {
	byID, byTV *stored
	looked     bool
}

type plan struct {
	commits []int       // events to insert, in order
	follows map[int]int // event → the planned commit it duplicates
	rejects []int       // events that get a new rejections row
	// unchecked is set when an event that does not commit was decided
	// without a lookup of its id.
	unchecked bool
}

func (s *Store) appendOnce(ctx context.Context, b *batch, res []Result) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer endTx(ctx, conn)

	p, err := s.decide(ctx, conn, b, res)
	if err != nil {
		return err
	}
	if s.beforeWrite != nil {
		s.beforeWrite()
	}
	// Round trip 2: the fenced insert, the rejections and COMMIT.
	inserted, err := s.write(ctx, conn, b, p, res)
	if err != nil {
		// Whether COMMIT happened may be unknown (the connection broke):
		// the heads this batch would have moved are read again next time.
		s.forgetHeads(b)
		if sqlState(err) == sqlStateFenceCheck {
			// A lease expired between the read and the insert: the fence
			// held, and the next attempt reads the lease as expired.
			return errRetryBatch
		}
		return err
	}
	s.rememberHeads(b, p.commits)
	for _, i := range p.commits {
		c := inserted[b.events[i].ID]
		res[i].Verdict, res[i].Seq, res[i].Committed = wire.VerdictCommitted, c.Seq, c
	}
	for i, j := range p.follows {
		res[i].Verdict, res[i].Seq, res[i].Committed = wire.VerdictDuplicate, res[j].Seq, res[j].Committed
	}
	return nil
}

// sqlStateFenceCheck is raised by ledger.fence_check (migration 00003).
const sqlStateFenceCheck = "LF001" // the ledger's own; pgerrcode has no name for it

// endTx rolls back whatever transaction an append left open on conn (after
// an error; a committed append leaves none) and returns conn to the pool. A
// connection whose rollback fails is closed, and the pool drops it.
func endTx(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() != 'I' && !conn.Conn().IsClosed() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "rollback"); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}
	conn.Release()
}

// txStep says how readState begins: a new transaction, the same one, or a
// new one after rolling back the current one.
type txStep int

const (
	txBegin txStep = iota
	txContinue
	txRestart
)

// decide reads the state the batch depends on and classifies every event.
// Round trip 1 begins the transaction, bounds it (Config), locks the leases
// and reads the heads and the recorded verdicts; the lookup of existing rows
// (usually none) takes a second. It reads again when the first reading
// calls for it: with every event looked up when an event that will not
// commit was decided without its lookup, and under FOR UPDATE lease locks,
// in a new transaction, when the batch will record a rejection. Each flag
// only ever turns on, so there are at most three readings.
func (s *Store) decide(ctx context.Context, conn *pgxpool.Conn, b *batch, res []Result) (plan, error) {
	step := txBegin
	for {
		st, err := s.readState(ctx, conn, b, step)
		if err != nil {
			return plan{}, err
		}
		p, err := s.classify(b, st, res)
		if err != nil {
			return plan{}, err
		}
		switch {
		case p.unchecked && !b.fullLookup:
			// An event that will not commit was decided without looking up
			// its id, or from a cached head: a committed id reused under it,
			// or a head another process moved on, would be missed. Read every
			// head from the database, look every event up, and decide again.
			b.fullLookup = true
			step = txContinue
		case len(p.rejects) > 0 && !b.exclusive && !s.sharedRejections:
			// A rejection is final (doc.go, Finality): no other append may
			// decide the same events between this reading and the commit.
			// The shared locks are given up rather than upgraded, so two
			// such batches queue instead of deadlocking.
			b.exclusive = true
			step = txRestart
		default:
			return p, nil
		}
	}
}

// state is what classify decides from.
type state struct {
	leases   map[int]leaseState
	heads    map[string]taskHead
	existing []existing
	recorded map[string]recorded
}

// recorded is the verdict ledger.rejections holds for an event id.
type recorded struct {
	verdict wire.Verdict
	reason  string
}

// readState locks the batch's leases and reads the heads of its tasks and
// the verdicts recorded for its event ids in one pipelined round trip (which
// begins the transaction unless step is txContinue), then reads the
// existing rows the batch may collide with (usually none).
func (s *Store) readState(ctx context.Context, conn *pgxpool.Conn, b *batch, step txStep) (state, error) {
	var partitions []int32
	var tasks, ids []string
	seenP, seenT, seenID := map[int]bool{}, map[string]bool{}, map[string]bool{}
	for _, i := range b.order {
		e := &b.events[i]
		if !seenP[e.Partition] {
			seenP[e.Partition] = true
			partitions = append(partitions, int32(e.Partition))
		}
		if !seenT[e.Task] {
			seenT[e.Task] = true
			tasks = append(tasks, e.Task)
		}
		if !seenID[e.ID] {
			seenID[e.ID] = true
			ids = append(ids, e.ID)
		}
	}

	st := state{heads: make(map[string]taskHead, len(tasks)), leases: make(map[int]leaseState, len(partitions)),
		recorded: map[string]recorded{}}
	if s.heads != nil && !b.fullLookup {
		tasks = s.heads.lookup(tasks, st.heads)
	}
	pb := &pgx.Batch{}
	if step == txRestart {
		pb.Queue("rollback")
	}
	if step != txContinue {
		pb.Queue("begin")
		pb.Queue(sqlSetTimeouts, ms(s.cfg.StatementTimeout), ms(s.cfg.IdleInTransactionTimeout))
	}
	if !s.unfenced {
		lock := sqlAppendLockLeases
		if b.exclusive {
			lock = sqlAppendLockLeasesExclusive
		}
		pb.Queue(lock, partitions)
	}
	if len(tasks) > 0 {
		pb.Queue(sqlAppendHeads, tasks)
	}
	pb.Queue(sqlAppendRecorded, ids)
	br := conn.SendBatch(ctx, pb)
	defer br.Close()
	if step == txRestart {
		if _, err := br.Exec(); err != nil {
			return st, fmt.Errorf("roll back to lock exclusively: %w", err)
		}
	}
	if step != txContinue {
		if _, err := br.Exec(); err != nil {
			return st, fmt.Errorf("begin: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return st, fmt.Errorf("set timeouts: %w", err)
		}
	}
	if !s.unfenced {
		rows, _ := br.Query()
		var p int
		var l leaseState
		if _, err := pgx.ForEachRow(rows, []any{&p, &l.holder, &l.gen, &l.valid}, func() error {
			st.leases[p] = l
			return nil
		}); err != nil {
			return st, fmt.Errorf("lock leases: %w", err)
		}
	}
	if len(tasks) > 0 {
		rows, _ := br.Query()
		var task string
		var h taskHead
		if _, err := pgx.ForEachRow(rows, []any{&task, &h.partition, &h.version}, func() error {
			st.heads[task] = h
			return nil
		}); err != nil {
			return st, fmt.Errorf("read heads: %w", err)
		}
	}
	rows, _ := br.Query()
	var id string
	var rec recorded
	if _, err := pgx.ForEachRow(rows, []any{&id, &rec.verdict, &rec.reason}, func() error {
		st.recorded[id] = rec
		return nil
	}); err != nil {
		return st, fmt.Errorf("read recorded verdicts: %w", err)
	}
	if err := br.Close(); err != nil {
		return st, err
	}
	var err error
	st.existing, err = s.readExisting(ctx, conn, b, st.heads)
	return st, err
}

// readExisting looks up the stored rows that share an event id or a (task,
// version) with the events that can collide with one.
func (s *Store) readExisting(ctx context.Context, conn *pgxpool.Conn, b *batch, heads map[string]taskHead) ([]existing, error) {
	ex := make([]existing, len(b.order))
	var pos []int // positions in b.order that are looked up
	for k, i := range b.order {
		if b.fullLookup || b.events[i].Version <= heads[b.events[i].Task].version {
			pos = append(pos, k)
			ex[k].looked = true
		}
	}
	if len(pos) == 0 {
		return ex, nil
	}
	ids, tasks, versions, payloads := make([]string, len(pos)), make([]string, len(pos)), make([]int64, len(pos)), make([]string, len(pos))
	for n, k := range pos {
		e := &b.events[b.order[k]]
		ids[n], tasks[n], versions[n], payloads[n] = e.ID, e.Task, e.Version, b.payloads[b.order[k]]
	}
	rows, err := conn.Query(ctx, sqlAppendExisting, ids, tasks, versions, payloads)
	if err != nil {
		return nil, fmt.Errorf("read existing events: %w", err)
	}
	var ord int64
	var byID bool
	var st stored
	var payload string
	_, err = pgx.ForEachRow(rows, []any{&ord, &byID, &st.c.Seq, &st.c.EventID, &st.c.Partition, &st.c.Task,
		&st.c.Version, &st.c.Type, &payload, &st.c.Holder, &st.c.Generation, &st.c.CommittedAt, &st.samePayload},
		func() error {
			row := st
			row.c.Payload = []byte(payload)
			if byID {
				ex[pos[ord-1]].byID = &row
			} else {
				ex[pos[ord-1]].byTV = &row
			}
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read existing events: %w", err)
	}
	return ex, nil
}

// classify decides every valid event in the contract's order of checks. It
// does no I/O; later events see the batch's earlier planned commits.
func (s *Store) classify(b *batch, st state, res []Result) (plan, error) {
	heads, leases, ex := maps.Clone(st.heads), st.leases, st.existing
	type key struct {
		task    string
		version int64
	}
	p := plan{follows: map[int]int{}}
	plannedID := map[string]int{}
	plannedTV := map[key]int{}
	rejectedID := map[string]int{} // event id → the first event of the batch given a new rejection

	for k, i := range b.order {
		e := &b.events[i]
		r := &res[i]
		h, known := heads[e.Task]
		l, leased := leases[e.Partition]
		*r = Result{CurrentGeneration: l.gen, CurrentHolder: l.holder}
		x := ex[k]
		jID, inID := plannedID[e.ID]
		jTV, inTV := plannedTV[key{e.Task, e.Version}]
		rec, hasRec := st.recorded[e.ID]
		jRej, inRej := rejectedID[e.ID]

		switch {
		// Finality: an id that is not committed but has a verdict keeps it.
		// A committed id is answered below as before (committed wins).
		case x.byID == nil && !inID && hasRec:
			r.Verdict, r.Reason, r.Repeat = rec.verdict, rec.reason, true
		case x.byID == nil && !inID && inRej:
			r.Verdict, r.Reason, r.Repeat = res[jRej].Verdict, res[jRej].Reason, true
		case known && h.partition != e.Partition:
			r.Verdict, r.Reason = wire.VerdictInvalid, wire.ReasonWrongPartition
			r.Detail = fmt.Sprintf("task %s is pinned to partition %d", e.Task, h.partition)
		case x.byID != nil && sameStored(x.byID, e):
			r.Verdict, r.Reason, r.Seq, r.Committed = wire.VerdictDuplicate, wire.ReasonSameEventID, x.byID.c.Seq, &x.byID.c
		case x.byTV != nil && x.byTV.c.Type == e.Type && x.byTV.samePayload:
			r.Verdict, r.Reason, r.Seq, r.Committed = wire.VerdictDuplicate, wire.ReasonSameContent, x.byTV.c.Seq, &x.byTV.c
		case inID && sameEvent(b, jID, i):
			r.Reason, p.follows[i] = wire.ReasonSameEventID, jID
		case inTV && sameContent(b, jTV, i):
			r.Reason, p.follows[i] = wire.ReasonSameContent, jTV
		case !s.unfenced && staleReason(leased, l, e) != "":
			r.Verdict, r.Reason = wire.VerdictStale, staleReason(leased, l, e)
			p.rejects = append(p.rejects, i)
		case x.byID != nil || inID:
			r.Verdict, r.Reason = wire.VerdictConflict, wire.ReasonEventIDReused
			p.rejects = append(p.rejects, i)
		case x.byTV != nil || inTV:
			r.Verdict, r.Reason = wire.VerdictConflict, wire.ReasonVersionTaken
			p.rejects = append(p.rejects, i)
		case e.Version > h.version+int64(s.cfg.MaxAhead):
			r.Verdict, r.Reason = wire.VerdictGap, wire.ReasonTooFarAhead
			p.rejects = append(p.rejects, i)
		case e.Version > h.version+1 && e.Final:
			r.Verdict, r.Reason = wire.VerdictGap, cmp.Or(e.GapReason, wire.ReasonGapTimeout)
			p.rejects = append(p.rejects, i)
		case e.Version > h.version+1:
			r.Verdict = NotYet
		case e.Version <= h.version:
			// The head says the version is committed but its row was not
			// found: the reads straddled another writer's commit.
			return p, errRetryBatch
		default:
			p.commits = append(p.commits, i)
			heads[e.Task] = taskHead{partition: e.Partition, version: e.Version}
			plannedID[e.ID] = i
			plannedTV[key{e.Task, e.Version}] = i
			continue
		}
		if len(p.rejects) > 0 && p.rejects[len(p.rejects)-1] == i {
			if _, ok := rejectedID[e.ID]; !ok {
				rejectedID[e.ID] = i
			}
		}
		if !x.looked {
			p.unchecked = true
		}
	}
	return p, nil
}

// staleReason is the fence as classification sees it; the insert checks the
// same predicate again against the locked lease row.
func staleReason(leased bool, l leaseState, e *Event) string {
	switch {
	case !leased:
		return wire.ReasonNoLease
	case e.Generation < l.gen:
		return wire.ReasonSuperseded
	case e.Holder != l.holder || e.Generation != l.gen:
		return wire.ReasonNotHolder
	case !l.valid:
		return wire.ReasonLeaseExpired
	}
	return ""
}

func sameStored(st *stored, e *Event) bool {
	return st.c.Task == e.Task && st.c.Version == e.Version && st.c.Type == e.Type &&
		st.c.Partition == e.Partition && st.samePayload
}

func sameEvent(b *batch, j, i int) bool {
	return b.events[j].Task == b.events[i].Task && b.events[j].Version == b.events[i].Version &&
		b.events[j].Partition == b.events[i].Partition && sameContent(b, j, i)
}

func sameContent(b *batch, j, i int) bool {
	return b.events[j].Type == b.events[i].Type && bytes.Equal(b.canonical(j), b.canonical(i))
}

// canonical returns the canonical form of event i's payload (package
// canonjson), whose bytes are equal exactly when the payloads are equal as
// jsonb values; the work is linear in the payload, whatever its numbers.
func (b *batch) canonical(i int) []byte {
	if c, ok := b.canon[i]; ok {
		return c
	}
	c, err := canonjson.Append(nil, []byte(b.payloads[i]))
	if err != nil {
		// Unreachable: normalizePayload let only valid JSON through. Were it
		// reached, the payload would equal no other.
		c = append([]byte{0}, b.payloads[i]...)
	}
	if b.canon == nil {
		b.canon = map[int][]byte{}
	}
	b.canon[i] = c
	return c
}

// write sends, in one pipelined round trip, the fenced insert of the
// batch's commits, its rejections and COMMIT, and returns the inserted rows
// by event id. An error means the transaction did not commit, or (an error
// from the connection itself) that it is unknown whether it did.
func (s *Store) write(ctx context.Context, conn *pgxpool.Conn, b *batch, p plan, res []Result) (map[string]*Committed, error) {
	pb := &pgx.Batch{}
	if len(p.commits) > 0 {
		queueInsert(pb, b, p.commits, s.unfenced)
	}
	if len(p.rejects) > 0 {
		queueRejections(pb, b, p.rejects, res)
	}
	pb.Queue("commit")
	br := conn.SendBatch(ctx, pb)
	defer br.Close()

	var out map[string]*Committed
	if len(p.commits) > 0 {
		var err error
		if out, err = readInserted(br, b, p.commits); err != nil {
			return nil, err
		}
	}
	if len(p.rejects) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("record rejections: %w", err)
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		return nil, errors.New("fence: the append's transaction is still open after COMMIT")
	}
	return out, nil
}

// queueInsert queues the fenced insert of the commits.
func queueInsert(pb *pgx.Batch, b *batch, commits []int, unfenced bool) {
	n := len(commits)
	ids, tasks, types, payloads, holders := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	partitions, versions, gens := make([]int32, n), make([]int64, n), make([]int64, n)
	for k, i := range commits {
		e := &b.events[i]
		ids[k], tasks[k], types[k], payloads[k], holders[k] = e.ID, e.Task, e.Type, b.payloads[i], e.Holder
		partitions[k], versions[k], gens[k] = int32(e.Partition), e.Version, e.Generation
	}
	sql := sqlAppendInsert
	if unfenced {
		sql = sqlAppendInsertUnfenced
	}
	pb.Queue(sql, ids, partitions, tasks, versions, types, payloads, holders, gens, int64(n))
}

// readInserted reads the rows the fenced insert returned.
func readInserted(br pgx.BatchResults, b *batch, commits []int) (map[string]*Committed, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	byID := make(map[string]int, len(commits))
	for _, i := range commits {
		byID[b.events[i].ID] = i
	}
	out := make(map[string]*Committed, len(commits))
	var id string
	var seq int64
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &seq, &at}, func() error {
		i, ok := byID[id]
		if !ok {
			return fmt.Errorf("fence: the insert returned event %q, which the batch does not hold", id)
		}
		e := &b.events[i]
		out[id] = &Committed{Seq: seq, EventID: id, Partition: e.Partition, Task: e.Task, Version: e.Version,
			Type: e.Type, Payload: []byte(b.payloads[i]), Holder: e.Holder, Generation: e.Generation, CommittedAt: at}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) != len(commits) {
		// ledger.fence_check makes this unreachable. Were it reached, the
		// COMMIT already sent would keep rows that all passed the fence, and
		// the batch's next attempt would find them as duplicates.
		return nil, fmt.Errorf("fence: %d of %d events inserted", len(out), len(commits))
	}
	return out, nil
}

// queueRejections queues the rows of ledger.rejections for the rejects.
func queueRejections(pb *pgx.Batch, b *batch, rejects []int, res []Result) {
	n := len(rejects)
	ids, tasks, holders, verdicts, reasons := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	partitions, versions, gens := make([]int32, n), make([]int64, n), make([]int64, n)
	current := make([]*int64, n)
	for k, i := range rejects {
		e, r := &b.events[i], &res[i]
		ids[k], tasks[k], holders[k], verdicts[k], reasons[k] = e.ID, e.Task, e.Holder, string(r.Verdict), r.Reason
		partitions[k], versions[k], gens[k] = int32(e.Partition), e.Version, e.Generation
		if r.CurrentGeneration > 0 {
			g := r.CurrentGeneration
			current[k] = &g
		}
	}
	pb.Queue(sqlAppendRejections, ids, partitions, tasks, versions, holders, gens, verdicts, reasons, current)
}

// isolate finds the events whose own rows PostgreSQL refuses, marks them
// invalid and removes them from the batch, and returns how many it found.
// It inserts the batch's rows without fence or lookups under a savepoint,
// and on a data error (isDataError) splits the set in two and tries each
// half, so k bad events of n cost about 2k·log2(n) probes; the transaction
// is always rolled back, so nothing is written. An error that is not a
// data error stops the search: it is returned, and no event is blamed.
func (s *Store) isolate(ctx context.Context, b *batch, res []Result) (int, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer endTx(ctx, conn)
	if _, err := conn.Exec(ctx, "begin"); err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	if _, err := conn.Exec(ctx, sqlSetTimeouts, ms(s.cfg.StatementTimeout), ms(s.cfg.IdleInTransactionTimeout)); err != nil {
		return 0, fmt.Errorf("set timeouts: %w", err)
	}
	bad := map[int]*pgconn.PgError{}
	var probe func(set []int) error
	probe = func(set []int) error {
		if _, err := conn.Exec(ctx, "savepoint probe"); err != nil {
			return err
		}
		_, perr := conn.Exec(ctx, sqlProbeInsert, probeArgs(b, set)...)
		if _, err := conn.Exec(ctx, "rollback to savepoint probe"); err != nil {
			return err
		}
		var pgErr *pgconn.PgError
		switch {
		case perr == nil:
			return nil
		case !errors.As(perr, &pgErr) || !isDataError(pgErr.Code):
			return perr
		case len(set) == 1:
			bad[set[0]] = pgErr
			return nil
		}
		half := len(set) / 2
		if err := probe(set[:half]); err != nil {
			return err
		}
		return probe(set[half:])
	}
	if err := probe(slices.Clone(b.order)); err != nil {
		return 0, err
	}
	keep := b.order[:0]
	for _, i := range b.order {
		if pgErr, ok := bad[i]; ok {
			res[i] = Result{Verdict: wire.VerdictInvalid, Reason: wire.ReasonBadPayload,
				Detail: fmt.Sprintf("PostgreSQL refused the event (SQLSTATE %s): %s", pgErr.Code, pgErr.Message)}
			continue
		}
		keep = append(keep, i)
	}
	b.order = keep
	return len(bad), nil
}

// probeArgs are the arguments of sqlProbeInsert for the events set.
func probeArgs(b *batch, set []int) []any {
	n := len(set)
	ids, tasks, types, payloads, holders := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	partitions, versions, gens := make([]int32, n), make([]int64, n), make([]int64, n)
	for k, i := range set {
		e := &b.events[i]
		ids[k], tasks[k], types[k], payloads[k], holders[k] = e.ID, e.Task, e.Type, b.payloads[i], e.Holder
		partitions[k], versions[k], gens[k] = int32(e.Partition), e.Version, e.Generation
	}
	return []any{ids, partitions, tasks, versions, types, payloads, holders, gens}
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
