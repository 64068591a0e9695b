package ingest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// The LEDGER_LOG copy carries exactly the headers of CONTRACT §4, each with
// its own value (they are cut from shared buffers).
func TestLogCopyCarriesTheContractHeaders(t *testing.T) {
	t.Parallel()
	s := &Service{subjects: wire.Subjects{Prefix: "acme"}}
	at := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	c := &fence.Committed{Seq: 1234567890123, EventID: "01JD0000000000000000000001", Partition: 15, Task: "report-7",
		Version: 42, Type: "progress", Payload: []byte(`{"step":3}`), Holder: "worker-b", Generation: 987654321, CommittedAt: at}
	m := s.logCopy(c)
	require.Equal(t, "acme.log.15.report-7", m.Subject)
	require.Equal(t, `{"step":3}`, string(m.Data))
	want := map[string]string{
		wire.HeaderMsgID:       "01JD0000000000000000000001",
		wire.HeaderSeq:         "1234567890123",
		wire.HeaderTask:        "report-7",
		wire.HeaderPartition:   "15",
		wire.HeaderVersion:     "42",
		wire.HeaderType:        "progress",
		wire.HeaderHolder:      "worker-b",
		wire.HeaderGeneration:  "987654321",
		wire.HeaderCommittedAt: wire.FormatTime(at),
	}
	require.Len(t, m.Header, len(want))
	for k, v := range want {
		require.Equal(t, []string{v}, m.Header.Values(k), k)
	}
	// A value appended to one header must not show up in another.
	m.Header.Add(wire.HeaderSeq, "extra")
	require.Equal(t, []string{"report-7"}, m.Header.Values(wire.HeaderTask))
}
