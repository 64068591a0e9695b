package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Log batches (Config.LogBatches; docs/internals/log-batches.md, step 2).
// With them on, a lane stores its batch's commits as one LEDGER_LOG
// message per partition (a link), not one per event. A partition's links
// form a chain: each carries Nats-Expected-Last-Subject-Sequence, the
// stream sequence of the partition's previous link, so a stream that lost
// its tail refuses the next link, and the lane stores what was lost first.
//
// The chain has one writer. The ingest holding a partition's claim sends
// all of the partition's events to one lane (laneOf), which appends them
// one batch after another and stores their links in the same order. So
// the partition's commits are in seq order along its chain: every commit
// with a seq at or below the highest seq of its last link (the chain's
// top) is in that link or an earlier one, or in a per-event copy stored
// before the chain began. What a stream lost, and what another ingest
// committed and died before storing, is then exactly the partition's
// rows above the top. A lane that does not know the chain as it is (at
// start, after a reconnect, a refusal, or a change of the claim's epoch)
// reads the partition's last link, and stores those rows, read from
// PostgreSQL with its own among them, before anything else.
//
// A duplicate's event was committed before. Its commit is in the chain
// when its seq is at or below the top: then it publishes nothing. Above
// the top it may be in no link yet: an append whose answer was lost (a cut
// connection) committed it, and the lane's retry found it committed. It
// then goes in the lane's next link, in seq order with the rest.

// chain is what a lane knows of one partition's links.
type chain struct {
	epoch int64  // the partition's claim epoch it was read under
	link  uint64 // the stream sequence of the last link; 0: the stream holds none
	top   int64  // the highest commit seq the links hold; 0: none known
}

// linkPlan is one partition's links of a batch, stored in order.
type linkPlan struct {
	partition int
	epoch     int64
	own       []*fence.Committed // the batch's commits and duplicates of the partition, in seq order
	msgs      []*nats.Msg        // the links still to store, from next
	tops      []int64            // the highest seq of each link
	next      int
	ready     bool // msgs are built on the chain as the lane knows it
}

// storeLinks stores the batch's commits as log batches, partition
// by partition, and waits for their publish acks; false when the service
// stops first. Like storeCopies it retries until every link is stored.
func (s *Service) storeLinks(ctx context.Context, l *lane, cb *committedBatch) bool {
	plans := linkPlans(cb)
	expect := s.cfg.hooks == nil || !s.cfg.hooks.noLogExpectations
	delay := s.cfg.RetryMin
	refused := 0
	for attempt := 1; ; {
		if s.reconnected(l) {
			s.forgetStored(l) // the stream may have lost its tail: read each chain again
			for _, p := range plans {
				p.ready = false
			}
		}
		var round []*linkPlan
		var msgs []*nats.Msg
		planned := true
		for _, p := range plans {
			if !p.ready {
				if err := s.planLinks(ctx, l, p); err != nil {
					if ctx.Err() != nil {
						return false
					}
					s.metrics.retry("log_order")
					s.log.Warn("cannot read a partition's log chain; retrying", slog.Int("partition", p.partition),
						slog.String("error", err.Error()))
					planned = false
					continue
				}
			}
			if p.next < len(p.msgs) {
				m := p.msgs[p.next]
				if expect {
					m.Header[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(l.chains[p.partition].link, 10)}
				} else {
					m.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
				}
				round = append(round, p)
				msgs = append(msgs, m)
			}
		}
		if len(round) == 0 && planned {
			return true
		}
		var failed []failedCopy
		var lastErr error
		if len(round) > 0 {
			set := s.copies.publish(msgs)
			var ok bool
			if failed, lastErr, ok = s.copies.wait(ctx, set, s.cfg.PublishTimeout); !ok {
				return false
			}
			for k, p := range round {
				stored, seq := set.outcome(k)
				if !stored {
					continue
				}
				if seq > 0 {
					ch := l.chains[p.partition]
					ch.link, ch.top = seq, max(ch.top, p.tops[p.next])
					l.chains[p.partition] = ch
				} else {
					// Stored, but where is not known: read the chain again.
					delete(l.chains, p.partition)
					p.ready = false
				}
				p.next++
			}
		}
		if planned && len(failed) == 0 {
			delay = s.cfg.RetryMin
			continue // the next links of partitions split in several
		}
		wrongLast, inFlight := refusals(failed)
		switch {
		case inFlight:
			// A clustered stream checks an expectation only once the
			// subject's last message is applied; it will be in a moment.
			if !s.sleep(ctx, time.Millisecond) {
				return false
			}
			continue
		case wrongLast:
			s.metrics.retry("log_order")
			s.log.Warn("LEDGER_LOG lacks a partition's last log batch (a replica lost its tail?); reading its chain again",
				slog.String("error", lastErr.Error()))
			for _, p := range round {
				if p.next < len(p.msgs) {
					delete(l.chains, p.partition)
					p.ready = false
				}
			}
			// As storeCopies: the first refusal is read again at once, the
			// next after a wait (a direct get may be answered by a replica
			// behind the leader), and after logRefusalsMax the links go
			// without the check, in order still.
			if refused++; refused == logRefusalsMax {
				s.log.Warn("LEDGER_LOG keeps refusing log batches for their predecessors; storing them without the check",
					slog.Int("rounds", refused))
				expect = false
			}
			if refused == 1 {
				continue
			}
		case len(failed) > 0:
			s.metrics.retry("publish")
			s.log.Warn("storing log batches failed; retrying", slog.Int("failed", len(failed)),
				slog.Int("attempt", attempt), slog.String("error", lastErr.Error()))
			attempt++
		}
		if !s.sleep(ctx, delay) {
			return false
		}
		delay = min(delay*2, s.cfg.RetryMax)
	}
}

