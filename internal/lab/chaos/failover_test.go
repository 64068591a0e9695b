package chaos_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/lab/chaos"
	"github.com/flowness/ledger/internal/pgtemp"
)

func TestFailoverMeasuresTheStandbysFirstCommitAndCountsPausesPastTheTTL(t *testing.T) {
	bin, _ := build(t)
	const ttl = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	rep, err := chaos.RunFailover(ctx, chaos.FailoverOptions{Bin: bin, TTLs: []time.Duration{ttl}, Trials: 2,
		Pauses: []time.Duration{100 * time.Millisecond, 2 * time.Second}, PauseTrials: 1, Progress: testWriter{t}})
	if errors.Is(err, pgtemp.ErrNotInstalled) {
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: ", err)
	}
	require.NoError(t, err)
	t.Logf("measured in %v", time.Since(began).Round(100*time.Millisecond))
	require.Len(t, rep.TTLs, 1)
	r := rep.TTLs[0]

	assert.Zero(t, r.Missed, "kills without a failover")
	require.Len(t, r.Kills, 2, "a failover time of every kill")
	for _, k := range r.Kills {
		assert.NotEqual(t, k.Killed, k.Standby, "the standby took over, not the killed writer")
		// The standby can be granted the partition only once the killed
		// holder's lease expired, at least 2/3 TTL after its last renewal
		// (every TTL/3); a measurement that read the killed holder's own
		// last events would come out near zero.
		assert.Greater(t, k.GrantMillis, float64(ttl.Milliseconds())/3, "grant after the lease expired: %+v", k)
		assert.GreaterOrEqual(t, k.FailoverMillis, k.GrantMillis, "first commit after the grant: %+v", k)
		assert.Less(t, k.FailoverMillis, float64(10*ttl.Milliseconds()), "failover within 10 TTLs: %+v", k)
	}
	assert.Equal(t, 2, r.Failover.N)
	assert.Positive(t, r.Failover.P50)

	require.Len(t, r.Pauses, 2)
	short, long := r.Pauses[0], r.Pauses[1]
	assert.Equal(t, chaos.PauseResult{PauseMillis: 100, Trials: 1}, short,
		"a 100 ms pause is well inside a 500 ms lease's last two thirds: no takeover")
	assert.Equal(t, chaos.PauseResult{PauseMillis: 2000, Trials: 1, Takeovers: 1, Lost: 1}, long,
		"a 2 s pause outlasts a 500 ms lease: the standby takes over")

	assert.InDelta(t, 6.0, r.RenewalsPerSecond, 1e-9, "3/TTL")
	assert.Positive(t, r.Renewal.N)
	assert.Positive(t, r.Renewal.RoundTripMicros)
	assert.Empty(t, rep.Dir, "a measurement without a missed failover removes its logs")
}
