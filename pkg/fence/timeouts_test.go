package fence_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
)

// The store's transactions keep a stricter timeout the session already has
// (a provider's, for the role or database) instead of raising it to their
// own; without one, or with a laxer one, they set their own.
func TestStricterSessionTimeoutsAreKept(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	for _, c := range []struct {
		name                  string
		session, want         string // the session's value, and the transaction's
		statement, idleInTxMs string // the store's, in ms
	}{
		{"stricter session is kept", "5s", "5s", "30000", "30000"},
		{"no session timeout", "0", "30s", "30000", "30000"},
		{"laxer session is lowered", "1min", "30s", "30000", "30000"},
		{"store's disabled keeps the session's", "5s", "5s", "0", "0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, `SELECT set_config('statement_timeout', $1, false), set_config('idle_in_transaction_session_timeout', $1, false)`, c.session)
			require.NoError(t, err)
			defer conn.Exec(ctx, `RESET statement_timeout; RESET idle_in_transaction_session_timeout`) //nolint:errcheck
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck
			_, err = tx.Exec(ctx, fence.SetTimeoutsSQL, c.statement, c.idleInTxMs)
			require.NoError(t, err)
			var st, idle string
			require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout')`).Scan(&st, &idle))
			require.Equal(t, c.want, st)
			require.Equal(t, c.want, idle)
		})
	}
}
