package wire_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// The LEDGER_LOG copy carries exactly the headers of docs/contract.md §4, each with
// its own value (they are cut from shared buffers), and reads back as what
// was written.
func TestLogMsgCarriesTheContractHeaders(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{Prefix: "acme"}
	at := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	c := &wire.LogCopy{Seq: 1234567890123, EventID: "01JD0000000000000000000001", Partition: 15, Task: "report-7",
		Version: 42, Type: "progress", Payload: []byte(`{"step":3}`), Holder: "worker-b.1", Generation: 987654321, CommittedAt: at}
	m := s.LogMsg(c)
	require.Equal(t, "acme.log.15.report-7", m.Subject)
	require.Equal(t, `{"step":3}`, string(m.Data))
	want := map[string]string{
		wire.HeaderMsgID:       "01JD0000000000000000000001",
		wire.HeaderSeq:         "1234567890123",
		wire.HeaderTask:        "report-7",
		wire.HeaderPartition:   "15",
		wire.HeaderVersion:     "42",
		wire.HeaderType:        "progress",
		wire.HeaderHolder:      "worker-b.1",
		wire.HeaderGeneration:  "987654321",
		wire.HeaderCommittedAt: wire.FormatTime(at),
	}
	require.Len(t, m.Header, len(want))
	for k, v := range want {
		require.Equal(t, []string{v}, m.Header.Values(k), k)
	}
	back, err := s.DecodeLog(m.Subject, m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, *c, back)

	// A value appended to one header must not show up in another.
	m.Header.Add(wire.HeaderSeq, "extra")
	require.Equal(t, []string{"report-7"}, m.Header.Values(wire.HeaderTask))
}

// A log copy whose headers disagree with its subject, or lack one, is an
// error, not a silently zero field.
func TestDecodeLogRefusesBrokenCopies(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	good := s.LogMsg(&wire.LogCopy{Seq: 1, EventID: "01JD0000000000000000000001", Partition: 3, Task: "t", Version: 1,
		Type: "x", Holder: "w.1", Generation: 1, CommittedAt: time.Now()})
	for name, mutate := range map[string]func(m *nats.Msg){
		"no seq":         func(m *nats.Msg) { m.Header.Del(wire.HeaderSeq) },
		"bad version":    func(m *nats.Msg) { m.Header.Set(wire.HeaderVersion, "v1") },
		"other task":     func(m *nats.Msg) { m.Header.Set(wire.HeaderTask, "u") },
		"no holder":      func(m *nats.Msg) { m.Header.Del(wire.HeaderHolder) },
		"bad time":       func(m *nats.Msg) { m.Header.Set(wire.HeaderCommittedAt, "yesterday") },
		"not a log subj": func(m *nats.Msg) { m.Subject = "ledger.in.3.t" },
	} {
		m := &nats.Msg{Subject: good.Subject, Header: nats.Header{}, Data: good.Data}
		for k, v := range good.Header {
			m.Header[k] = append([]string(nil), v...)
		}
		mutate(m)
		_, err := s.DecodeLog(m.Subject, m.Header, m.Data)
		require.Error(t, err, name)
	}
}

// Receipts are hand-encoded; they must be the JSON of wire.Receipt for any
// id an invalid message may carry.
func TestAppendReceiptIsTheReceiptsJSON(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"01JD0000000000000000000001", "", "quote\"and\\slash", "ctl\x00\x01\x1f", "ünïcødé", "\xff\xfe"} {
		r := wire.Receipt{EventID: id, Task: "report-7", Partition: 3, Version: 2, Verdict: wire.VerdictStale,
			Reason: wire.ReasonSuperseded, Seq: 9, Generation: 41, CurrentGeneration: 42}
		b := wire.AppendReceipt(nil, &r)
		require.True(t, json.Valid(b), "%q gave %s", id, b)
		var got wire.Receipt
		require.NoError(t, json.Unmarshal(b, &got))
		if id == "\xff\xfe" {
			r.EventID = "\ufffd\ufffd" // invalid UTF-8 is replaced, as encoding/json does
		}
		require.Equal(t, r, got)
	}
}

