package fence

// The one-round-trip append. A worker's batches are almost always its
// tasks' next versions under leases it holds: their outcome can be
// predicted from what this process already knows, and the reads that
// decide it need not come back before the write goes out. The prediction
// is checked inside the transaction, where the careful path would read:
// the lease lock and the fence predicate (ledger.fence_check), the heads
// (ledger.heads_check), the ids (unique keys, ledger.ids_check) and the
// recorded verdicts (ledger.unrecorded_check, migration 00008). Any miss
// raises before COMMIT, and the batch is decided again the careful way.

import (
	"sync"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
)

// sqlStateUnrecorded is raised by ledger.unrecorded_check (migration 00008).
const sqlStateUnrecorded = "LF002" // the ledger's own

// sqlAppendUnrecorded fails the transaction when any of the batch's event
// ids has a recorded verdict.
const sqlAppendUnrecorded = `
SELECT ledger.unrecorded_check(count(*)) FROM ledger.rejections WHERE event_id = ANY($1::text[])`

// lastRead is what this process last read under the lease locks: each
// partition's lease and the archive horizon. A prediction made from it is
// only a guess, which the transaction checks.
type lastRead struct {
	mu      sync.Mutex
	leases  map[int]leaseState
	horizon horizon
	read    bool // horizon was read at least once
}

// note records leases, and the horizon unless z is nil, as an append read
// them.
func (r *lastRead) note(leases map[int]leaseState, z *horizon) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leases == nil {
		r.leases = map[int]leaseState{}
	}
	for p, l := range leases {
		r.leases[p] = l
	}
	if z != nil {
		r.horizon, r.read = *z, true
	}
}

// predict decides the batch from the leases and horizon this process last
// read and the heads it cached, and reports whether every valid event then
// commits (or repeats another event of the batch). Only then may the batch
// take the fast path; res is overwritten by whichever path runs.
func (s *Store) predict(b *batch, res []Result) (plan, bool) {
	if s.heads == nil || s.hooks.unfenced || s.hooks.noFast || s.hooks.beforeWrite != nil || b.careful || b.fullLookup || b.exclusive {
		return plan{}, false
	}
	st := state{leases: map[int]leaseState{}, heads: map[string]taskHead{}, existing: make([]existing, len(b.order))}
	s.last.mu.Lock()
	ok := s.last.read
	st.horizon = s.last.horizon
	for _, i := range b.order {
		e := &b.events[i]
		l, seen := s.last.leases[e.Partition]
		if !seen || !l.valid || l.holder != e.Holder || l.gen != e.Generation {
			ok = false
			break
		}
		st.leases[e.Partition] = l
	}
	s.last.mu.Unlock()
	if !ok {
		return plan{}, false
	}
	// A task this process holds no head of is taken to be new: its first
	// version is predicted to commit, and a later one is a gap, which
	// leaves this path. Were the task not new after all (its head shed
	// from the cache, or written by another process), the insert's heads
	// check raises, for its head is not born where the plan says, and the
	// batch is decided again from the database. Without this, every batch
	// with a new task took two round trips: over fresh tasks, the first
	// second ran at 0.42-0.74 of the rest (bench -external -tasks 10000).
	_, tasks, _ := b.keys()
	s.heads.lookup(tasks, st.heads)
	p, err := s.classify(b, st, res)
	if err != nil || p.unchecked || len(p.rejects) > 0 || len(p.commits)+len(p.follows) != len(b.order) {
		return plan{}, false
	}
	return p, true
}

// queueFastReads queues what the fast path sends ahead of its insert:
// BEGIN, the transaction's bounds, the lease lock and the check that no id
// has a recorded verdict.
func (s *Store) queueFastReads(pb *pgx.Batch, b *batch) {
	partitions, _, ids := b.keys()
	pb.Queue("begin")
	pb.Queue(sqlSetTimeouts, ms(s.cfg.StatementTimeout), ms(s.cfg.IdleInTransactionTimeout))
	pb.Queue(sqlAppendLockLeases, partitions)
	queuePrimaryCheck(pb, b)
	queueClaimCheck(pb, b)
	pb.Queue(sqlAppendUnrecorded, ids)
}

// readFastReads reads the results of queueFastReads, and remembers the
// leases it locked.
func (s *Store) readFastReads(br pgx.BatchResults, b *batch) error {
	for range 2 { // begin, timeouts
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	leases, err := readLeases(br)
	if err != nil {
		return err
	}
	s.last.note(leases, nil)
	b.locked = leases
	if err := readPrimaryCheck(br, b); err != nil {
		return err
	}
	if err := readClaimCheck(br, b); err != nil {
		return err
	}
	_, err = br.Exec()
	return err
}

// FastPath reports how many append attempts of this store (and of the
// copies tests make of it) took the one-round-trip path, and how many of
// those missed their prediction and were decided again the careful way: a
// zombie's batch, an id with a recorded verdict, a head another process
// moved. A high share of misses means the fast path costs a round trip
// more than it saves.
func (s *Store) FastPath() (attempts, missed int64) {
	return s.fastAppends.Load(), s.missedPredictions.Load()
}

// missedPrediction reports whether err is a check of the fast path failing:
// the batch is to be decided again from what the database holds.
func missedPrediction(err error) bool {
	switch sqlState(err) {
	case sqlStateFenceCheck, sqlStateUnrecorded, pgerrcode.UniqueViolation:
		return true
	}
	return false
}
