package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// A task belongs to the principal that wrote its version 1: billing, which
// took the partition over after reports released it, cannot write reports'
// task (invalid/not_owner, recorded, so the verdict lookup answers it too),
// whether the append decides from heads it cached (the store that
// committed the task) or reads them (a fresh store, and the careful path
// alone). Its own new task is its own. A deployment that shares tasks says
// so (Config.SharedTasks), and then billing's event commits.
func TestAnotherPrincipalCannotWriteATask(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name              string
		fresh, careful    bool
		shared, committed bool
	}{
		{name: "heads cached"},
		{name: "heads read", fresh: true},
		{name: "careful path", careful: true},
		{name: "shared tasks by configuration", shared: true, committed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, db := newStore(t, fence.Config{SharedTasks: c.shared})
			if c.careful {
				s = fence.WithoutFastPath(s)
			}
			a, err := s.Acquire(ctx, 1, "reports.a", time.Minute)
			require.NoError(t, err)
			for v := int64(1); v <= 2; v++ {
				require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(a, "report-7", v, "running")).Verdict)
			}
			head, err := s.TaskHead(ctx, "report-7")
			require.NoError(t, err)
			require.Equal(t, "reports", head.Owner)

			require.NoError(t, s.Release(ctx, 1, "reports.a", a.Generation))
			b, err := s.TakeOver(ctx, 1, "billing.x", a.Generation, time.Minute)
			require.NoError(t, err)
			writer := s
			if c.fresh {
				writer, err = fence.New(db.Pool, fence.Config{SharedTasks: c.shared})
				require.NoError(t, err)
			}
			foreign := ev(b, "report-7", 3, "completed")
			r := appendOne(t, writer, foreign)
			head, err = s.TaskHead(ctx, "report-7")
			require.NoError(t, err)
			if c.committed {
				require.Equal(t, wire.VerdictCommitted, r.Verdict)
				require.EqualValues(t, 3, head.Version)
				return
			}
			require.Equal(t, wire.VerdictInvalid, r.Verdict)
			require.Equal(t, wire.ReasonNotOwner, r.Reason)
			require.Contains(t, r.Detail, "reports")
			require.EqualValues(t, 2, head.Version, "nothing of billing's was committed")
			rec, ok, err := s.Verdict(ctx, "report-7", foreign.ID)
			require.NoError(t, err)
			require.True(t, ok, "the verdict lookup answers it")
			require.Equal(t, wire.VerdictInvalid, rec.Verdict)
			require.Equal(t, wire.ReasonNotOwner, rec.Reason)
			again := appendOne(t, writer, foreign)
			require.Equal(t, wire.ReasonNotOwner, again.Reason, "a redelivery gets the same verdict")

			require.Equal(t, wire.VerdictCommitted, appendOne(t, writer, ev(b, "invoice-1", 1, "running")).Verdict)
			own, err := s.TaskHead(ctx, "invoice-1")
			require.NoError(t, err)
			require.Equal(t, "billing", own.Owner)
		})
	}
}