// A dead letter keeps the original's headers and body, adds the rejection,
// never carries a worker's own ledger headers, and always fits its limit.
func TestDeadLetterRoundTripAndFit(t *testing.T) {
	t.Parallel()
	orig := nats.Header{}
	orig.Set(wire.HeaderMsgID, "01JD0000000000000000000001")
	orig.Set(wire.HeaderVerdict, "committed")
	orig.Set("Nats-Expected-Stream", "LEDGER_IN")
	orig.Set("X-Trace", "abc")
	at := time.Date(2026, 11, 30, 1, 2, 3, 4, time.UTC)
	rej := wire.Rejection{Verdict: wire.VerdictStale, Reason: wire.ReasonSuperseded, CurrentGeneration: 7,
		CurrentHolder: "w2", RejectedAt: at, SourceSeq: 99}
	m := wire.DeadLetterMsg("ledger.dlq.3.t", "ledger.in.w.1.3.t", orig, []byte(`{"a":1}`), rej, 1<<20)
	d, err := wire.DecodeDeadLetter(m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, rej, d.Rejection)
	require.Equal(t, "ledger.in.w.1.3.t", d.SourceSubject)
	require.Equal(t, "abc", d.Header.Get("X-Trace"))
	require.Empty(t, d.Header.Get("Nats-Expected-Stream"))
	require.Equal(t, []string{"stale"}, m.Header.Values(wire.HeaderVerdict), "the worker's forged verdict is gone")
	require.Equal(t, -1, d.Truncated)

	big := []byte(strings.Repeat("x", 10000))
	m = wire.DeadLetterMsg("ledger.dlq.3.t", "ledger.in.w.1.3.t", orig, big, rej, 4096)
	hb, _ := wire.HeaderSize(m.Header)
	require.LessOrEqual(t, hb+len(m.Data)+wire.DeadLetterSlack, 4096)
	d, err = wire.DecodeDeadLetter(m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, 10000, d.Truncated)

	huge := nats.Header{}
	huge.Set("X-Pad", strings.Repeat("h", wire.MaxHeaderBytes))
	m = wire.DeadLetterMsg("ledger.dlq.invalid", "bad.subject", huge, nil, rej, 1<<20)
	require.Empty(t, m.Header.Get("X-Pad"))
	d, err = wire.DecodeDeadLetter(m.Header, m.Data)
	require.NoError(t, err)
	require.Greater(t, d.HeadersDropped, wire.MaxHeaderBytes)
}

// A dead letter reduced for its size keeps its headers and records its
// body's size; one reduced for its principal's quota keeps only the
// ledger's headers and the event id, and records what it left out.
func TestDeadLettersReducedSayWhatTheyLeftOut(t *testing.T) {
	t.Parallel()
	orig := nats.Header{}
	orig.Set(wire.HeaderMsgID, "01JD0000000000000000000001")
	orig.Set("X-Trace", "abc")
	rej := wire.Rejection{Verdict: wire.VerdictGap, Reason: "window_closed", SourceSeq: 5}
	m := wire.DeadLetterMsg("ledger.dlq.3.t", "ledger.in.w.1.3.t", orig, []byte(`{"a":1}`), rej, 1<<20)

	bare := wire.DeadLetterWithoutBody(m)
	require.Empty(t, bare.Data)
	d, err := wire.DecodeDeadLetter(bare.Header, bare.Data)
	require.NoError(t, err)
	require.Equal(t, 7, d.Truncated)
	require.Equal(t, "abc", d.Header.Get("X-Trace"))
	require.Equal(t, -1, d.HeadersDropped)

	alone := wire.DeadLetterWithoutOriginal(m)
	require.Empty(t, alone.Data)
	d, err = wire.DecodeDeadLetter(alone.Header, alone.Data)
	require.NoError(t, err)
	require.Equal(t, rej.Verdict, d.Verdict)
	require.Equal(t, "01JD0000000000000000000001", alone.Header.Get(wire.HeaderMsgID))
	require.Empty(t, d.Header.Get("X-Trace"))
	require.Equal(t, 7, d.Truncated)
	dropped := nats.Header{"X-Trace": []string{"abc"}}
	hb, _ := wire.HeaderSize(dropped)
	require.Equal(t, hb, d.HeadersDropped)
}

// Receipts read back are receipts of contract verdicts.
func TestDecodeReceipt(t *testing.T) {
	t.Parallel()
	r := wire.Receipt{EventID: "01JD0000000000000000000001", Verdict: wire.VerdictCommitted, Seq: 3}
	got, err := wire.DecodeReceipt(wire.AppendReceipt(nil, &r))
	require.NoError(t, err)
	require.Equal(t, r, got)
	_, err = wire.DecodeReceipt([]byte(`{"event_id":"x","verdict":"not_yet"}`))
	require.Error(t, err)
	_, err = wire.DecodeReceipt([]byte(`nope`))
	require.Error(t, err)
}

// BenchmarkInboundMsg measures what the content token costs a publisher:
// token is InboundMsg as the SDKs send it, bare the same message with the
// bare event id (contract v2), the baseline of the same run.
func BenchmarkInboundMsg(b *testing.B) {
	e := wire.Inbound{ID: "01JD0000000000000000000001", Partition: 3, Task: "report-7", Holder: "reports.pod-a",
		Generation: 1, Version: 12, Type: "running", Payload: []byte(`{"step":12,"of":100,"url":"s3://reports/7.pdf","note":"a payload of a typical size"}`)}
	b.Run("token", func(b *testing.B) {
		for range b.N {
			_ = wire.Subjects{}.InboundMsg(e)
		}
	})
	b.Run("bare", func(b *testing.B) {
		for range b.N {
			m := nats.NewMsg(wire.Subjects{}.In(e.Holder, e.Partition, e.Task))
			m.Header.Set(wire.HeaderMsgID, e.ID)
			m.Header.Set(wire.HeaderGeneration, strconv.FormatInt(e.Generation, 10))
			m.Header.Set(wire.HeaderVersion, strconv.FormatInt(e.Version, 10))
			m.Header.Set(wire.HeaderType, e.Type)
			m.Data = e.Payload
		}
	})
}
