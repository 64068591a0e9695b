package projector_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// A snapshot task's log copies (Ledger-Kind: snapshot) skip versions: the
// projection shows the newest snapshot at once, with no gap and without
// waiting out the gap timeout, and an older copy arriving late (a
// redelivery of version 3 after version 7) changes nothing.
func TestSnapshotTaskProjectsTheNewestSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(projector.Config{Engine: projection.Config{GapTimeout: time.Hour}})
	v3 := committed{id: "01JD0000000000000000000S03", seq: 10, partition: 4, task: "gauge-1", version: 3, typ: "state",
		payload: `{"temp":20,"unit":"C"}`}
	v7 := committed{id: "01JD0000000000000000000S07", seq: 14, partition: 4, task: "gauge-1", version: 7, typ: "state",
		payload: `{"temp":23}`}
	e.publishSnapshot(v3)
	e.publishSnapshot(v7)
	st := e.waitState("gauge-1", 10*time.Second, func(s projection.State) bool { return s.Version == 7 })
	require.Nil(t, st.Gap, "a snapshot task waits for nothing")
	require.Equal(t, projection.KindSnapshot, st.Kind)
	jsonEq(t, []byte(v7.payload), st.Data, "the projection is the newest snapshot, not a merge")
	require.EqualValues(t, 14, st.Seq)

	e.publishSnapshot(v3)
	marker := committed{id: "01JD0000000000000000000M01", seq: 20, partition: 4, task: "marker-1", version: 1, typ: "state",
		payload: `{}`}
	e.publishSnapshot(marker) // copies of one partition are folded in order: once it shows, v3 was seen
	e.waitState("marker-1", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	st, ok := e.state("gauge-1")
	require.True(t, ok)
	require.EqualValues(t, 7, st.Version, "an older snapshot arriving late is ignored")
	jsonEq(t, []byte(v7.payload), st.Data, "the data stays the newest snapshot's")
}

// publishSnapshot publishes c's copy as a snapshot task's.
func (e *env) publishSnapshot(c committed) {
	e.t.Helper()
	lc := c.logCopy()
	lc.Snapshot = true
	m := e.subj.LogMsg(lc)
	// A redelivered copy is a new message (the dedup window would drop it).
	m.Header.Set(wire.HeaderMsgID, c.id+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	_, err := e.js.PublishMsg(context.Background(), m)
	require.NoError(e.t, err)
}
