package fence

// The I/O of Append: the pipelined round trips that read the state a batch
// is decided from (readState), write its plan (write), and search a batch
// for the events PostgreSQL refuses (isolate).
//
// A batch costs a fixed handful of statements whatever its size, in two
// pipelined round trips. The first sends BEGIN, the timeouts, the lease
// lock, and the reads of uncached heads, recorded verdicts and the horizon.
// The second sends one INSERT ... SELECT FROM unnest(...) for the commits
// (with their ids and heads), one for the rejections, and COMMIT. A lookup
// of stored rows that events at or below their head may collide with
// (usually none) takes a third. A batch that records a rejection reads once
// more under its exclusive locks. COMMIT travels with the insert, so the
// insert itself must fail when a row does not pass the fence:
// ledger.fence_check (migration 00003) compares the rows inserted with the
// rows planned, raises, and the batch runs again.
//
// The lookups are optimistic. An event planned as head + 1 is not looked
// up unless its id was minted before the id floor. If its id or (task,
// version) is in fact taken, the INSERT fails with unique_violation, and
// the batch reruns with every head read and every event looked up. An
// event that will not commit is never decided without that full lookup, so
// a cached head or a skipped lookup can cost a retry, never a wrong verdict.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// appendOnce runs one attempt of the batch: read, decide, write; or, when
// the outcome can be predicted (fast.go), all three in one round trip.
func (s *Store) appendOnce(ctx context.Context, b *batch, res []Result) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer endTx(ctx, conn)
	if !s.hooks.noReplan {
		s.replan.refresh(ctx, conn)
	}
	b.primaryCheck, b.timeline = s.primaryCheck()

	p, fast := s.predict(b, res)
	if fast {
		s.fastAppends.Add(1)
	} else {
		if p, err = s.decide(ctx, conn, b, res); err != nil {
			return err
		}
		if s.hooks.beforeWrite != nil {
			s.hooks.beforeWrite()
		}
	}
	// Round trip 2 (or the only one): the fenced insert, the rejections
	// and COMMIT.
	inserted, err := s.write(ctx, conn, b, p, res, fast)
	if err != nil {
		// Whether COMMIT happened may be unknown (the connection broke):
		// the heads this batch would have moved are read again next time.
		s.forgetHeads(b)
		if fast && missedPrediction(err) {
			// A lease, head, id or recorded verdict is not as predicted:
			// nothing was written; the batch is decided from the database,
			// as Append retries such an error for either path.
			b.careful = true
			s.missedPredictions.Add(1)
		}
		switch sqlState(err) {
		case sqlStatePrimaryCheck:
			// A superseded primary: drop the connection, so that the next
			// one may reach the newest primary.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		case sqlStateFenceCheck:
			// A lease expired between the read and the insert (or, on the
			// fast path, is not the one predicted): the fence held, and the
			// next attempt reads the lease as it is.
			return errRetryBatch
		case sqlStateUnrecorded:
			// An id of the batch has a recorded verdict: the next attempt
			// reads it and repeats it.
			return errRetryBatch
		}
		return err
	}
	s.rememberHeads(b, p.commits)
	if fast {
		// The prediction's modes were guessed; the locked read's decide.
		for _, i := range b.order {
			res[i].FenceMode = modeOf(b.locked[b.events[i].Partition])
		}
	}
	var top int64
	for _, i := range p.commits {
		c := inserted[b.events[i].ID]
		res[i].Verdict, res[i].Seq, res[i].Committed = wire.VerdictCommitted, c.Seq, c
		top = max(top, c.Seq)
	}
	if top > 0 && !s.hooks.noPartitionKeeping {
		s.parts.note(top)
	}
	s.replan.note(len(p.commits))
	for i, j := range p.follows {
		res[i].Verdict, res[i].Seq, res[i].Committed = wire.VerdictDuplicate, res[j].Seq, res[j].Committed
	}
	return nil
}

// sqlStateFenceCheck is raised by ledger.fence_check (migration 00003).
const sqlStateFenceCheck = "LF001" // the ledger's own; pgerrcode has no name for it

