package ingest

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowness/ledger/pkg/wire"
)

// The lease service is shared fairly between principals (docs/contract.md
// §1, "Fair service"):
//
//   - Every request is charged to a principal: the one its subject names
//     (acquire, renew, release) or, for the public reads (get, task.head),
//     the requester as the NATS server tells it (requesterOf).
//   - A principal over its rate (a token bucket) is answered rate_limited at
//     once, and one with LeaseInFlight requests waiting or in service is
//     answered busy at once. Neither touches PostgreSQL.
//   - Admitted requests wait in per-principal queues of two classes:
//     renewals and releases first, then acquires and reads. LeaseWorkers
//     goroutines serve them concurrently, taking principals round-robin
//     within the first class with work, so a flood of one principal waits
//     behind the others' requests, never in front of them.
//   - A request that waited longer than LeaseMaxAge is dropped unanswered:
//     its requester has given up on it, and serving it would only delay
//     the requests still wanted.
//
// A request is answered by the goroutine that serves it, published on its
// reply subject directly rather than through micro's Respond (micro
// records an answer's error after its callback returns, so answering from
// another goroutine through it would race).

// Refusal codes of the fair service.
const (
	refusedRate   = wire.ErrCodeRateLimited
	refusedBusy   = wire.ErrCodeBusy
	refusedStale  = "stale"
	codeTooMany   = "429"
	classRenew    = 0 // renewals and releases: what keeps a lease
	classOther    = 1 // acquires and reads
	fairClasses   = 2
	fairMaxQueued = 1 << 16 // every principal's queued requests together
)

// fairJob is one admitted request.
type fairJob struct {
	principal string
	endpoint  string
	class     int
	received  time.Time
	serve     func(ctx context.Context)
}

// fairPrincipal is one principal's share: a token bucket and a count of
// requests waiting or in service per class, and its queues. Each class has
// its own, so a principal's reads and acquires never use up what keeps its
// own leases renewed.
type fairPrincipal struct {
	tokens   [fairClasses]float64
	at       time.Time
	inFlight [fairClasses]int
	serving  int
	queue    [fairClasses][]*fairJob
	inRing   [fairClasses]bool
}

// fairQueue admits, queues and hands out the lease service's requests.
type fairQueue struct {
	rate     float64
	burst    int
	inFlight int
	serving  int // the most workers one principal may occupy at once
	maxAge   time.Duration
	now      func() time.Time

	mu     sync.Mutex
	by     map[string]*fairPrincipal
	ring   [fairClasses][]string
	queued int
	swept  time.Time
	wake   chan struct{}
}

func newFairQueue(cfg Config) *fairQueue {
	return &fairQueue{rate: cfg.LeaseRate, burst: cfg.LeaseBurst, inFlight: cfg.LeaseInFlight,
		serving: max(1, cfg.LeaseWorkers/2), maxAge: cfg.LeaseMaxAge, now: time.Now, by: map[string]*fairPrincipal{},
		wake: make(chan struct{}, cfg.LeaseWorkers)}
}

// admit queues j, or returns why not: refusedRate or refusedBusy.
func (q *fairQueue) admit(j *fairJob) string {
	q.mu.Lock()
	now := q.now()
	q.sweep(now)
	p := q.by[j.principal]
	if p == nil {
		p = &fairPrincipal{tokens: [fairClasses]float64{float64(q.burst), float64(q.burst)}, at: now}
		q.by[j.principal] = p
	}
	for c := range p.tokens {
		p.tokens[c] = min(float64(q.burst), p.tokens[c]+now.Sub(p.at).Seconds()*q.rate)
	}
	p.at = now
	switch {
	case p.tokens[j.class] < 1:
		q.mu.Unlock()
		return refusedRate
	case p.inFlight[j.class] >= q.inFlight || q.queued >= fairMaxQueued:
		q.mu.Unlock()
		return refusedBusy
	}
	p.tokens[j.class]--
	p.inFlight[j.class]++
	q.queued++
	j.received = now
	p.queue[j.class] = append(p.queue[j.class], j)
	if !p.inRing[j.class] {
		p.inRing[j.class] = true
		q.ring[j.class] = append(q.ring[j.class], j.principal)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default: // every worker has a wake-up waiting: it will find j
	}
	return ""
}

