package chaos_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/lab/chaos"
)

// failoverRun is a short run with one PostgreSQL failover, 4.5 to 9 s in:
// four partitions, writers' SIGSTOPs, no other fault.
func failoverRun(bin, ingestBin, replication string, splitBrain bool) chaos.Options {
	return chaos.Options{Bin: bin, IngestBin: ingestBin, Replication: replication, SplitBrain: splitBrain,
		Duration: 15 * time.Second, PGFailoverEvery: time.Minute, Partitions: 4, Rate: 100,
		KillIngestEvery: chaos.Off, NATSRestartEvery: chaos.Off, Show: 2}
}

// A real streaming standby promoted under load, in the three ways
// production fails over: nothing receipted is lost, no generation is given
// twice, nothing commits on the old primary. The synchronous failover is
// the split brain's first half, so one run covers both.
func TestPGFailoverBreaksNoPromise(t *testing.T) {
	bin, _ := build(t)
	for _, c := range []struct {
		name        string
		replication string
		splitBrain  bool
	}{
		{"asynchronous standby frozen behind", chaos.ReplicationAsync, false},
		{"synchronous standby, old primary back writable, first in the URL", chaos.ReplicationSync, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := runChaos(t, failoverRun(bin, "", c.replication, c.splitBrain))
			r := res.Report
			assert.Zero(t, r.Total(), "violations: %v\n%s", r.Counts, res.Summary)
			require.Len(t, res.PGFailovers, 1, res.Summary)
			f := res.PGFailovers[0]
			t.Logf("failover: %+v", f)
			assert.Positive(t, f.Resumed, "commits resumed on the new primary")
			assert.Positive(t, f.Judged, "the ingests judged events again")
			assert.Positive(t, r.Commits, res.Summary)
			assert.Positive(t, r.StaleSends, "no writer sent after a takeover: %s", res.Summary)
			if c.replication == chaos.ReplicationAsync {
				// The fault did what it claims: the standby lacked
				// acknowledged commits and a grant, the ingest said so,
				// and the operator's restore put every commit back.
				assert.Positive(t, f.LagBytes, "the standby was behind")
				assert.Positive(t, f.Noticed, "an ingest's /readyz failed its memory check")
				assert.Positive(t, f.Forgotten, "the promoted standby forgot acknowledged commits")
				assert.Equal(t, f.Forgotten, f.Restored, "ledgerctl restore wrote back every one")
				assert.Positive(t, r.ForgottenGrants, "a grant was lost with the tail: %s", res.Summary)
			}
			if c.splitBrain {
				assert.Positive(t, f.Refusals, "the services tried the old primary and refused it")
			}
		})
	}
}

// The negative control: with the ingest built with -tags ledger_noguards
// (no memory check, no generation witness, no primary guard), the same
// faults lose receipted commits and commit on the old primary, and the
// checker counts them.
func TestPGFailoverWithoutTheGuardsBreaksPromises(t *testing.T) {
	bin, _ := build(t)
	o := failoverRun(bin, binaries.noguards, chaos.ReplicationAsync, true)
	o.DrainTimeout = 15 * time.Second // what is lost stays lost: no need to wait for it
	o.RestoreWait = 5 * time.Second   // nothing reports the loss: no need to wait for that either
	res := runChaos(t, o)
	r := res.Report
	assert.Positive(t, r.Counts[chaos.ReceiptedMissing], "the checker missed commits the database forgot: %s", res.Summary)
	assert.Positive(t, r.Counts[chaos.SupersededCommit], "the checker missed commits on the old primary: %s", res.Summary)
	if res.Dir != "" {
		os.RemoveAll(res.Dir)
	}
}
