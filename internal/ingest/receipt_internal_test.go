package ingest

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Receipts are hand-encoded; they must be the JSON of wire.Receipt for any
// id an invalid message may carry.
func TestReceiptJSONIsTheReceipt(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"01JD0000000000000000000001", "", "quote\"and\\slash", "ctl\x00\x01\x1f", "ünïcødé", "\xff\xfe"} {
		in := &inbound{event: fence.Event{ID: id, Task: "report-7", Partition: 3, Version: 2, Generation: 41},
			result: fence.Result{Verdict: wire.VerdictStale, Reason: wire.ReasonSuperseded, Seq: 9, CurrentGeneration: 42}}
		b := receiptJSON(in)
		require.True(t, json.Valid(b), "%q gave %s", id, b)
		var got wire.Receipt
		require.NoError(t, json.Unmarshal(b, &got))
		want := wire.Receipt{EventID: id, Task: "report-7", Partition: 3, Version: 2, Verdict: wire.VerdictStale,
			Reason: wire.ReasonSuperseded, Seq: 9, Generation: 41, CurrentGeneration: 42}
		if id == "\xff\xfe" {
			want.EventID = "\ufffd\ufffd" // invalid UTF-8 is replaced, as encoding/json does
		}
		require.Equal(t, want, got)
	}
}
