package fence

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
		switch {
		case errors.Is(err, errRetryBatch):
		case sqlState(err) == "23505":
			// An event hit a stored key the optimistic read did not look up
			// (an id reused under another task, a head moved on by another
			// process, or a concurrent writer won the race): the next attempt
			// reads every head from the database and looks every event up.
			b.fullLookup = true
			s.forgetHeads(b)
		case sqlState(err) == "40P01", sqlState(err) == "40001":
		case strings.HasPrefix(sqlState(err), "22") || sqlState(err) == "54001":
			// A payload that passed the Go checks still failed PostgreSQL.
			if n, ierr := s.isolateBadPayloads(ctx, b, res); ierr != nil || n == 0 {
				return nil, fmt.Errorf("fence: append: %w", err)
			}
			if len(b.order) == 0 {
				return res, nil
			}
		default:
			return nil, fmt.Errorf("fence: append %d events: %w", len(events), err)
		}
	}
	return nil, fmt.Errorf("fence: append %d events: still racing after %d attempts: %w", len(events), maxAttempts, err)
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
	rejects []int       // events with a rejections row
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

	// Round trip 1: BEGIN, lock the leases, read the heads.
	leases, heads, ex, err := s.readState(ctx, conn, b, true)
	if err != nil {
		return err
	}
	p, err := s.classify(b, leases, heads, ex, res)
	if err != nil {
		return err
	}
	if p.unchecked && !b.fullLookup {
		// An event that will not commit was decided without looking up its
		// id, or from a cached head: a committed id reused under it, or a
		// head another process moved on, would be missed. Read every head
		// from the database, look every event up, and decide again.
		b.fullLookup = true
		if leases, heads, ex, err = s.readState(ctx, conn, b, false); err != nil {
			return err
		}
		if p, err = s.classify(b, leases, heads, ex, res); err != nil {
			return err
		}
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
const sqlStateFenceCheck = "LF001"

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

// readState locks the batch's leases and reads the heads of its tasks in one
// pipelined round trip (which begins the transaction when begin is set),
// then reads the existing rows the batch may collide with (usually none).
func (s *Store) readState(ctx context.Context, conn *pgxpool.Conn, b *batch, begin bool) (map[int]leaseState, map[string]taskHead, []existing, error) {
	var partitions []int32
	var tasks []string
	seenP, seenT := map[int]bool{}, map[string]bool{}
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
	}

	heads := make(map[string]taskHead, len(tasks))
	if s.heads != nil && !b.fullLookup {
		tasks = s.heads.lookup(tasks, heads)
	}
	pb := &pgx.Batch{}
	if begin {
		pb.Queue("begin")
	}
	if !s.unfenced {
		pb.Queue(sqlAppendLockLeases, partitions)
	}
	if len(tasks) > 0 {
		pb.Queue(sqlAppendHeads, tasks)
	}
	br := conn.SendBatch(ctx, pb)
	defer br.Close()
	if begin {
		if _, err := br.Exec(); err != nil {
			return nil, nil, nil, fmt.Errorf("begin: %w", err)
		}
	}

	leases := make(map[int]leaseState, len(partitions))
	if !s.unfenced {
		rows, _ := br.Query()
		var p int
		var l leaseState
		if _, err := pgx.ForEachRow(rows, []any{&p, &l.holder, &l.gen, &l.valid}, func() error {
			leases[p] = l
			return nil
		}); err != nil {
			return nil, nil, nil, fmt.Errorf("lock leases: %w", err)
		}
	}
	if len(tasks) > 0 {
		rows, _ := br.Query()
		var task string
		var h taskHead
		if _, err := pgx.ForEachRow(rows, []any{&task, &h.partition, &h.version}, func() error {
			heads[task] = h
			return nil
		}); err != nil {
			return nil, nil, nil, fmt.Errorf("read heads: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, nil, nil, err
	}
	ex, err := s.readExisting(ctx, conn, b, heads)
	return leases, heads, ex, err
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
func (s *Store) classify(b *batch, leases map[int]leaseState, stored map[string]taskHead, ex []existing, res []Result) (plan, error) {
	heads := maps.Clone(stored)
	type key struct {
		task    string
		version int64
	}
	p := plan{follows: map[int]int{}}
	plannedID := map[string]int{}
	plannedTV := map[key]int{}

	for k, i := range b.order {
		e := &b.events[i]
		r := &res[i]
		h, known := heads[e.Task]
		l, leased := leases[e.Partition]
		*r = Result{CurrentGeneration: l.gen, CurrentHolder: l.holder}
		x := ex[k]
		jID, inID := plannedID[e.ID]
		jTV, inTV := plannedTV[key{e.Task, e.Version}]

		switch {
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
	return b.events[j].Type == b.events[i].Type && jsonEqual(b.payloads[j], b.payloads[i])
}

// jsonEqual compares two valid JSON documents by value, as jsonb equality
// does: object key order and spacing do not matter, string escapes are
// decoded, and numbers compare by exact value (1, 1.0, 1e0 are equal).
func jsonEqual(a, b string) bool {
	if a == b {
		return true
	}
	var va, vb any
	da, db := json.NewDecoder(strings.NewReader(a)), json.NewDecoder(strings.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	if da.Decode(&va) != nil || db.Decode(&vb) != nil {
		return false
	}
	return valueEqual(va, vb)
}

func valueEqual(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !valueEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !valueEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		rx, okx := new(big.Rat).SetString(string(x))
		ry, oky := new(big.Rat).SetString(string(y))
		return okx && oky && rx.Cmp(ry) == 0
	default: // string, bool, nil
		return a == b
	}
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

// isolateBadPayloads checks each remaining payload on its own, marks the ones
// PostgreSQL refuses invalid, and removes them from the batch.
func (s *Store) isolateBadPayloads(ctx context.Context, b *batch, res []Result) (int, error) {
	bad := 0
	keep := b.order[:0]
	for _, i := range b.order {
		var ok bool
		err := s.pool.QueryRow(ctx, sqlCheckPayload, b.payloads[i]).Scan(&ok)
		if err != nil && sqlState(err) != "" && !IsTransient(err) {
			res[i] = Result{Verdict: wire.VerdictInvalid, Reason: wire.ReasonBadPayload,
				Detail: "PostgreSQL refused the payload: " + err.Error()}
			bad++
			continue
		}
		if err != nil {
			return bad, err
		}
		keep = append(keep, i)
	}
	b.order = keep
	return bad, nil
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
