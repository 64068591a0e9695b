package ingest_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// A last LEDGER_LOG copy that does not read (forged: only the ingest and an
// operator may publish there) must not wedge the lane that needs it to tell
// which earlier copies are missing: the ingest publishes the task's earlier
// versions again and commits on, and nobody else waits.
func TestUnreadableLastLogCopyDoesNotWedgeTheLane(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	cfg, rc, ev := e.ingestDiedBeforeCopy("forged")

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
	require.Equal(t, []string{"not a number", "1", "2"}, e.logVersions(8, "forged"), "every earlier version is stored again before version 2")
}
