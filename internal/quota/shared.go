package quota

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Kinds of shared quota, as ledger.quota_buckets names them.
const (
	DeadLetters = "dead_letters"
	Projections = "projections"
)

// Shared is a per-principal byte quota that holds across processes: every
// process of a kind draws from one bucket per principal in PostgreSQL
// (ledger.quota_take, migration 00017), full at its size and refilled at
// that size an hour by the database's clock. A process takes bytes in
// chunks of a sixty-fourth of the size and spends them locally, so it asks
// the database about once a chunk; bytes taken and not spent stay with the
// process, so all processes together never spend more than the quota.
//
// After a refusal a principal is refused locally for a second before the
// database is asked again, so a flood costs the database one query a
// second. While the database does not answer, each process falls back to
// a bucket of its own (Bytes), and asks the database again a second after
// its last failed answer, so an outage does not cost every take a timeout.
type Shared struct {
	pool  *pgxpool.Pool
	kind  string
	size  int64
	chunk int64
	local *Bytes
	now   func() time.Time

	mu sync.Mutex
	by map[string]*reserve
}

type reserve struct {
	mu      sync.Mutex
	left    int64
	refused time.Time
	// unanswered is when the database last failed to answer: for a
	// second after it the local bucket decides without asking again.
	unanswered time.Time
}

// sharedRetry is how long a refused principal is refused without asking
// the database; sharedTimeout bounds one question.
const (
	sharedRetry   = time.Second
	sharedTimeout = 2 * time.Second
)

const sqlQuotaTake = `SELECT ledger.quota_take($1, $2, $3, $4)`

// NewShared returns the quota of kind (DeadLetters, Projections) of size
// bytes a principal, kept in pool's database.
func NewShared(pool *pgxpool.Pool, kind string, size int64) *Shared {
	return &Shared{pool: pool, kind: kind, size: size, chunk: max(1, size/64), local: NewBytes(size),
		now: time.Now, by: map[string]*reserve{}}
}

// Take charges n bytes to principal; false, charging nothing, if it has
// fewer left across every process.
func (q *Shared) Take(principal string, n int) bool {
	q.mu.Lock()
	r := q.by[principal]
	if r == nil {
		r = &reserve{}
		q.by[principal] = r
	}
	q.mu.Unlock()

	r.mu.Lock()
	defer r.mu.Unlock()
	need := int64(n)
	if r.left >= need {
		r.left -= need
		return true
	}
	now := q.now()
	if now.Sub(r.refused) < sharedRetry {
		return false
	}
	if now.Sub(r.unanswered) < sharedRetry {
		return q.local.Take(principal, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	var got int64
	if err := q.pool.QueryRow(ctx, sqlQuotaTake, q.kind, principal, max(need-r.left, q.chunk), q.size).Scan(&got); err != nil {
		r.unanswered = now
		return q.local.Take(principal, n)
	}
	r.left += got
	if r.left >= need {
		r.left -= need
		r.refused = time.Time{}
		return true
	}
	r.refused = now
	return false
}
