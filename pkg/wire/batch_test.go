package wire_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

func batchEvents() []wire.Inbound {
	return []wire.Inbound{
		{ID: "01JD0000000000000000000001", Partition: 3, Task: "report-7", Holder: "w.1", Generation: 9, Version: 1,
			Type: "started", Payload: []byte(`{"a":1}`)},
		{ID: "01JD0000000000000000000002", Partition: 3, Task: "report-7", Holder: "w.1", Generation: 9, Version: 2,
			Type: "done"},
		{ID: "01JD0000000000000000000003", Partition: 3, Task: "snap", Holder: "w.1", Generation: 9, Version: 5,
			Type: "state", Payload: []byte(`[1,"x"]`), Kind: wire.KindSnapshot},
	}
}

// Each event of a batch decodes, through the single-event decoder, into
// exactly the event that was put in: the ledger judges it as if sent alone.
func TestBatchDecodesIntoTheEventsItCarries(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	in := batchEvents()
	m, err := s.BatchMsg(in)
	require.NoError(t, err)
	require.Equal(t, "ledger.in.w.1.3", m.Subject)
	require.Equal(t, "3", m.Header.Get(wire.HeaderBatch))
	require.True(t, strings.HasPrefix(m.Header.Get(wire.HeaderMsgID), "batch-01JD0000000000000000000001:"))
	require.True(t, s.IsInBatch(m.Subject))
	require.False(t, s.IsInBatch(s.In("w.1", 3, "report-7")))

	d, bad := s.DecodeBatch(m.Subject, m.Header, m.Data)
	require.Nil(t, bad)
	require.Equal(t, "w.1", d.Holder)
	require.Equal(t, 3, d.Partition)
	require.Len(t, d.Events, len(in))
	for i, em := range d.Events {
		got, bad := s.DecodeInbound(em.Subject, em.Header, em.Data)
		require.Nil(t, bad, "event %d", i)
		want := in[i]
		if want.Kind == "" {
			want.Kind = wire.KindEvents
		}
		require.Equal(t, want.ID, got.ID)
		require.Equal(t, string(want.Payload), string(got.Payload))
		got.Payload, want.Payload = nil, nil
		require.Equal(t, want, got.Inbound)
	}

	// Another content under the same first id is another Nats-Msg-Id.
	in[1].Type = "failed"
	m2, err := s.BatchMsg(in)
	require.NoError(t, err)
	require.NotEqual(t, m.Header.Get(wire.HeaderMsgID), m2.Header.Get(wire.HeaderMsgID))
}

// An element's own faults are its own: a bad version or a missing type is
// that event's invalid verdict, the other events are unaffected.
func TestBatchEventFaultsAreJudgedPerEvent(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	body := `[{"event_id":"01JD0000000000000000000001","task":"t","version":-1,"type":"x"},` +
		`{"event_id":"01JD0000000000000000000002","task":"t","version":2},` +
		`{"event_id":"01JD0000000000000000000003","task":"t","version":3,"type":"x","kind":"Snap"},` +
		`{"event_id":"01JD0000000000000000000004","task":"t","version":4,"type":"x","payload":null}]`
	h := nats.Header{wire.HeaderMsgID: {"batch-x"}, wire.HeaderGeneration: {"2"}, wire.HeaderBatch: {"4"}}
	d, bad := s.DecodeBatch("ledger.in.w.1.0", h, []byte(body))
	require.Nil(t, bad)
	var reasons []string
	for _, em := range d.Events {
		_, bad := s.DecodeInbound(em.Subject, em.Header, em.Data)
		r := ""
		if bad != nil {
			r = bad.Reason
		}
		reasons = append(reasons, r)
	}
	require.Equal(t, []string{wire.ReasonBadVersion, wire.ReasonMissingType, wire.ReasonBadKind, ""}, reasons)
	require.Nil(t, d.Events[3].Data, "a null payload is the empty payload of a single event")
}

