package streams_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// A bucket is asked for by the name it has in NATS, and its definition is
// the one of that very bucket.
func TestBucketIsFoundByItsName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{wire.BucketTasks, wire.BucketProjector} {
		cfg, err := streams.Bucket(name, streams.Options{Replicas: 3})
		require.NoError(t, err, name)
		require.Equal(t, name, cfg.Bucket)
		require.Equal(t, 3, cfg.Replicas, "the deployment's replica count wins over the file's")
	}
}

// A file stem is not a bucket's name: asking by it is an error, not another
// bucket.
func TestBucketByAnUnknownNameIsAnError(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"tasks", "projector", "", "KV_ledger_tasks"} {
		_, err := streams.Bucket(name, streams.Options{})
		require.Error(t, err, "%q", name)
	}
}