// linkPlans groups the batch's commits by partition.
func linkPlans(cb *committedBatch) []*linkPlan {
	var plans []*linkPlan
	by := map[int]*linkPlan{}
	for _, c := range cb.fresh {
		p := by[c.Partition]
		if p == nil {
			p = &linkPlan{partition: c.Partition, epoch: cb.epochs[c.Partition]}
			by[c.Partition] = p
			plans = append(plans, p)
		}
		p.own = append(p.own, c)
	}
	return plans
}

// planLinks builds p's links on the chain as the lane knows it, reading
// the chain first when the lane does not know it under p's claim epoch.
func (s *Service) planLinks(ctx context.Context, l *lane, p *linkPlan) error {
	ch, known := l.chains[p.partition]
	var copies []fence.Committed
	if !known || ch.epoch != p.epoch {
		var err error
		if ch, err = s.readChain(ctx, p.partition); err != nil {
			return err
		}
		ch.epoch = p.epoch
		// Every commit of the partition above the chain's top: a lost
		// tail, another ingest's commits it died before storing (all of
		// them, not only those this batch redelivered), this batch's, and
		// any of the lane's next batches committed by now. The lane is the
		// partition's one appender, so no commit below them can come
		// later. Without a top (no link yet, or one that does not read)
		// only the tail check's window is read: anything older is in the
		// stream as per-event copies, or aged out of it.
		window := s.cfg.LogTailWindow
		if window <= 0 { // the tail check is off; the chain is not
			window = LogTailWindowDefault
		}
		if copies, err = s.store.PartitionBetween(ctx, p.partition, ch.top, math.MaxInt64, window,
			logTailRowsMax); err != nil {
			return err
		}
		if n := len(copies) - ownAbove(p, ch.top); n > 0 {
			s.metrics.tailRestored.Add(float64(n))
		}
		if l.chains == nil {
			l.chains = map[int]chain{}
		}
		l.chains[p.partition] = ch
	} else {
		for _, c := range p.own {
			if c.Seq > ch.top {
				copies = append(copies, *c)
			}
		}
	}
	p.msgs, p.tops, p.next, p.ready = nil, nil, 0, true
	if len(copies) == 0 {
		return nil // the chain holds them all (another writer stored them)
	}
	msgs, err := s.subjects.LogBatchMsgs(copies, s.logMax)
	if err != nil {
		return err
	}
	i := 0
	for _, m := range msgs {
		n, _ := strconv.Atoi(m.Header.Get(wire.HeaderBatch))
		i += n
		p.tops = append(p.tops, copies[i-1].Seq)
	}
	p.msgs = msgs
	return nil
}

// ownAbove counts p's own commits above top.
func ownAbove(p *linkPlan, top int64) int {
	n := 0
	for _, c := range p.own {
		if c.Seq > top {
			n++
		}
	}
	return n
}

// readChain reads partition's last link: where it is, and the highest
// commit seq it holds.
func (s *Service) readChain(ctx context.Context, partition int) (chain, error) {
	m, err := s.logStream.GetLastMsgForSubject(ctx, s.subjects.LogBatch(partition))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return chain{}, nil
	case err != nil:
		return chain{}, fmt.Errorf("last log batch of partition %d: %w", partition, err)
	}
	ch := chain{link: m.Sequence}
	copies, err := s.subjects.DecodeLogBatch(m.Subject, m.Header, m.Data)
	if err != nil {
		// Not a batch this ledger wrote (only ingests and operators may
		// publish there): the chain goes on from it, and what is above
		// its top is read as if there were no link.
		s.log.Warn("the last log batch of a partition does not read; storing the partition's recent commits again",
			slog.Int("partition", partition), slog.Uint64("stream_seq", m.Sequence), slog.String("error", err.Error()))
		return ch, nil
	}
	for _, c := range copies {
		ch.top = max(ch.top, c.Seq)
	}
	return ch, nil
}
