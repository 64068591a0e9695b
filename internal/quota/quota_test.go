package quota

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A principal spends its bytes, is refused beyond them without being
// charged, and gets them back at its size an hour; another principal's
// share is its own.
func TestAPrincipalSpendsItsShareAndGetsItBack(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	q := NewBytes(1000)
	q.now = func() time.Time { return now }
	require.True(t, q.Take("billing", 600))
	require.True(t, q.Take("billing", 400))
	require.False(t, q.Take("billing", 1), "spent")
	require.True(t, q.Take("reports", 1000), "another principal's share is its own")
	now = now.Add(36 * time.Minute) // 600 bytes back
	require.False(t, q.Take("billing", 700))
	require.True(t, q.Take("billing", 600))
	now = now.Add(10 * time.Hour)
	require.True(t, q.Take("billing", 1000), "never more than its size")
	require.False(t, q.Take("billing", 1))
}