// A batch that does not decode is bad_batch as a whole, and names the
// event ids that can be read, for their receipts.
func TestBatchThatDoesNotDecodeIsBadBatch(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	good := `{"event_id":"01JD0000000000000000000001","task":"t","version":1,"type":"x"}`
	other := `{"event_id":"01JD0000000000000000000002","task":"t","version":2,"type":"x"}`
	hdr := func(n string) nats.Header {
		return nats.Header{wire.HeaderMsgID: {"batch-x"}, wire.HeaderGeneration: {"2"}, wire.HeaderBatch: {n}}
	}
	for name, c := range map[string]struct {
		subject string
		h       nats.Header
		body    string
		ids     int
	}{
		"not an array":       {"ledger.in.w.1.0", hdr("1"), good, 0},
		"count differs":      {"ledger.in.w.1.0", hdr("3"), "[" + good + "," + other + "]", 2},
		"count missing":      {"ledger.in.w.1.0", nats.Header{wire.HeaderGeneration: {"2"}}, "[" + good + "]", 1},
		"count too large":    {"ledger.in.w.1.0", hdr("1001"), "[" + good + "]", 1},
		"bad event id":       {"ledger.in.w.1.0", hdr("2"), `[` + good + `,{"event_id":"nope","version":1}]`, 1},
		"task not a string":  {"ledger.in.w.1.0", hdr("2"), `[` + good + `,{"event_id":"01JD0000000000000000000002","task":5}]`, 2},
		"partition 03":       {"ledger.in.w.1.03", hdr("1"), "[" + good + "]", 1},
		"headers too large":  {"ledger.in.w.1.0", nats.Header{wire.HeaderBatch: {"1"}, "X": {strings.Repeat("x", 9000)}}, "[" + good + "]", 1},
		"not JSON":           {"ledger.in.w.1.0", hdr("1"), "[{", 0},
		"empty array":        {"ledger.in.w.1.0", hdr("0"), "[]", 0},
		"element not object": {"ledger.in.w.1.0", hdr("2"), "[" + good + ",7]", 1},
	} {
		d, bad := s.DecodeBatch(c.subject, c.h, []byte(c.body))
		require.NotNil(t, bad, name)
		require.Equal(t, wire.ReasonBadBatch, bad.Reason, name)
		require.NotEmpty(t, bad.Detail, name)
		require.Len(t, d.IDs, c.ids, name)
		require.Nil(t, d.Events, name)
	}
	// A holder is read even from a subject whose partition is unusable.
	d, _ := s.DecodeBatch("ledger.in.w.1.03", hdr("1"), []byte("["+good+"]"))
	require.Equal(t, "w.1", d.Holder)
}

func TestBatchMsgRefusesMixedOrEmptyBatches(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	_, err := s.BatchMsg(nil)
	require.Error(t, err)
	in := batchEvents()
	in[2].Generation++
	_, err = s.BatchMsg(in)
	require.Error(t, err)
	many := make([]wire.Inbound, wire.MaxBatch+1)
	_, err = s.BatchMsg(many)
	require.Error(t, err)
}

// A batched receipt reads back as the receipts it was made of, in order.
func TestBatchedReceiptsRoundTrip(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	rs := []wire.Receipt{
		{EventID: "01JD0000000000000000000001", Task: "t", Partition: 1, Version: 1, Verdict: wire.VerdictCommitted,
			Seq: 7, Generation: 2, FenceMode: "enforce"},
		{EventID: "01JD0000000000000000000002", Task: "t", Partition: 1, Version: 2, Verdict: wire.VerdictInvalid,
			Reason: wire.ReasonBadBatch},
	}
	m := s.ReceiptsMsg("w.1", rs)
	require.Equal(t, "ledger.receipt.w.1", m.Subject)
	require.Equal(t, strconv.Itoa(len(rs)), m.Header.Get(wire.HeaderBatch))
	got, err := wire.DecodeReceipts(m.Data)
	require.NoError(t, err)
	require.Equal(t, rs, got)
	_, err = wire.DecodeReceipts([]byte(`[{"event_id":"x","verdict":"maybe"}]`))
	require.Error(t, err)
}

