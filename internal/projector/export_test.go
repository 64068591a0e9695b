package projector

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// Prepare readies s as Start does but starts no loop, so that a test can
// drive turns one by one with Turn, on messages it fetched itself.
func (s *Service) Prepare(ctx context.Context) (jetstream.Consumer, error) {
	if err := s.prepare(ctx); err != nil {
		return nil, err
	}
	cons, err := s.consumer(ctx, jetstream.DeliverAllPolicy, 0)
	if err != nil {
		return nil, err
	}
	return cons, s.resumeGaps(ctx)
}

// Turn handles one batch as the run loop does.
func (s *Service) Turn(ctx context.Context, batch []jetstream.Msg) { s.turn(ctx, batch) }

// WrapBucket replaces, after Prepare, the bucket s reads and writes
// projections through with wrap's result.
func (s *Service) WrapBucket(wrap func(jetstream.KeyValue) jetstream.KeyValue) { s.kv = wrap(s.kv) }

// WithoutTimelineFollow keeps s, before Start, from raising Deps.Primary
// to the timeline the ingests recorded.
func WithoutTimelineFollow(s *Service) { s.noTimelineFollow = true }
