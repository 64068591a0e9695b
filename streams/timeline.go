package streams

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// TimelineKey is the key of the bucket wire.BucketWitness that holds the
// newest PostgreSQL WAL timeline the ledger has written to (the ingest
// records it; fence.PrimaryGuard refuses an older one).
const TimelineKey = "timeline"

// WitnessedTimeline reads the newest timeline recorded in kv, the bucket
// wire.BucketWitness (0: none yet), and the key's revision.
func WitnessedTimeline(ctx context.Context, kv jetstream.KeyValue) (int64, uint64, error) {
	e, err := kv.Get(ctx, TimelineKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, 0, nil
	case err != nil:
		return 0, 0, fmt.Errorf("read the witnessed timeline: %w", err)
	}
	tl, err := strconv.ParseInt(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("the witnessed timeline is %q: %w", e.Value(), err)
	}
	return tl, e.Revision(), nil
}
