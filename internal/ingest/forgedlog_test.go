package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// A last LEDGER_LOG copy that does not read (forged: only the ingest and an
// operator may publish there) must not wedge the lane that needs it to tell
// which earlier copies are missing: the ingest publishes the task's earlier
// versions again and commits on, and nobody else waits.
func TestUnreadableLastLogCopyDoesNotWedgeTheLane(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	cfg := ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second}
	_, p1conn := e.startIngestOn(ingest.WithTestHooks(cfg, ingest.TestHooks{DropCopy: func(*nats.Msg) bool { return true }}), e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(8, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 8, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	e.publish(ev("forged", 1))
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM ledger.events`) == 1 }, 10*time.Second, 10*time.Millisecond)
	p1conn.Close() // dies with version 1 committed and its copy not stored

	// Something that is not a copy, as the task's last message in LEDGER_LOG.
	junk := nats.NewMsg(e.subj.Log(8, "forged"))
	junk.Header.Set(wire.HeaderVersion, "not a number")
	junk.Data = []byte("junk")
	_, err := e.js.PublishMsg(context.Background(), junk)
	require.NoError(t, err)

	e.startIngestOn(cfg, e.store)
	v2, other := ev("forged", 2), ev("bystander", 1)
	e.publish(v2)
	e.publish(other)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, v2.id).Verdict, "the lane is wedged on the junk copy")
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, other.id).Verdict)
	var versions []string
	for _, m := range e.streamMsgs(wire.StreamLog, e.subj.Log(8, "forged")) {
		versions = append(versions, m.Headers().Get(wire.HeaderVersion))
	}
	require.Equal(t, []string{"not a number", "1", "2"}, versions, "every earlier version is stored again before version 2")
}
