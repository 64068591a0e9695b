package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/logscan"
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

// verifyTimeout bounds one check of the database's memory: LEDGER_LOG's
// newest copies, then their seqs in the database.
const verifyTimeout = 10 * time.Second

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
	// Bounded: a lane's context has no deadline, and a reply lost with a
	// NATS server that went down would hold every lane here for ever.
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	copies, err := s.recentCopies(ctx)
	if err != nil {
		return err
	}
	if len(copies) == 0 {
		m.checked, m.lost = conns, nil
		return nil
	}
	seqs := make([]int64, len(copies))
	for i, c := range copies {
		seqs[i] = c.seq
	}
	unknown, newest, err := s.store.UnknownSeqs(ctx, seqs)
	if err != nil {
		return err
	}
	m.checked = conns
	if len(unknown) == 0 {
		if m.lost != nil {
			s.log.Info("the database holds every acknowledged commit again; committing")
		}
		m.lost = nil
		return nil
	}
	if m.lost == nil {
		var missing []string
		for _, c := range copies {
			if slices.Contains(unknown, c.seq) {
				missing = append(missing, c.id)
			}
		}
		s.log.Error("the database forgot commits the ledger acknowledged; committing nothing on it until they are restored",
			slog.Int64("acknowledged_seq", unknown[len(unknown)-1]), slog.Int64("database_newest_seq", newest),
			slog.Int("missing_copies_found", len(missing)), slog.Any("missing_event_ids", missing[:min(len(missing), 20)]),
			slog.String("fix", "restore them from LEDGER_LOG, or fail over to a standby that has them (docs/operations.md, \"PostgreSQL high availability\")"))
	}
	seq := unknown[len(unknown)-1]
	m.lost = fmt.Errorf("%w: LEDGER_LOG holds seq %d, the database's newest is %d", errForgotten, seq, newest)
	return m.lost
}

// memoryWindow is how many of LEDGER_LOG's newest messages the memory
// check reads. Lanes and ingests store their copies concurrently, so the
// newest copy's commit need not be the newest commit a standby lacks: a
// window of copies covers any order within it.
var memoryWindow = 4096

// copyRef is a log copy the memory check read: its seq and event id.
type copyRef struct {
	seq int64
	id  string
}

// recentCopies reads the copies among LEDGER_LOG's newest memoryWindow
// messages, in batched direct gets (one request answers many messages,
// ended by an EOB status). A message that does not read as a copy (forged:
// only the ingest and operators may publish there) is passed over, so no
// message can stop the check.
func (s *Service) recentCopies(ctx context.Context) ([]copyRef, error) {
	info, err := s.logStream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read LEDGER_LOG's state: %w", err)
	}
	last := info.State.LastSeq
	if last == 0 || info.State.Msgs == 0 {
		return nil, nil
	}
	from := max(info.State.FirstSeq, last-min(last, uint64(memoryWindow))+1)
	var out []copyRef
	for from <= last {
		next, got, err := s.directBatch(ctx, from, last, &out)
		if err != nil {
			return nil, err
		}
		if !got {
			break
		}
		from = next
	}
	// Log batches hold up to 1,000 copies a message: the newest
	// copyRefsMax are the check's.
	if len(out) > copyRefsMax {
		out = out[len(out)-copyRefsMax:]
	}
	return out, nil
}

// copyRefsMax bounds the copies one memory check asks the database about.
const copyRefsMax = 16384

// directBatch asks LEDGER_LOG for its messages from stream sequence from up
// to last, appends the copies among them to out, and returns the sequence
// after the last message received (the server stops at max_bytes).
func (s *Service) directBatch(ctx context.Context, from, last uint64, out *[]copyRef) (uint64, bool, error) {
	req := map[string]any{"seq": from, "batch": int(last - from + 1), "up_to_seq": last, "max_bytes": 4 << 20}
	return s.directGet(ctx, req, "read LEDGER_LOG's newest copies", func(m *nats.Msg) {
		if seq, err := strconv.ParseInt(m.Header.Get(wire.HeaderSeq), 10, 64); err == nil && seq > 0 {
			*out = append(*out, copyRef{seq: seq, id: wire.EventIDOf(m.Header.Get(wire.HeaderMsgID))})
			return
		}
		s.batched(m, out)
	})
}

// directGet is logscan.DirectGet on the service's connection. The test
// seam sends nothing, as a request lost with its server: no reply comes
// before ctx ends.
func (s *Service) directGet(ctx context.Context, req map[string]any, what string, each func(*nats.Msg)) (uint64, bool, error) {
	if h := s.cfg.hooks; h != nil && h.dropDirectGet {
		<-ctx.Done()
		return 0, false, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	return logscan.DirectGet(ctx, s.nc, req, what, each)
}

// batched appends the copies of m to out if m is a log batch
// (docs/contract.md §4, "Log batches") that reads.
func (s *Service) batched(m *nats.Msg, out *[]copyRef) {
	subject := m.Header.Get(jetstream.SubjectHeader) // a direct get's reply names the stored subject here
	if !s.subjects.IsLogBatch(subject) {
		return
	}
	copies, err := s.subjects.DecodeLogBatch(subject, m.Header, m.Data)
	if err != nil {
		return
	}
	for _, c := range copies {
		*out = append(*out, copyRef{seq: c.Seq, id: c.EventID})
	}
}

// CheckMemory reports an error while the database forgot acknowledged
// commits: a readiness check.
func (s *Service) CheckMemory(ctx context.Context) error {
	if s.logStream == nil {
		return errors.New("not started")
	}
	return s.verify(ctx, false)
}
