package testkit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
	"github.com/flowness/ledger/testkit"
)

func TestAWorkerCommitsAndAForcedTakeoverFencesIt(t *testing.T) {
	t.Parallel()
	l := testkit.Start(t, testkit.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	receipts := l.Receipts(t, "reports.a")
	a, err := worker.New(l.Connect(t, worker.InboxOption("reports.a")), worker.Config{Holder: "reports.a", TTL: time.Minute})
	require.NoError(t, err)
	defer a.Close()
	task := "report-7"
	lease, err := a.Acquire(ctx, a.PartitionOf(task))
	require.NoError(t, err)
	p, err := lease.PublishJSON(ctx, task, "running", map[string]int{"pct": 10})
	require.NoError(t, err)
	r := receipts.Wait(t, p.ID())
	require.Equal(t, wire.VerdictCommitted, r.Verdict)
	s := l.WaitProjection(t, task, func(s projection.State) bool { return s.Version == 1 })
	require.Equal(t, "running", s.Status)
	require.JSONEq(t, `{"pct":10}`, string(s.Data))

	l.ForceTakeover(t, lease.Partition())
	b, err := worker.New(l.Connect(t, worker.InboxOption("reports.b")), worker.Config{Holder: "reports.b"})
	require.NoError(t, err)
	defer b.Close()
	taken, err := b.Acquire(ctx, lease.Partition())
	require.NoError(t, err, "the forced expiry lets another holder take the partition at once")
	require.Equal(t, lease.Generation()+1, taken.Generation())

	late, err := lease.PublishJSON(ctx, task, "running", map[string]int{"pct": 20}) // its local deadline is far off
	require.NoError(t, err)
	r = receipts.Wait(t, late.ID())
	require.Equal(t, wire.VerdictStale, r.Verdict, "the old holder's write is fenced")
	var rej *worker.RejectedError
	require.True(t, errors.As(late.Wait(ctx), &rej))
	require.NoError(t, taken.Release(ctx))
}

func TestForceTakeoverOfAPartitionNeverLeasedFailsTheTest(t *testing.T) {
	t.Parallel()
	l := testkit.Start(t, testkit.Options{})
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		l.ForceTakeover(ft, 3)
	}()
	require.True(t, ft.failed, "a takeover of nothing is a mistake in the test, reported")
}

// fakeT records a Fatalf instead of ending the test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(string, ...any) {
	f.failed = true
	panic("fatal")
}
