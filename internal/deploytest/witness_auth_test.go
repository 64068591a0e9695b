package deploytest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// The projector reads the ingests' record of the newest PostgreSQL
// timeline (so that its pool refuses an old primary back after a
// failover: projector.Deps.Primary), and cannot write it. Switch: the
// projector role without msgGetAPI(kvWitness) and its STREAM.INFO
// (natsauth, roles.go); the read fails.
func (s *authStack) projectorReadsTheWitnessedTimeline(t *testing.T) {
	js, err := jetstream.New(s.projectorNC.Conn)
	require.NoError(t, err)
	kv, err := js.KeyValue(s.ctx, wire.BucketWitness)
	require.NoError(t, err)
	before, _, err := streams.WitnessedTimeline(s.ctx, kv)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	_, err = kv.PutString(ctx, streams.TimelineKey, "99")
	require.Error(t, err, "the projector wrote the record")
	after, _, err := streams.WitnessedTimeline(s.ctx, kv)
	require.NoError(t, err)
	require.Equal(t, before, after)
}
