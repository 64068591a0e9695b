package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/internal/logscan"
)

// LEDGER_LOG's tail, put back from PostgreSQL. A nats-server that restarts
// after a power loss or an OS crash may have lost the copies it stored
// within its sync interval, after the ingest counted them as stored (and
// sent their receipts). Nothing else would publish them again: a task that
// gets no new version keeps a log that ends early, and a lane that
// remembers storing a copy does not look for it.
//
// So at start and after every reconnect to NATS, the ingest reads the
// commits of the last LogTailWindow from PostgreSQL, asks LEDGER_LOG for
// each of their tasks' last copy, and publishes again, in version order,
// the versions after the newest it holds: versions stored in log batches
// (docs/internals/log-batches.md) count, though they are not under their
// task's subject.
// A copy still in the stream's duplicate window is deduplicated by its
// event id. The lanes forget which copies they stored.
//
// The opposite case, LEDGER_LOG ahead of the database, is the memory check
// (forgotten.go). A log that lost its tail holds an older newest copy,
// which the database knows: that check stays quiet.

// LogTailWindowDefault is how far back the tail check looks: 10 min.
const LogTailWindowDefault = 10 * time.Minute

// logTailRowsMax bounds the commits one check reads.
const logTailRowsMax = 100_000

// runLogTail checks the tail at start and after each reconnect, until
// the check succeeds once per connection.
func (s *Service) runLogTail() {
	defer s.wg.Done()
	connected := s.nc.StatusChanged(nats.CONNECTED)
	defer s.nc.RemoveStatusListener(connected)
	due := time.NewTimer(0)
	defer due.Stop()
	pending, delay := true, s.cfg.RetryMin
	for {
		select {
		case <-s.stopping:
			return
		case <-connected:
			pending, delay = true, s.cfg.RetryMin
			due.Reset(0)
		case <-due.C:
			if !pending {
				continue
			}
			n, err := s.checkLogTail(s.workCtx)
			if err != nil {
				s.log.Warn("checking LEDGER_LOG's tail against the database failed; trying again",
					slog.String("error", err.Error()))
				due.Reset(delay)
				delay = min(2*delay, s.cfg.RetryMax)
				continue
			}
			if n > 0 {
				s.log.Warn("LEDGER_LOG lacked committed copies at its tail; published them again from the database",
					slog.Int("copies", n))
			}
			if _, err := s.restartBehind(s.workCtx); err != nil {
				s.log.Warn("checking the partition consumers against LEDGER_IN failed; trying again",
					slog.String("error", err.Error()))
				due.Reset(delay)
				delay = min(2*delay, s.cfg.RetryMax)
				continue
			}
			pending = false
		}
	}
}

// checkLogTail publishes again the copies LEDGER_LOG lacks after each
// recently committed task's last copy, and returns how many.
func (s *Service) checkLogTail(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	heads, err := s.store.RecentHeads(ctx, s.cfg.LogTailWindow, logTailRowsMax)
	if err != nil {
		return 0, err
	}
	batched, err := logscan.BatchedVersions(ctx, s.nc, s.subjects, s.cfg.LogTailWindow, verifyTimeout)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, h := range heads {
		have, err := logscan.LastCopied(ctx, s.logStream, s.subjects, h.Partition, h.Task)
		if err != nil {
			return n, err
		}
		have = max(have, batched[h.Task])
		if have >= h.Version {
			continue
		}
		missing, err := s.store.Between(ctx, h.Task, have, h.Version+1)
		if err != nil {
			return n, err
		}
		for i := range missing {
			if _, err := s.copyJS.PublishMsg(ctx, s.logCopy(&missing[i])); err != nil {
				return n, fmt.Errorf("publish the copy of %s version %d again: %w", h.Task, missing[i].Version, err)
			}
			n++
			s.metrics.tailRestored.Inc()
		}
	}
	return n, nil
}

// reconnected reports whether NATS reconnected since the lane last looked.
func (s *Service) reconnected(l *lane) bool { return s.epoch() != l.epoch }

// epoch counts the reconnects of both connections: the copies' and the
// one the lookups of LEDGER_LOG's last copies go on.
func (s *Service) epoch() uint64 { return s.nc.Stats().Reconnects + s.copies.nc.Stats().Reconnects }

// forgetStored clears what a lane remembers storing once NATS reconnected:
// the copies may be gone with the server's unsynced tail. The client counts
// the reconnect before it sends anything on the new connection.
func (s *Service) forgetStored(l *lane) {
	if epoch := s.epoch(); epoch != l.epoch {
		clear(l.stored)
		clear(l.chains)
		l.epoch = epoch
	}
}