// sweep forgets, about once a second, the principals with nothing in
// flight whose bucket is full again: a new one starts full anyway.
func (q *fairQueue) sweep(now time.Time) {
	if now.Sub(q.swept) < time.Second {
		return
	}
	q.swept = now
	full := time.Duration(float64(q.burst) / q.rate * float64(time.Second))
	for name, p := range q.by {
		if p.inFlight == [fairClasses]int{} && now.Sub(p.at) >= full {
			delete(q.by, name)
		}
	}
}

// next hands out the next request: in the first class with work, the
// first principal in its ring that occupies fewer than half the workers,
// which goes to the ring's end if it has more. So a flood of one principal
// never holds every worker, and a request of another finds one free. It
// blocks until there is one or ctx ends (nil).
func (q *fairQueue) next(ctx context.Context) *fairJob {
	for {
		q.mu.Lock()
		for c := range q.ring {
			for i, name := range q.ring[c] {
				p := q.by[name]
				if p.serving >= q.serving {
					continue
				}
				q.ring[c] = slices.Delete(q.ring[c], i, i+1)
				j := p.queue[c][0]
				p.queue[c][0] = nil
				p.queue[c] = p.queue[c][1:]
				if len(p.queue[c]) > 0 {
					q.ring[c] = append(q.ring[c], name)
				} else {
					p.inRing[c] = false
					p.queue[c] = nil
				}
				p.serving++
				q.queued--
				q.mu.Unlock()
				return j
			}
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-q.wake:
		}
	}
}

// done ends j's time in flight.
func (q *fairQueue) done(j *fairJob) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p := q.by[j.principal]
	p.inFlight[j.class]--
	p.serving--
	if len(p.queue[classRenew])+len(p.queue[classOther]) > 0 {
		select { // its next request may have been passed over
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// stale reports whether j waited so long that its requester gave up.
func (q *fairQueue) stale(j *fairJob) bool { return q.now().Sub(j.received) > q.maxAge }

// classOf is the class of an endpoint's requests.
func classOf(endpoint string) int {
	if endpoint == "renew" || endpoint == "release" {
		return classRenew
	}
	return classOther
}

// work serves admitted requests until ctx ends.
func (ls *leaseService) work(ctx context.Context) {
	for {
		j := ls.fair.next(ctx)
		if j == nil {
			return
		}
		if ls.fair.stale(j) {
			ls.metrics.refused(j.endpoint, j.principal, refusedStale)
		} else {
			j.serve(ctx)
		}
		ls.fair.done(j)
	}
}

// requesterOf names whom a request is charged to: the principal of the
// holder its subject names (holder, for acquire, renew and release); for
// a public read, the user the NATS server vouches for in Nats-Request-Info
// (set across the workers' account import, which shares it), else the
// principal of its reply inbox (_INBOX.<principal>.…), else its account,
// else "-".
func requesterOf(holder string, h nats.Header, reply string) string {
	if holder != "" {
		return wire.Principal(holder)
	}
	if info := h.Get("Nats-Request-Info"); info != "" {
		var ci struct {
			Account string `json:"acc"`
			User    string `json:"user"`
		}
		if json.Unmarshal([]byte(info), &ci) == nil {
			switch {
			case ci.User != "":
				return "user:" + ci.User
			case ci.Account != "" && !strings.HasPrefix(reply, "_INBOX."):
				return "account:" + ci.Account
			}
		}
	}
	if rest, ok := strings.CutPrefix(reply, "_INBOX."); ok {
		if p, _, ok := strings.Cut(rest, "."); ok && p != "" {
			return p
		}
	}
	return "-"
}

// refuse answers a request refused before it was queued; it runs in
// micro's callback, so through micro's own Error.
func (ls *leaseService) refuse(name, principal, code string, req micro.Request) {
	ls.metrics.refused(name, principal, code)
	msg := "too many requests of principal " + principal + " at once; retry later"
	if code == refusedRate {
		msg = "principal " + principal + " is over its request rate; retry later"
	}
	b, _ := json.Marshal(wire.ErrorReply{Error: code, Message: msg})
	if err := req.Error(codeTooMany, msg, b); err != nil {
		ls.log.Debug("lease refusal not sent", "endpoint", name, "error", err.Error())
	}
}
