package projector

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// followTimeline raises Deps.Primary to the newest PostgreSQL timeline the
// ingests recorded in ledger_witness (streams.FollowTimeline) until ctx
// ends. After a failover that left the old primary writable, the
// projector's pool then drops its connections to it and refuses new ones,
// so its gap re-fetches and its reconciliation read the newest primary,
// which holds the commits the log copies are of.
func (s *Service) followTimeline(ctx context.Context) {
	open := func(ctx context.Context) (jetstream.KeyValue, error) { return s.js.KeyValue(ctx, wire.BucketWitness) }
	streams.FollowTimeline(ctx, open, s.primary.Raise, func(err error) {
		s.log.Warn("cannot read the newest PostgreSQL timeline the ingests recorded; trying again",
			slog.String("bucket", wire.BucketWitness), slog.String("error", err.Error()))
	})
}
