package streams

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

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

// TimelineFollow is how often a running service reads the newest timeline
// recorded (FollowTimeline).
const TimelineFollow = 250 * time.Millisecond

// FollowTimeline calls raise with the newest timeline recorded in the
// bucket that open opens (wire.BucketWitness), every TimelineFollow until
// ctx ends. A service still connected to an old primary that is writable
// again after a failover so stops using it within one interval of an
// ingest's first write on the new primary. The bucket may not exist yet
// (no ingest has started): it is opened again at the next tick. A failed
// read goes to failed (nil: ignored), once until a read succeeds again.
func FollowTimeline(ctx context.Context, open func(context.Context) (jetstream.KeyValue, error),
	raise func(int64), failed func(error)) {
	t := time.NewTicker(TimelineFollow)
	defer t.Stop()
	var kv jetstream.KeyValue
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if kv == nil {
			kv, err = open(ctx)
		}
		var tl int64
		if err == nil {
			tl, _, err = WitnessedTimeline(ctx, kv)
		}
		switch {
		case err == nil:
			raise(tl)
			warned = false
		case errors.Is(err, jetstream.ErrBucketNotFound):
			// No ingest has run yet: nothing was written anywhere.
		case !warned && failed != nil && ctx.Err() == nil:
			failed(err)
			warned = true
		}
	}
}
