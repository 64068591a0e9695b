// Package quota keeps per-principal shares of the ledger's shared storage:
// a token bucket of bytes per principal, full at its size and refilled at
// that size an hour. The ingests share one for dead letters, the
// projectors one for projection values: Shared keeps the count in
// PostgreSQL, so it holds across processes and restarts. Bytes is the
// count of one process, which Shared falls back to while the database does
// not answer.
package quota

import (
	"sync"
	"time"
)

// Bytes is a per-principal byte quota.
type Bytes struct {
	max float64
	now func() time.Time

	mu    sync.Mutex
	by    map[string]*bucket
	swept time.Time
}

type bucket struct {
	left float64
	at   time.Time
}

// NewBytes returns a quota of max bytes a principal, refilled at max an hour.
func NewBytes(max int64) *Bytes {
	return &Bytes{max: float64(max), now: time.Now, by: map[string]*bucket{}}
}

// Take charges n bytes to principal; false, charging nothing, if it has
// fewer left.
func (q *Bytes) Take(principal string, n int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	if now.Sub(q.swept) > time.Minute {
		q.swept = now
		for name, b := range q.by { // full again: a new bucket is the same
			if b.left+now.Sub(b.at).Hours()*q.max >= q.max {
				delete(q.by, name)
			}
		}
	}
	b := q.by[principal]
	if b == nil {
		b = &bucket{left: q.max, at: now}
		q.by[principal] = b
	}
	b.left = min(q.max, b.left+now.Sub(b.at).Hours()*q.max)
	b.at = now
	if b.left < float64(n) {
		return false
	}
	b.left -= float64(n)
	return true
}
