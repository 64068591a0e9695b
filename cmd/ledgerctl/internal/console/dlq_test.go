package console

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// A dead-letter list keeps exactly the letters its filter names: each field
// narrows on its own, fields combine, and the stream read is narrowed to
// the partition and task asked for.
func TestDLQFilterKeepsExactlyTheLettersItNames(t *testing.T) {
	t.Parallel()
	p := func(n int) *int { return &n }
	now := time.Now().UTC()
	at := func(ago time.Duration) string { return wire.FormatTime(now.Add(-ago)) }
	letters := []DeadLetter{
		{Seq: 1, Partition: p(1), Task: "a", Holder: "w.1", Verdict: "stale", Reason: "superseded", RejectedAt: at(2 * time.Hour)},
		{Seq: 2, Partition: p(1), Task: "b", Holder: "w.2", Verdict: "gap", Reason: "gap_timeout", RejectedAt: at(30 * time.Minute)},
		{Seq: 3, Partition: p(2), Task: "a", Holder: "w.1", Verdict: "conflict", Reason: "version_taken", RejectedAt: at(5 * time.Minute)},
		{Seq: 4, Partition: nil, Task: "", Holder: "", Verdict: "invalid", Reason: "bad_subject", RejectedAt: at(time.Minute)},
		{Seq: 5, Partition: p(2), Task: "c", Holder: "w.2", Verdict: "stale", Reason: "lease_expired", RejectedAt: at(10 * time.Second)},
	}
	for _, tc := range []struct {
		query string
		want  []uint64
	}{
		{"", []uint64{1, 2, 3, 4, 5}},
		{"verdict=stale", []uint64{1, 5}},
		{"reason=gap_timeout", []uint64{2}},
		{"partition=1", []uint64{1, 2}},
		{"partition=0", nil},
		{"task=a", []uint64{1, 3}},
		{"holder=w.2", []uint64{2, 5}},
		{"since=10m", []uint64{3, 4, 5}},
		{"until=1h", []uint64{1}},
		{"since=" + url.QueryEscape(at(time.Hour)) + "&until=" + url.QueryEscape(at(2*time.Minute)), []uint64{2, 3}},
		{"verdict=stale&partition=2", []uint64{5}},
		{"task=a&holder=w.1&partition=2", []uint64{3}},
	} {
		v, err := url.ParseQuery(tc.query)
		require.NoError(t, err)
		q, err := parseDLQQuery(v)
		require.NoError(t, err, tc.query)
		var got []uint64
		for _, d := range letters {
			if q.match(d) {
				got = append(got, d.Seq)
			}
		}
		require.Equal(t, tc.want, got, "?%s", tc.query)
	}

	subj := wire.Subjects{Prefix: "ledger"}
	for query, want := range map[string]string{
		"":                   "ledger.dlq.>",
		"partition=3":        "ledger.dlq.3.*",
		"task=t-1":           "ledger.dlq.*.t-1",
		"partition=3&task=x": "ledger.dlq.3.x",
	} {
		v, _ := url.ParseQuery(query)
		q, err := parseDLQQuery(v)
		require.NoError(t, err)
		require.Equal(t, want, q.subject(subj), "?%s", query)
	}
}

// A list shows the newest letters it matched, newest first, however many
// it read.
func TestDLQListKeepsTheNewestLetters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		read, show int
		want       []uint64
	}{
		{0, 3, []uint64{}},
		{2, 3, []uint64{2, 1}},
		{3, 3, []uint64{3, 2, 1}},
		{7, 3, []uint64{7, 6, 5}},
		{9, 3, []uint64{9, 8, 7}},
		{5, 1, []uint64{5}},
	} {
		l := &dlqList{Query: dlqQuery{Partition: -1}}
		for seq := 1; seq <= tc.read; seq++ {
			l.add(DeadLetter{Seq: uint64(seq), Verdict: "stale", Reason: "superseded"}, tc.show)
		}
		got := []uint64{}
		for _, d := range l.Letters() {
			got = append(got, d.Seq)
		}
		require.Equal(t, tc.want, got, "%d read, %d shown", tc.read, tc.show)
		require.Equal(t, tc.read, l.Matched)
	}
}
