package ingest_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// One principal cannot push everyone's dead letters out of LEDGER_DLQ:
// beyond its quota its letters keep their verdict and lose the message's
// body and headers, so its share of the stream stays bounded, and another
// principal's letter afterwards is whole. Each cut letter is counted.
func TestOnePrincipalsDeadLettersStayWithinItsQuota(t *testing.T) {
	t.Parallel()
	const quota = 64 << 10
	e, reg := newMeteredEnv(t, ingest.Config{DeadLetterQuota: quota})
	body := []byte(`"` + strings.Repeat("x", 16<<10) + `"`)
	invalid := func(holder, task string) *nats.Msg {
		// No Ledger-Type: invalid/missing_type, a dead letter at once.
		m := nats.NewMsg(e.subj.In(holder, 3, task))
		m.Header.Set(nats.MsgIdHdr, newID())
		m.Header.Set(wire.HeaderGeneration, "1")
		m.Header.Set(wire.HeaderVersion, "1")
		m.Header.Set("X-Padding", strings.Repeat("p", 2000))
		m.Data = body
		return m
	}
	const flood = 40
	for i := range flood {
		e.publishMsg(invalid("billing.x", fmt.Sprintf("junk-%d", i)))
	}
	e.publishMsg(invalid("reports.a", "report-1"))

	var letters []*nats.Msg
	require.Eventually(t, func() bool {
		letters = letters[:0]
		for _, m := range e.streamMsgs(wire.StreamDLQ, "") {
			letters = append(letters, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		}
		return len(letters) == flood+1
	}, 30*time.Second, 50*time.Millisecond)

	var billingBytes, cut int
	for _, m := range letters {
		dl, err := wire.DecodeDeadLetter(m.Header, m.Data)
		require.NoError(t, err)
		require.Equal(t, wire.VerdictInvalid, dl.Verdict, "every letter keeps its verdict")
		hb, _ := wire.HeaderSize(m.Header)
		if strings.Contains(dl.SourceSubject, ".reports.") {
			require.Equal(t, body, dl.Data, "another principal's letter is whole")
			require.Equal(t, -1, dl.Truncated)
			continue
		}
		billingBytes += hb + len(m.Data)
		if dl.Truncated >= 0 {
			cut++
			require.Empty(t, dl.Data)
			require.Positive(t, dl.HeadersDropped)
			require.Empty(t, dl.Header.Get("X-Padding"))
		}
	}
	t.Logf("billing: %d letters, %d cut, %d bytes stored (quota %d)", flood, cut, billingBytes, quota)
	require.Positive(t, cut)
	require.Less(t, billingBytes, quota+flood*1024, "the quota, and a small letter beyond it")
	require.Equal(t, float64(cut), refusalsOf(t, reg, "dead_letter", "billing", "quota"))
}

// Two ingests share one principal's dead letter quota: a flood over every
// partition, decided half by each process, stores no more of billing's
// letters whole than one quota allows (each process counting on its own
// stored about twice as many).
func TestTwoIngestsShareOnePrincipalsDeadLetterQuota(t *testing.T) {
	t.Parallel()
	const quota = 64 << 10
	cfg := ingest.Config{DeadLetterQuota: quota, ClaimTTL: time.Second}
	e := newEnv(t, cfg)
	e.startIngest(cfg)
	require.Eventually(t, func() bool {
		return e.count(`SELECT count(DISTINCT owner) FROM ledger.ingest_claims WHERE expires_at > clock_timestamp()`) == 2
	}, 60*time.Second, 100*time.Millisecond, "both ingests decide partitions")

	body := []byte(`"` + strings.Repeat("x", 16<<10) + `"`)
	const flood = 48
	for i := range flood {
		// No Ledger-Type: invalid/missing_type, a dead letter at once.
		m := nats.NewMsg(e.subj.In("billing.x", i%16, fmt.Sprintf("junk-%d", i)))
		m.Header.Set(nats.MsgIdHdr, newID())
		m.Header.Set(wire.HeaderGeneration, "1")
		m.Header.Set(wire.HeaderVersion, "1")
		m.Data = body
		e.publishMsg(m)
	}
	var whole, cut int
	require.Eventually(t, func() bool {
		whole, cut = 0, 0
		for _, m := range e.streamMsgs(wire.StreamDLQ, "") {
			dl, err := wire.DecodeDeadLetter(m.Headers(), m.Data())
			require.NoError(t, err)
			if dl.Truncated >= 0 {
				cut++
			} else {
				whole++
			}
		}
		return whole+cut == flood
	}, 60*time.Second, 100*time.Millisecond)
	letter := len(body) + 1024
	t.Logf("billing: %d letters, %d whole, %d cut (quota %d bytes, about %d letters)", flood, whole, cut, quota, quota/letter)
	require.LessOrEqual(t, whole*len(body), quota, "the two ingests together keep billing within one quota")
	require.Positive(t, whole)
}
