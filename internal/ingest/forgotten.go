package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// errForgotten is the error of an append held back because the database
// forgot commits the ledger acknowledged.
var errForgotten = errors.New("the database forgot commits the ledger acknowledged")

// buildUnguarded is set only in a build with the tag ledger_noguards
// (noguard_chaos.go): the memory check and the witness are off.
var buildUnguarded bool

// memory checks, before anything commits on a database and after every
// reconnect, that the database still holds what the ledger acknowledged:
// the newest copy in LEDGER_LOG, stored before its receipt was sent. A
// database that does not (an asynchronous failover lost its tail, a
// restore went back too far) gets no new commit: appends wait, readiness
// fails, and the log names the missing commits, until an operator restores
// them (docs/operations.md, "PostgreSQL high availability").
type memory struct {
	mu      sync.Mutex
	checked int64 // the pool's connection count at the last check; -1: never
	lost    error // non-nil while the database forgot
	off     bool  // test seam
}

// verify checks the database again if the pool opened a connection since
// the last check (or with force), and returns errForgotten while it forgot.
func (s *Service) verify(ctx context.Context, force bool) error {
	m := &s.memory
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.off {
		return nil
	}
	conns := s.store.Connections()
	if !force && m.lost == nil && conns == m.checked {
		return nil
	}
	last, seq, err := s.newestCopy(ctx)
	if err != nil {
		return err
	}
	if last == nil {
		m.checked, m.lost = conns, nil
		return nil
	}
	known, newest, err := s.store.KnowsSeq(ctx, seq)
	if err != nil {
		return err
	}
	m.checked = conns
	if known {
		if m.lost != nil {
			s.log.Info("the database holds every acknowledged commit again; committing")
		}
		m.lost = nil
		return nil
	}
	if m.lost == nil {
		missing := s.missingCopies(ctx, last.Sequence, newest)
		s.log.Error("the database forgot commits the ledger acknowledged; committing nothing on it until they are restored",
			slog.Int64("acknowledged_seq", seq), slog.Int64("database_newest_seq", newest),
			slog.Int("missing_copies_found", len(missing)), slog.Any("missing_event_ids", missing[:min(len(missing), 20)]),
			slog.String("fix", "restore them from LEDGER_LOG, or fail over to a standby that has them (docs/operations.md, \"PostgreSQL high availability\")"))
	}
	m.lost = fmt.Errorf("%w: LEDGER_LOG holds seq %d, the database's newest is %d", errForgotten, seq, newest)
	return m.lost
}

// newestCopy is LEDGER_LOG's newest message that reads as a copy, and its
// seq; nil if the stream holds none. A message that does not read (forged:
// only the ingest and operators may publish there) is passed over, at most
// 100 of them, so no message can stop the check.
func (s *Service) newestCopy(ctx context.Context) (*jetstream.RawStreamMsg, int64, error) {
	// The stream's last sequence, then that message by sequence: both
	// answered from the stream's state, whatever its size. (A last-by-
	// subject look-up over the whole log searches it.)
	info, err := s.logStream.Info(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("read LEDGER_LOG's state: %w", err)
	}
	for at, tries := info.State.LastSeq, 0; at > 0 && tries < 100; at, tries = at-1, tries+1 {
		m, err := s.logStream.GetMsg(ctx, at)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("read LEDGER_LOG message %d: %w", at, err)
		}
		if seq, err := strconv.ParseInt(m.Header.Get(wire.HeaderSeq), 10, 64); err == nil && seq > 0 {
			return m, seq, nil
		}
	}
	return nil, 0, nil
}

// missingCopies lists the event ids of LEDGER_LOG's newest copies whose seq
// is above newest, walking back from the stream sequence from, at most
// 1,000 copies.
func (s *Service) missingCopies(ctx context.Context, from uint64, newest int64) []string {
	var out []string
	for seq := from; seq > 0 && from-seq < 1000; seq-- {
		m, err := s.logStream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			break
		}
		n, _ := strconv.ParseInt(m.Header.Get(wire.HeaderSeq), 10, 64)
		if n <= newest {
			break
		}
		out = append(out, m.Header.Get(wire.HeaderMsgID))
	}
	return out
}

// CheckMemory reports an error while the database forgot acknowledged
// commits: a readiness check.
func (s *Service) CheckMemory(ctx context.Context) error {
	if s.logStream == nil {
		return errors.New("not started")
	}
	return s.verify(ctx, false)
}
