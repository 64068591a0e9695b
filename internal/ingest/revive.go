package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
)

// Consumers that are gone. A partition's consumer on an inbox can vanish
// while the ingest holds the claim: an operator deleted it, or the server
// lost it (its storage, or a restart of a server that kept it in memory).
// Its ConsumeContext then only waits: the server answers a deleted
// consumer's pulls once (ErrConsumerDeleted) and a missing one's never
// (ErrNoHeartbeat, again and again), and the partition's events in that
// inbox would wait for ever. The consume error handler notes the partition
// and stream; the next beat asks the server whether the consumer is there,
// and makes a missing one again under the same claim (consumeInbox).

// consumerKey names one partition's consumer on one inbox stream, under
// the claim epoch it was made for.
type consumerKey struct {
	partition int
	stream    string
	epoch     int64
}

// suspects are the consumers to look at on the next beat.
type suspects struct {
	mu sync.Mutex
	m  map[consumerKey]bool // true: known deleted; false: silent, to be asked
}

func (q *suspects) note(k consumerKey, deleted bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[consumerKey]bool{}
	}
	q.m[k] = q.m[k] || deleted
}

func (q *suspects) take() map[consumerKey]bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	m := q.m
	q.m = nil
	return m
}

// consumeErr is the consume error handler of partition p's consumer on
// stream under epoch.
func (s *Service) consumeErr(k consumerKey, err error) {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted):
		s.suspects.note(k, true)
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		s.suspects.note(k, false)
		fallthrough
	default:
		s.log.Warn("consume", slog.Int("partition", k.partition), slog.String("stream", k.stream), slog.String("error", err.Error()))
	}
}

// reviveConsumers makes again each suspect consumer the server no longer
// has, for a partition this process still decides under the same claim.
// Under beatMu.
func (s *Service) reviveConsumers(ctx context.Context) {
	if h := s.cfg.hooks; h != nil && h.noRevive {
		return
	}
	for k, deleted := range s.suspects.take() {
		s.claims.mu.Lock()
		r := s.claims.runs[k.partition]
		s.claims.mu.Unlock()
		if r == nil || r.claim.Epoch != k.epoch || s.inboxes.stream(k.stream) == nil {
			continue // no longer ours, or the inbox is gone
		}
		if !deleted {
			missing, err := s.consumersMissing(ctx, k.stream, r.claim)
			if err != nil {
				s.suspects.note(k, false) // ask again on the next beat
				continue
			}
			if !missing {
				continue // there: the silence was the server's or the network's
			}
		}
		s.log.Warn("a partition's consumer is gone from the server; making it again", slog.Int("partition", k.partition),
			slog.String("stream", k.stream))
		s.claims.mu.Lock()
		old := r.consumers[k.stream]
		s.claims.mu.Unlock()
		if old != nil {
			old.Stop()
		}
		cc, err := s.consumeInbox(ctx, r.claim, k.stream)
		if err != nil {
			s.log.Warn("making a partition's consumer again failed; trying on the next beat", slog.Int("partition", k.partition),
				slog.String("stream", k.stream), slog.String("error", err.Error()))
			s.suspects.note(k, true)
			continue
		}
		s.claims.mu.Lock()
		if s.claims.runs[k.partition] == r {
			r.consumers[k.stream] = cc
			cc = nil
		}
		s.claims.mu.Unlock()
		if cc != nil {
			cc.Stop() // the partition was stopped meanwhile
		}
	}
}

// consumersMissing reports whether a consumer of claim cl's partition on
// the inbox stream is gone from the server.
func (s *Service) consumersMissing(ctx context.Context, stream string, cl fence.Claim) (bool, error) {
	for _, f := range s.inboxForms(stream, cl) {
		_, err := s.js.Consumer(ctx, stream, f.name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
	return false, nil
}
