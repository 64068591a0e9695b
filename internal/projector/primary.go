package projector

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// timelineFollow is how often the projector reads the newest timeline the
// ingests recorded (followTimeline).
const timelineFollow = 250 * time.Millisecond

// followTimeline raises Deps.Primary to the newest PostgreSQL timeline the
// ingests recorded in ledger_witness, every timelineFollow until ctx ends.
// After a failover that left the old primary writable, the projector's
// pool then drops its connections to it and refuses new ones, so its gap
// re-fetches and its reconciliation read the newest primary, which holds
// the commits the log copies are of. The bucket may not exist yet (no
// ingest has started): it is looked up again at the next tick.
func (s *Service) followTimeline(ctx context.Context) {
	t := time.NewTicker(timelineFollow)
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
			kv, err = s.js.KeyValue(ctx, wire.BucketWitness)
		}
		var tl int64
		if err == nil {
			tl, _, err = streams.WitnessedTimeline(ctx, kv)
		}
		switch {
		case err == nil:
			s.primary.Raise(tl)
			warned = false
		case errors.Is(err, jetstream.ErrBucketNotFound):
			// No ingest has run yet: nothing was written anywhere.
		case !warned && ctx.Err() == nil:
			s.log.Warn("cannot read the newest PostgreSQL timeline the ingests recorded; trying again",
				slog.String("bucket", wire.BucketWitness), slog.String("error", err.Error()))
			warned = true
		}
	}
}
