package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
)

// Messages below a consumer's position. LEDGER_IN is a work queue: a
// message leaves the stream when it is acked. A server that lost the tail
// of its files can bring back messages whose removal was in that tail, and
// take the consumer's position back only to its stream's last sequence: new
// messages then get sequences the consumer counts as delivered. Either way
// a message sits in the stream below the consumer's ack floor, and no
// consumer delivers it again: its event never gets a verdict, and a
// re-send of it is dropped as a duplicate.
//
// So after each reconnect (runLogTail) the ingest looks, for each partition
// it decides and each inbox stream, at the partition's first message in
// the stream. One at or below its consumer's ack floor means the consumer
// is ahead of its stream: the partition's consumers are made again, from
// their streams' first messages. What they deliver again was either
// decided already (answered duplicate) or is decided now.

// restartBehind makes again the consumers of the owned partitions that are
// ahead of LEDGER_IN, and returns how many.
func (s *Service) restartBehind(ctx context.Context) (int, error) {
	s.claims.beatMu.Lock() // no partition is taken or given up meanwhile
	defer s.claims.beatMu.Unlock()
	if s.claims.stopped {
		return 0, nil // Stop has the consumers: none is made again
	}
	s.claims.mu.Lock()
	runs := make(map[int]*partRun, len(s.claims.runs))
	for p, r := range s.claims.runs {
		runs[p] = r
	}
	s.claims.mu.Unlock()
	n := 0
	for p, r := range runs {
		ahead, err := s.consumerAhead(ctx, p, r)
		if err != nil {
			return n, err
		}
		if !ahead {
			continue
		}
		s.log.Warn("LEDGER_IN holds messages below the partition consumer's position (lost storage); making the consumer again",
			slog.Int("partition", p))
		s.stopPartition(p, true)
		name := consumerName(p, r.claim.Epoch)
		for _, stream := range s.inboxes.names() {
			for _, f := range s.inboxForms(stream, r.claim) {
				if err := s.js.DeleteConsumer(ctx, stream, f.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
					return n, fmt.Errorf("delete consumer %s of %s: %w", f.name, stream, err)
				}
			}
		}
		if err := s.startRun(ctx, r.claim); err != nil {
			return n, fmt.Errorf("make consumer %s again: %w", name, err)
		}
		n++
	}
	return n, nil
}

// consumerAhead reports whether partition p's first message in an inbox
// stream is at or below its consumer's ack floor there.
func (s *Service) consumerAhead(ctx context.Context, p int, r *partRun) (bool, error) {
	for _, stream := range s.inboxes.names() {
		for _, f := range s.inboxForms(stream, r.claim) {
			cons, err := s.js.Consumer(ctx, stream, f.name)
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				// Gone with the server's storage, or with a restart of a
				// server that kept it in memory: made again on the next beat.
				s.suspects.note(consumerKey{partition: p, stream: stream, epoch: r.claim.Epoch}, true)
				continue
			}
			if err != nil {
				return false, fmt.Errorf("consumer of partition %d on %s: %w", p, stream, err)
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return false, fmt.Errorf("consumer of partition %d on %s: %w", p, stream, err)
			}
			first, found, err := s.firstOf(ctx, stream, f.filter)
			if err != nil {
				return false, fmt.Errorf("first message of partition %d in %s: %w", p, stream, err)
			}
			if found && first <= info.AckFloor.Stream {
				return true, nil
			}
		}
	}
	return false, nil
}
