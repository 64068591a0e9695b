package fence

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Plans made while the ledger's tables were small. pgx prepares each
// statement once per connection, and after five executions PostgreSQL
// may keep a generic plan for it, costed against the tables as they were
// then. On a new ledger that is an empty ledger.heads: the heads read
// (task_id = ANY($1)) and the insert's update of the heads then scan the
// whole table, and stay so as it grows, until autovacuum's first analyze
// of it (a minute or more) invalidates the plans. Measured on 2 CPUs
// (BenchmarkAppend/batch=100/fresh: batches of 100, every event the first
// of a new task): 3,640 events/s with the plans of the empty tables,
// 11,662 with a plan made for every execution (plan_cache_mode
// force_custom_plan, which costs batches of known tasks a sixth), 16,046
// with this.
//
// So the store has its connections drop their prepared statements each
// time the events it committed pass another threshold (256, then four
// times the last): the next executions plan against the tables as they
// are. The thresholds grow fourfold, so a long-lived store re-prepares a
// handful of times, all early; by then the server's own analyze keeps the
// plans current. A pool that prepares nothing (pgx's exec modes for
// poolers plan every execution) is left alone.
type replanner struct {
	committed atomic.Int64
	epoch     atomic.Int64 // bumped at each threshold
	mu        sync.Mutex
	next      int64               // the next threshold
	conns     map[*pgx.Conn]int64 // the epoch each connection last re-prepared at
}

// replanFirst is the first threshold.
const replanFirst = 256

func newReplanner() *replanner {
	return &replanner{next: replanFirst, conns: map[*pgx.Conn]int64{}}
}

// note counts n events committed.
func (r *replanner) note(n int) {
	if n <= 0 {
		return
	}
	total := r.committed.Add(int64(n))
	r.mu.Lock()
	defer r.mu.Unlock()
	for total >= r.next {
		r.next *= 4
		r.epoch.Add(1)
	}
}

// refresh drops conn's prepared statements if a threshold passed since it
// last did. A failure is left to the statement that follows (the
// connection is broken, and the pool replaces it).
func (r *replanner) refresh(ctx context.Context, conn *pgxpool.Conn) {
	epoch := r.epoch.Load()
	if epoch == 0 {
		return
	}
	c := conn.Conn()
	r.mu.Lock()
	if r.conns[c] >= epoch {
		r.mu.Unlock()
		return
	}
	if len(r.conns) > 1024 {
		// Connections the pool closed: forgetting one costs it one more
		// re-prepare.
		clear(r.conns)
	}
	r.conns[c] = epoch
	r.mu.Unlock()
	if c.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement { // Config copies: once an epoch
		_ = c.DeallocateAll(ctx)
	}
}