// An element's keys are read strictly: each of the six names, spelled
// exactly, once. A repeated or differently spelled key could name another
// event than the one a reader of the body sees, so it refuses the batch.
//
// Switch: skip the seen[f] check in batchScanner.object; the repeated-key
// cases are accepted ("escaped repeat" failed first). Switch: fold case in
// fieldOf (strings.ToLower of the key); "upper-case key" is accepted.
func TestBatchKeysAreExactAndOnce(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	h := nats.Header{wire.HeaderGeneration: {"2"}, wire.HeaderBatch: {"4"}}
	good := `{"event_id":"01JD0000000000000000000001","task":"t","version":1,"type":"x"},`
	body := func(last string) []byte {
		return []byte("[" + good + strings.ReplaceAll(good, "01", "02") + good + last + "]")
	}
	for name, c := range map[string]struct{ last, detail string }{
		"repeated key": {`{"event_id":"01JD0000000000000000000004","task":"t","version":4,` +
			`"event_id":"01JD0000000000000000000005","type":"x"}`, `event 3: key "event_id" repeated`},
		"repeated null": {`{"event_id":"01JD0000000000000000000004","task":"t","task":null,"version":4,"type":"x"}`,
			`event 3: key "task" repeated`},
		"escaped repeat": {`{"event_id":"01JD0000000000000000000004","task":"t","version":4,"type":"x","typ\u0065":"y"}`,
			`event 3: key "type" repeated`},
		"upper-case key": {`{"EVENT_ID":"01JD0000000000000000000004","task":"t","version":4,"type":"x"}`,
			`event 3: key "EVENT_ID" is not one of event_id, task, version, type, kind, payload`},
		"folded key": {`{"event_id":"01JD0000000000000000000004","tas\u212a":"t","version":4,"type":"x"}`,
			"event 3: key \"tas\u212a\" is not one of event_id, task, version, type, kind, payload"},
		"unknown key": {`{"event_id":"01JD0000000000000000000004","task":"t","version":4,"type":"x","note":1}`,
			`event 3: key "note" is not one of event_id, task, version, type, kind, payload`},
		"version as string": {`{"event_id":"01JD0000000000000000000004","task":"t","version":"4","type":"x"}`,
			`event 3: version is not a JSON number`},
	} {
		d, bad := s.DecodeBatch("ledger.in.w.1.0", h, body(c.last))
		require.NotNil(t, bad, name)
		require.Equal(t, wire.ReasonBadBatch, bad.Reason, name)
		require.Equal(t, c.detail, bad.Detail, name)
		require.Nil(t, d.Events, name)
		require.NotContains(t, d.IDs, "01JD0000000000000000000005", name)
	}
	// The escaped spelling of an exact name is that name.
	d, bad := s.DecodeBatch("ledger.in.w.1.0", h, body(`{"event\u005fid":"01JD0000000000000000000004","task":"t","version":4}`))
	require.Nil(t, bad)
	require.Equal(t, "01JD0000000000000000000004", d.Events[3].Header.Get(wire.HeaderMsgID))
}

// A refused batch's receipts go only to ids an element names once, under
// the exact key: never to one of two ids an element names.
//
// Switch: return id, true at the end of exactEventID; the element with two
// event_id keys yields a receipt id.
func TestBadBatchReceiptsOnlyUnambiguousIDs(t *testing.T) {
	t.Parallel()
	body := `[{"event_id":"01JD0000000000000000000001","task":"t","version":1,"type":"x"},` +
		`{"event_id":"01JD0000000000000000000002","event_id":"01JD0000000000000000000003"},` +
		`{"Event_ID":"01JD0000000000000000000004"}]`
	d, bad := wire.Subjects{}.DecodeBatch("ledger.in.w.1.0",
		nats.Header{wire.HeaderGeneration: {"2"}, wire.HeaderBatch: {"3"}}, []byte(body))
	require.NotNil(t, bad)
	require.Equal(t, `event 1: key "event_id" repeated`, bad.Detail)
	require.Equal(t, []string{"01JD0000000000000000000001"}, d.IDs)
}