// sqlStateVersionsFence is raised by the database's fence (migration
// 00012) for a row or a head that breaks the dense versions.
const sqlStateVersionsFence = "LF005"

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
		case !b.exclusive && !s.hooks.sharedRejections && p.undoable(res, s.hooks.allRejectionsExclusive):
			// A rejection is final (doc.go, Finality): no other append may
			// commit an event this one rejects between this reading and
			// the commit. The shared locks are given up rather than
			// upgraded, so two such batches queue instead of deadlocking.
			b.exclusive = true
			step = txRestart
		default:
			return p, nil
		}
	}
}

// readState locks the batch's leases and reads the heads of its tasks and
// the verdicts recorded for its event ids in one pipelined round trip (which
// begins the transaction unless step is txContinue), then reads the
// existing rows the batch may collide with (usually none).
func (s *Store) readState(ctx context.Context, conn *pgxpool.Conn, b *batch, step txStep) (state, error) {
	partitions, tasks, ids := b.keys()

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
	if !s.hooks.unfenced {
		lock := sqlAppendLockLeases
		if b.exclusive {
			lock = sqlAppendLockLeasesExclusive
		}
		pb.Queue(lock, partitions)
	}
	if step != txContinue {
		queuePrimaryCheck(pb, b)
		queueClaimCheck(pb, b)
	}
	if len(tasks) > 0 {
		pb.Queue(s.sqlHeads(), tasks)
	}
	pb.Queue(sqlAppendHorizon)
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
	if !s.hooks.unfenced {
		var err error
		if st.leases, err = readLeases(br); err != nil {
			return st, err
		}
	}
	if step != txContinue {
		if err := readPrimaryCheck(br, b); err != nil {
			return st, err
		}
		if err := readClaimCheck(br, b); err != nil {
			return st, err
		}
	}
	if len(tasks) > 0 {
		rows, _ := br.Query()
		var task string
		var h taskHead
		if _, err := pgx.ForEachRow(rows, []any{&task, &h.partition, &h.version, &h.firstSeq, &h.owner, &h.snapshot}, func() error {
			st.heads[task] = h
			return nil
		}); err != nil {
			return st, fmt.Errorf("read heads: %w", err)
		}
	}
	if err := br.QueryRow().Scan(&st.horizon.belowSeq, &st.horizon.idFloor); err != nil {
		return st, fmt.Errorf("read the archive horizon: %w", err)
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
	s.last.note(st.leases, &st.horizon)
	var err error
	st.existing, err = s.readExisting(ctx, conn, b, st.heads, st.horizon)
	return st, err
}

// keys are the batch's distinct partitions, tasks and event ids, in the
// batch's order; worked out once for every attempt (isolate, which takes
// events out of the batch, clears them).
func (b *batch) keys() (partitions []int32, tasks, ids []string) {
	if k := b.keyCache; k != nil {
		return k.partitions, k.tasks, k.ids
	}
	defer func() { b.keyCache = &batchKeys{partitions, tasks, ids} }()
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
	return partitions, tasks, ids
}

// readLeases reads the result of the lease lock: each partition's lease.
func readLeases(br pgx.BatchResults) (map[int]leaseState, error) {
	leases := map[int]leaseState{}
	rows, _ := br.Query()
	var p int
	var l leaseState
	if _, err := pgx.ForEachRow(rows, []any{&p, &l.holder, &l.gen, &l.valid, &l.observe}, func() error {
		leases[p] = l
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lock leases: %w", err)
	}
	return leases, nil
}

// sqlHeads is the statement the append reads heads with.
func (s *Store) sqlHeads() string {
	if s.hooks.headsFromLog {
		return sqlAppendHeadsFromLog
	}
	return sqlAppendHeads
}

// readExisting looks up the stored rows that share an event id or a (task,
// version) with the events that can collide with one: those at or below
// their head, and those whose id was minted before the id floor.
func (s *Store) readExisting(ctx context.Context, conn *pgxpool.Conn, b *batch, heads map[string]taskHead, z horizon) ([]existing, error) {
	ex := make([]existing, len(b.order))
	var pos []int // positions in b.order that are looked up
	for k, i := range b.order {
		e := &b.events[i]
		if b.fullLookup || e.Version <= heads[e.Task].version || z.beforeFloor(e.ID) {
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
	_, err = pgx.ForEachRow(rows, []any{&ord, &byID, &st.c.Seq, &st.hot, &st.c.EventID, &st.c.Partition, &st.c.Task,
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

// write sends, in one pipelined round trip, the fenced insert of the
// batch's commits, its rejections and COMMIT (after BEGIN, the lease lock
// and the recorded-verdict check on the fast path), and returns the inserted rows
// by event id. An error means the transaction did not commit, or (an error
// from the connection itself) that it is unknown whether it did.
func (s *Store) write(ctx context.Context, conn *pgxpool.Conn, b *batch, p plan, res []Result, fast bool) (map[string]*Committed, error) {
	pb := &pgx.Batch{}
	if fast {
		s.queueFastReads(pb, b)
	}
	if len(p.commits) > 0 {
		queueInsert(pb, b, p, res, s.insertSQL())
	}
	if len(p.rejects) > 0 {
		queueRejections(pb, b, p.rejects, res)
	}
	pb.Queue("commit")
	br := conn.SendBatch(ctx, pb)
	defer br.Close()

	if fast {
		if err := s.readFastReads(br, b); err != nil {
			return nil, err
		}
	}
	var out map[string]*Committed
	if len(p.commits) > 0 {
		var err error
		if out, err = readInserted(br, b, p.commits, res); err != nil {
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

// insertSQL is the statement that inserts the commits: the fenced insert,
// or with a mechanism switched off for a test's negative control.
func (s *Store) insertSQL() string {
	switch {
	case s.hooks.unfenced:
		return sqlAppendInsertUnfenced
	case s.hooks.unserialised, s.hooks.headsFromLog:
		return without(sqlAppendInsert, appendHeadsPredicate, appendHeadsCheck)
	case s.hooks.noIDFloor:
		return without(sqlAppendInsert, appendFloorPredicate, appendFloorCheck)
	}
	return sqlAppendInsert
}

// queueInsert queues the fenced insert of the commits: the columns of
// sqlProbeInsert, how many rows the fence must let through, what each
// would_reject says, and per task the head version the plan moves it from
// and its kind.
func queueInsert(pb *pgx.Batch, b *batch, p plan, res []Result, sql string) {
	commits := p.commits
	would := make([]*string, len(commits))
	var tasks, kinds []string
	var from []int64
	seen := make(map[string]bool, len(p.from))
	for k, i := range commits {
		if w := res[i].WouldReject; w != "" {
			would[k] = &w
		}
		e := &b.events[i]
		if v, ok := p.from[e.Task]; ok && !seen[e.Task] {
			seen[e.Task] = true
			tasks, from, kinds = append(tasks, e.Task), append(from, v), append(kinds, kindName(e.Snapshot))
		}
	}
	pb.Queue(sql, append(eventColumns(b, commits), int64(len(commits)), would, tasks, from, kinds)...)
}

// readInserted reads the rows the fenced insert returned.
func readInserted(br pgx.BatchResults, b *batch, commits []int, res []Result) (map[string]*Committed, error) {
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
			Type: e.Type, Payload: []byte(b.payloads[i]), Holder: e.Holder, Generation: e.Generation, CommittedAt: at,
			WouldReject: res[i].WouldReject, Snapshot: e.Snapshot}
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
		_, perr := conn.Exec(ctx, sqlProbeInsert, eventColumns(b, set)...)
		if _, err := conn.Exec(ctx, "rollback to savepoint probe"); err != nil {
			return err
		}
		var pgErr *pgconn.PgError
		switch {
		case perr == nil, sqlState(perr) == sqlStateFenceCheck, sqlState(perr) == sqlStateVersionsFence:
			// The database's fence (migration 00012) checks a statement
			// after PostgreSQL took each of its rows: the probe, which moves
			// no head, passed every check of the rows themselves.
			return nil
		case !errors.As(perr, &pgErr) || !isDataError(pgErr.Code) || isNoPartition(perr):
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
	b.order, b.keyCache = keep, nil
	return len(bad), nil
}

// eventColumns are the events set as the column arrays sqlProbeInsert and
// sqlAppendInsert take as $1..$8.
func eventColumns(b *batch, set []int) []any {
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
