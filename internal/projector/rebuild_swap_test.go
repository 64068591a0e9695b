package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
)

// projectAll runs a live projector until every task of seedLog(tasks,
// versions) is projected, then stops it, and returns the bucket's values.
func (e *env) projectAll(tasks, versions int) map[string]projection.State {
	e.t.Helper()
	live := e.start(projector.Config{})
	for task := 1; task <= tasks; task++ {
		e.waitState(fmt.Sprintf("task-%d", task), 30*time.Second, func(s projection.State) bool { return s.Version == int64(versions) })
	}
	live.Stop()
	before := e.snapshot()
	require.Len(e.t, before, tasks)
	return before
}

// A rebuild that fails midway (here: stopped after its first chunk) leaves
// readers every projection they had, and the next projector resumes.
func TestFailedRebuildLeavesEveryProjection(t *testing.T) {
	t.Parallel()
	const tasks, versions = 40, 5
	e := newEnv(t)
	e.seedLog(tasks, versions)
	before := e.projectAll(tasks, versions)

	p := e.newProjector(projector.Config{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := p.Rebuild(ctx, func(projector.Progress) {
		require.Len(t, e.snapshot(), tasks, "readers keep every projection while the rebuild runs")
		cancel()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, before, e.snapshot(), "a failed rebuild changes nothing readers see")

	// The projector that starts afterwards still serves, and resumes live.
	p2 := e.start(projector.Config{})
	defer p2.Stop()
	next := e.commit(1, "task-1", []string{"reopened"}, []string{`{"again":true}`})
	e.publishLog(next[0])
	e.waitState("task-1", 10*time.Second, func(s projection.State) bool { return s.Version == versions+1 })
}

// A rebuild sets its scans' own statement_timeout: a provider's short
// default for the database does not cut it short.
func TestRebuildOutlastsAShortServerStatementTimeout(t *testing.T) {
	t.Parallel()
	const tasks, versions = 20, 3
	e := newEnv(t)
	e.seedLog(tasks, versions)
	before := e.projectAll(tasks, versions)

	ctx := context.Background()
	_, err := e.db.Pool.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET statement_timeout = '200ms'`, pgx.Identifier{e.db.Name}.Sanitize()))
	require.NoError(t, err)
	e.db.Pool.Reset() // new sessions get the database's setting
	// A transaction holds the events table locked for longer than the
	// server's timeout; the rebuild's scan waits for it.
	tx, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL statement_timeout = 0`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE ledger.events IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(time.Second)
		_ = tx.Rollback(context.Background())
	}()
	p := e.newProjector(projector.Config{}, nil)
	require.NoError(t, p.Rebuild(ctx, nil))
	<-released
	require.Equal(t, len(before), len(e.snapshot()))
}
