package wire_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

func TestParseInSplitsOnlyWellFormedSubjects(t *testing.T) {
	t.Parallel()
	s := wire.Subjects{}
	for _, c := range []struct {
		subject   string
		holder    string
		partition int
		task      string
		ok        bool
	}{
		{"ledger.in.reports.pod-7.3.report-7", "reports.pod-7", 3, "report-7", true},
		{"ledger.in.a.b.0.A_b-9", "a.b", 0, "A_b-9", true},
		{"ledger.in.a.b.10.task", "a.b", 10, "task", true},
		{"ledger.in.a.b.3", "", 0, "", false},
		{"ledger.in.a.3.task", "", 0, "", false},
		{"ledger.in.3.task", "", 0, "", false},
		{"ledger.in.a.b.3.a.b", "", 0, "", false},
		{"ledger.in.a.b.x.task", "", 0, "", false},
		{"ledger.in.a.b.-1.task", "", 0, "", false},
		{"ledger.in.a.b.+1.task", "", 0, "", false},
		{"ledger.in.a.b.003.task", "", 0, "", false},
		{"ledger.in.a.b.00.task", "", 0, "", false},
		{"ledger.in.a*.b.3.task", "", 0, "", false},
		{"ledger.in." + strings.Repeat("p", 65) + ".b.3.task", "", 0, "", false},
		{"ledger.log.3.task", "", 0, "", false},
		{"other.in.a.b.3.task", "", 0, "", false},
		{"ledger.in.a.b.3." + strings.Repeat("t", 129), "", 0, "", false},
	} {
		h, p, task, err := s.ParseIn(c.subject)
		if !c.ok {
			require.Error(t, err, c.subject)
			continue
		}
		require.NoError(t, err, c.subject)
		require.Equal(t, c.holder, h, c.subject)
		require.Equal(t, c.partition, p, c.subject)
		require.Equal(t, c.task, task, c.subject)
	}
}

// The ingest parses every inbound subject twice per event (to route it and
// to decode it): a well-formed one must cost no allocation.
func TestParseInOfAWellFormedSubjectDoesNotAllocate(t *testing.T) {
	s := wire.Subjects{}
	subject := s.In("reports.pod-7", 3, "report-7")
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, _, err := s.ParseIn(subject); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}

func TestParseIntTakesPlainDigitsOnly(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]int64{"0": 0, "1": 1, "42": 42, "000123": 123} {
		n, err := wire.ParseInt(s)
		require.NoError(t, err, s)
		require.Equal(t, want, n, s)
	}
	for _, s := range []string{"", "-1", "+1", " 1", "1 ", "1e3", "0x10", "1.0", strings.Repeat("9", 19)} {
		_, err := wire.ParseInt(s)
		require.Error(t, err, "%q", s)
	}
}

func TestIdentifierRules(t *testing.T) {
	t.Parallel()
	require.True(t, wire.ValidID("worker-a_1"))
	require.True(t, wire.ValidID(strings.Repeat("x", 128)))
	for _, bad := range []string{"", strings.Repeat("x", 129), "a.b", "a b", "a*", "a>", "é"} {
		require.False(t, wire.ValidID(bad), "%q", bad)
	}
	require.True(t, wire.ValidType("invoice.paid:v2"))
	require.False(t, wire.ValidType(strings.Repeat("t", 65)))
	require.False(t, wire.ValidType("has space"))
	require.True(t, wire.ValidEventID("01JD0000000000000000000001"))
	for _, bad := range []string{"", "01JD000000000000000000000", "01JD0000000000000000000001X", "01JD000000000000000000000U", "ZZZZZZZZZZZZZZZZZZZZZZZZZZ",
		"01jd0000000000000000000001", "01JD000000000000000000000a", "01JD000000000000000000000I", "81JD0000000000000000000001"} {
		require.False(t, wire.ValidEventID(bad), "%q", bad)
	}
	require.True(t, wire.ValidEventIDAnyCase("01jd0000000000000000000001"), "archives keep ids stored before v3")
}

// The holder of a subject whose holder part is valid is returned with the
// error about the rest, so that its publisher gets its invalid receipt.
func TestParseInReturnsAValidHolderOfAMalformedSubject(t *testing.T) {
	t.Parallel()
	h, _, _, err := wire.Subjects{}.ParseIn("ledger.in.a.b.3." + strings.Repeat("t", 129))
	require.Error(t, err)
	require.Equal(t, "a.b", h)
	h, _, _, err = wire.Subjects{}.ParseIn("ledger.in.a*.b.3.task")
	require.Error(t, err)
	require.Empty(t, h)
}

// The content token has one definition in every language: this vector is
// sha256sum's, and the TypeScript SDK's tests check the same one.
func TestContentTokenIsTheContractsDigest(t *testing.T) {
	t.Parallel()
	tok := wire.ContentToken("ledger.in.reports.pod-a.3.report-7", "1", "1", "running", []byte(`{"status":"running"}`))
	require.Equal(t, "7638f151d18a50cb6346906d9aecdee2", tok)
	require.NotEqual(t, tok, wire.ContentToken("ledger.in.reports.pod-a.3.report-7", "1", "1", "running", []byte(`{"status":"done"}`)))
	m := wire.Subjects{}.InboundMsg(wire.Inbound{ID: "01JD0000000000000000000001", Partition: 3, Task: "report-7",
		Holder: "reports.pod-a", Generation: 1, Version: 1, Type: "running", Payload: []byte(`{"status":"running"}`)})
	require.Equal(t, "01JD0000000000000000000001:"+tok, m.Header.Get(wire.HeaderMsgID))
	for _, c := range []struct {
		msgID, id, token string
		ok               bool
	}{
		{"01JD0000000000000000000001", "01JD0000000000000000000001", "", true},
		{"01JD0000000000000000000001:abc-_9", "01JD0000000000000000000001", "abc-_9", true},
		{"01JD0000000000000000000001:", "01JD0000000000000000000001", "", false},
		{"01JD0000000000000000000001:a b", "01JD0000000000000000000001", "a b", false},
		{"01JD0000000000000000000001:a:b", "01JD0000000000000000000001", "a:b", false},
		{"01JD0000000000000000000001:" + strings.Repeat("t", 65), "01JD0000000000000000000001", strings.Repeat("t", 65), false},
	} {
		id, token, ok := wire.SplitMsgID(c.msgID)
		require.Equal(t, []any{c.id, c.token, c.ok}, []any{id, token, ok}, c.msgID)
	}
}

func TestPartitionOfIsFNV1a32ModN(t *testing.T) {
	t.Parallel()
	// fnv1a32("report-7") = 0x657aba5f, computed outside Go from the FNV-1a
	// definition (offset basis 0x811c9dc5, prime 0x01000193).
	require.Equal(t, int(uint32(0x657aba5f)%16), wire.PartitionOf("report-7", 16))
	for _, task := range []string{"a", "b", "report-7", strings.Repeat("z", 128)} {
		p := wire.PartitionOf(task, 16)
		require.True(t, p >= 0 && p < 16)
		require.Equal(t, p, wire.PartitionOf(task, 16), "stable")
	}
}

func TestVerdictsAreFinal(t *testing.T) {
	t.Parallel()
	for _, v := range []wire.Verdict{wire.VerdictInvalid, wire.VerdictDuplicate, wire.VerdictStale,
		wire.VerdictConflict, wire.VerdictGap, wire.VerdictCommitted} {
		require.True(t, v.Final(), v)
	}
	require.False(t, wire.Verdict("not_yet").Final())
}
