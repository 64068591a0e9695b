package ctl

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

var streamsCommands = map[string]Command{
	"apply": {StreamsApply, "[-replicas N]", "create or update LEDGER_IN, LEDGER_LOG and LEDGER_DLQ"},
}

// Streams dispatches the "streams" subcommands.
func Streams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "ledgerctl streams", streamsCommands, args, stdout, stderr)
}

// streamRow is one stream in the output of streams apply.
type streamRow struct {
	Stream            string   `json:"stream"`
	Subjects          []string `json:"subjects"`
	Retention         string   `json:"retention"`
	Replicas          int      `json:"replicas"`
	DuplicateWindowMS int64    `json:"duplicate_window_ms"`
	Messages          uint64   `json:"messages"`
}

// StreamsApply creates or updates the ledger's streams from the embedded
// definitions ("streams apply"). It is idempotent.
func StreamsApply(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl streams apply", "[-replicas N]",
		"Create or update the streams LEDGER_IN, LEDGER_LOG and LEDGER_DLQ from the definitions\nembedded in the binary (streams/*.json), with the subject prefix of -prefix.", stderr)
	replicas := f.Int("replicas", 1, "replicas of every stream: 1, or 3 in a cluster (env LEDGER_REPLICAS)")
	// Not connect.EnvInt: it exits the process on a malformed value.
	if v := connect.Env("LEDGER_REPLICAS", ""); v != "" {
		if err := f.Set("replicas", v); err != nil {
			return Usagef("LEDGER_REPLICAS=%q is not an integer", v)
		}
	}
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	if *replicas < 1 || *replicas > 5 {
		return Usagef("-replicas must be 1..5, got %d", *replicas)
	}
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()
	opts := streams.Options{Prefix: f.Prefix, Replicas: *replicas}
	actx, cancel := context.WithTimeout(ctx, 3*RequestTimeout)
	defer cancel()
	if err := streams.Apply(actx, js, opts); err != nil {
		return err
	}

	var rows []streamRow
	for _, name := range []string{wire.StreamIn, wire.StreamLog, wire.StreamDLQ} {
		s, err := stream(ctx, js, name)
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		rows = append(rows, streamRow{Stream: name, Subjects: info.Config.Subjects,
			Retention: retention(info.Config.Retention), Replicas: info.Config.Replicas,
			DuplicateWindowMS: info.Config.Duplicates.Milliseconds(), Messages: info.State.Msgs})
	}
	if f.JSON {
		for _, r := range rows {
			if err := writeJSON(stdout, r); err != nil {
				return err
			}
		}
		return nil
	}
	t := newTable(stdout, "STREAM", "SUBJECTS", "RETENTION", "REPLICAS", "DUPLICATE WINDOW", "MESSAGES")
	for _, r := range rows {
		t.row(r.Stream, strings.Join(r.Subjects, ","), r.Retention, r.Replicas,
			time.Duration(r.DuplicateWindowMS)*time.Millisecond, r.Messages)
	}
	return t.flush()
}

func retention(r jetstream.RetentionPolicy) string {
	switch r {
	case jetstream.WorkQueuePolicy:
		return "workqueue"
	case jetstream.InterestPolicy:
		return "interest"
	}
	return "limits"
}
