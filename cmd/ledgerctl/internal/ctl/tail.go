package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// logEvent is one LEDGER_LOG message as tail prints it (docs/contract.md §4).
type logEvent struct {
	StreamSeq   uint64          `json:"stream_seq"`
	Seq         int64           `json:"seq"`
	Partition   int64           `json:"partition"`
	Task        string          `json:"task"`
	Version     int64           `json:"version"`
	Type        string          `json:"type"`
	Holder      string          `json:"holder"`
	Generation  int64           `json:"generation"`
	EventID     string          `json:"event_id"`
	CommittedAt string          `json:"committed_at"`
	Payload     json.RawMessage `json:"payload"`
}

// Tail follows the committed log ("tail"): one line per event, until
// interrupted or after -n events.
func Tail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl tail", "[-since-seq N | -new] [-n N] [-partition N] [-task T]",
		"Follow the committed log, LEDGER_LOG, with an ordered consumer (nothing is consumed):\nfrom its first event, from -since-seq, or only new events (-new). Stops on SIGINT or\nafter -n events.", stderr)
	since := f.Uint64("since-seq", 0, "start at this LEDGER_LOG stream sequence (0: from the first event)")
	onlyNew := f.Bool("new", false, "only events stored from now on")
	count := f.Int("n", 0, "stop after this many events (0: until interrupted)")
	partition := f.Int("partition", -1, "only this partition (-1: all)")
	task := f.String("task", "", "only this task")
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case f.NArg() > 0:
		return Usagef("unexpected argument %q", f.Arg(0))
	case *onlyNew && *since > 0:
		return Usagef("give -since-seq or -new, not both")
	case *count < 0:
		return Usagef("-n must not be negative")
	case *partition < -1:
		return Usagef("-partition must be >= 0, got %d", *partition)
	case *task != "" && !wire.ValidID(*task):
		return Usagef("-task %q is not 1..%d characters of [A-Za-z0-9_-]", *task, wire.MaxIDLen)
	}

	// A follower should outlive a NATS restart: reconnect, and say so.
	notes := &lockedWriter{w: stderr}
	nc, js, err := f.JetStream(nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				fmt.Fprintf(notes, "ledgerctl tail: NATS disconnected (%v); reconnecting\n", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { fmt.Fprintln(notes, "ledgerctl tail: NATS reconnected") }))
	if err != nil {
		return err
	}
	defer nc.Close()
	s, err := stream(ctx, js, wire.StreamLog)
	if err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: logFilters(f.Subjects(), *partition, *task),
		DeliverPolicy: jetstream.DeliverAllPolicy}
	switch {
	case *onlyNew:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	case *since > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, *since
	}
	cctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	cons, err := s.OrderedConsumer(cctx, cfg)
	if err != nil {
		return fmt.Errorf("follow %s: %w", wire.StreamLog, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow %s: %w", wire.StreamLog, err)
	}
	defer it.Stop()

	const line = "%-8v %-8v %-9v %-24v %-7v %-16v %-20v %v\n"
	if !f.JSON {
		fmt.Fprintf(stdout, line, "STREAM", "SEQ", "PARTITION", "TASK", "VERSION", "TYPE", "HOLDER/GEN", "PAYLOAD")
	}
	for n := 0; *count == 0 || n < *count; {
		m, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil // interrupted: the normal way to stop
		}
		if err != nil {
			return fmt.Errorf("follow %s: %w", wire.StreamLog, err)
		}
		events, err := decodeLogEvents(f.Subjects(), m)
		if err != nil {
			// One unreadable message is reported and skipped: the log goes on.
			fmt.Fprintf(stderr, "ledgerctl tail: %s\n", printable(err.Error()))
			continue
		}
		for _, e := range events {
			if *task != "" && e.Task != *task || *count > 0 && n == *count {
				continue // a log batch holds other tasks' events too
			}
			n++
			if f.JSON {
				if err := writeJSON(stdout, e); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(stdout, line, e.StreamSeq, e.Seq, e.Partition, printable(e.Task), e.Version, printable(e.Type),
				printable(fmt.Sprintf("%s/%d", e.Holder, e.Generation)), printable(string(e.Payload)))
		}
	}
	return nil
}

// logFilters are the LEDGER_LOG subject filters for a partition and a
// task: a task's subject and its partition's log batches (the caller skips
// the batches' other tasks), or every subject of a partition, which holds
// its batches.
func logFilters(subj wire.Subjects, partition int, task string) []string {
	switch {
	case partition >= 0 && task != "":
		return []string{subj.Log(partition, task), subj.LogBatch(partition)}
	case partition >= 0:
		return []string{subj.LogPartition(partition)}
	case task != "":
		return []string{subj.LogTask(task), subj.LogBatches()}
	}
	return []string{subj.LogAll()}
}

// decodeLogEvents reads a LEDGER_LOG message: a copy's event, or a log
// batch's events, each with the message's stream sequence.
func decodeLogEvents(subj wire.Subjects, m jetstream.Msg) ([]logEvent, error) {
	meta, err := m.Metadata()
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", wire.StreamLog, err)
	}
	copies, err := subj.DecodeLogCopies(m.Subject(), m.Headers(), m.Data())
	if err != nil {
		return nil, fmt.Errorf("stream seq %d: %w", meta.Sequence.Stream, err)
	}
	events := make([]logEvent, len(copies))
	for i, c := range copies {
		events[i] = logEvent{StreamSeq: meta.Sequence.Stream, Seq: c.Seq, Partition: int64(c.Partition), Task: c.Task,
			Version: c.Version, Type: c.Type, Holder: c.Holder, Generation: c.Generation, EventID: c.EventID,
			CommittedAt: wire.FormatTime(c.CommittedAt), Payload: json.RawMessage(compactJSON(c.Payload))}
	}
	return events, nil
}

// lockedWriter serialises writes from NATS callbacks.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
