package ingest

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// byteQuota is a token bucket of bytes per principal: max bytes, refilled
// at max an hour. It is this process's count: several ingests each keep
// one, and a restart starts every principal full.
type byteQuota struct {
	max float64
	now func() time.Time

	mu    sync.Mutex
	by    map[string]*byteBucket
	swept time.Time
}

type byteBucket struct {
	left float64
	at   time.Time
}

func newByteQuota(max int64) *byteQuota {
	return &byteQuota{max: float64(max), now: time.Now, by: map[string]*byteBucket{}}
}

// take charges n bytes to principal; false, charging nothing, if it has
// fewer left.
func (q *byteQuota) take(principal string, n int) bool {
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
		b = &byteBucket{left: q.max, at: now}
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

// principalOfSubject is the principal a LEDGER_IN subject names (its third
// token: <prefix>.in.<principal>.…), or "-".
func principalOfSubject(subject string) string {
	parts := strings.SplitN(subject, ".", 4)
	if len(parts) < 4 || !wire.ValidID(parts[2]) {
		return "-"
	}
	return parts[2]
}

// overQuotaLetter is letter m without the original message's body and
// headers: the ledger's headers (the verdict, where it came from) and the
// event id stay, and Ledger-Truncated and Ledger-Headers-Dropped tell what
// was left out.
func overQuotaLetter(m *nats.Msg) *nats.Msg {
	out := nats.NewMsg(m.Subject)
	dropped := nats.Header{}
	for k, vs := range m.Header {
		if k == nats.MsgIdHdr || slices.Contains(wire.DeadLetterHeaders, k) {
			out.Header[k] = vs
		} else {
			dropped[k] = vs
		}
	}
	if out.Header.Get(wire.HeaderTruncated) == "" {
		out.Header.Set(wire.HeaderTruncated, strconv.Itoa(len(m.Data)))
	}
	if out.Header.Get(wire.HeaderHeadersDropped) == "" {
		hb, _ := wire.HeaderSize(dropped)
		out.Header.Set(wire.HeaderHeadersDropped, strconv.Itoa(hb))
	}
	return out
}
