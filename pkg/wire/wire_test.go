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
		partition int
		task      string
		ok        bool
	}{
		{"ledger.in.3.report-7", 3, "report-7", true},
		{"ledger.in.0.A_b-9", 0, "A_b-9", true},
		{"ledger.in.3", 0, "", false},
		{"ledger.in.3.a.b", 0, "", false},
		{"ledger.in.x.task", 0, "", false},
		{"ledger.in.-1.task", 0, "", false},
		{"ledger.in.+1.task", 0, "", false},
		{"ledger.log.3.task", 0, "", false},
		{"other.in.3.task", 0, "", false},
		{"ledger.in.3." + strings.Repeat("t", 129), 0, "", false},
		{"ledger.in.003.task", 0, "", false},
		{"ledger.in.00.task", 0, "", false},
		{"ledger.in.10.task", 10, "task", true},
	} {
		p, task, err := s.ParseIn(c.subject)
		if !c.ok {
			require.Error(t, err, c.subject)
			continue
		}
		require.NoError(t, err, c.subject)
		require.Equal(t, c.partition, p, c.subject)
		require.Equal(t, c.task, task, c.subject)
	}
	p, task, err := wire.Subjects{Prefix: "acme"}.ParseLog("acme.log.5.t")
	require.NoError(t, err)
	require.Equal(t, 5, p)
	require.Equal(t, "t", task)
	p, task, err = wire.Subjects{Prefix: "acme"}.ParseDLQ("acme.dlq.7.job-1")
	require.NoError(t, err)
	require.Equal(t, 7, p)
	require.Equal(t, "job-1", task)
	for _, bad := range []string{"acme.dlq.invalid", "acme.dlq.7", "acme.dlq.x.t", "acme.log.7.t", "ledger.dlq.7.t"} {
		_, _, err := wire.Subjects{Prefix: "acme"}.ParseDLQ(bad)
		require.Error(t, err, bad)
	}
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
	for _, bad := range []string{"", "01JD000000000000000000000", "01JD0000000000000000000001X", "01JD000000000000000000000U", "ZZZZZZZZZZZZZZZZZZZZZZZZZZ"} {
		require.False(t, wire.ValidEventID(bad), "%q", bad)
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
