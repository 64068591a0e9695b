package fence

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// What a commit survives, from the settings the database reports.
func TestDurabilityLevelFromSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		fsync, commit, standbys string
		want                    DurabilityLevel
	}{
		{"off", "on", "", DurabilityNone},
		{"on", "off", "FIRST 1 (b)", DurabilityNone},
		{"on", "on", "", DurabilityLocal},
		{"on", "local", "FIRST 1 (b)", DurabilityLocal},
		{"on", "remote_write", "FIRST 1 (b)", DurabilityLocal},
		{"on", "on", "FIRST 1 (b)", DurabilitySync},
		{"on", "remote_apply", "ANY 1 (b, c)", DurabilitySync},
	} {
		d := Durability{Fsync: c.fsync, SynchronousCommit: c.commit, SynchronousStandbyNames: c.standbys}
		require.Equal(t, c.want, d.level(), "%+v", c)
	}
	require.True(t, DurabilitySync.Meets(DurabilityLocal))
	require.False(t, DurabilityLocal.Meets(DurabilitySync))
	require.True(t, DurabilityNone.Meets(DurabilityNone))
}
