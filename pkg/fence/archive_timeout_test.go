package fence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
)

// The archive sets its statements' own statement_timeout: a provider's
// short default for the database does not cut it short while it waits for
// a lock.
func TestArchiveOutlastsAShortServerStatementTimeout(t *testing.T) {
	t.Parallel()
	r := newArchiveRig(t)
	ctx := context.Background()
	fill(t, r, 250)
	_, err := r.db.Pool.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET statement_timeout = '200ms'`, pgx.Identifier{r.db.Name}.Sanitize()))
	require.NoError(t, err)
	r.db.Pool.Reset() // new sessions get the database's setting
	tx, err := r.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL statement_timeout = 0`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE ledger.event_ids IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(time.Second)
		_ = tx.Rollback(context.Background())
	}()
	rep, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
	<-released
	require.NoError(t, err)
	require.Len(t, rep.Files, 2)
}
