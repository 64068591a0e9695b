package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// The checker reads a log batch as its events, in order, each at the
// batch's stream sequence; a batch that does not decode is one copy that
// says why, which the check reports.
func TestParseCopiesReadsALogBatch(t *testing.T) {
	subj := wire.Subjects{}
	at := time.Now()
	copies := []wire.LogCopy{
		{Seq: 7, EventID: "01JD0000000000000000000007", Partition: 4, Task: "a", Version: 3, Type: "x", Holder: "w.1", Generation: 2, CommittedAt: at},
		{Seq: 8, EventID: "01JD0000000000000000000008", Partition: 4, Task: "b", Version: 1, Type: "y", Holder: "w.1", Generation: 2, CommittedAt: at,
			WouldReject: "stale/" + wire.ReasonSuperseded},
	}
	msgs, err := subj.LogBatchMsgs(copies, 1<<20)
	require.NoError(t, err)
	m := msgs[0]
	got := parseCopies(subj, 42, m.Subject, m.Header, m.Data)
	require.Len(t, got, 2)
	for i, c := range got {
		require.Empty(t, c.Err)
		require.Equal(t, uint64(42), c.StreamSeq)
		require.Equal(t, Copy{StreamSeq: 42, Subject: m.Subject, EventID: copies[i].EventID, Task: copies[i].Task, Partition: 4,
			Version: copies[i].Version, Seq: copies[i].Seq, Type: copies[i].Type, Holder: "w.1", Generation: 2,
			WouldReject: copies[i].WouldReject}, c)
	}
	m.Header.Set(wire.HeaderBatch, "5")
	got = parseCopies(subj, 43, m.Subject, m.Header, m.Data)
	require.Len(t, got, 1)
	require.Contains(t, got[0].Err, "holds 2")
}
