package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/console"
	"github.com/flowness/ledger/pkg/wire"
)

// Console serves the web console ("console") until interrupted.
func Console(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl console", "[-listen ADDR] [-allow-replay] [-ingest-metrics URL] [-host NAME]",
		`Serve the web console: the partitions' leases and takeovers, the flow of verdicts, the
dead letters and one task at a time, live, in a browser. Everything it needs is inside
ledgerctl; the machine needs no internet.

It listens on 127.0.0.1 and is read-only unless told otherwise. -allow-replay lets it
re-submit dead letters, as 'ledgerctl dlq replay' does, through a form that another site
cannot forge. Pages show no connection string or password; what failed is said, and why
goes to this command's stderr.`, stderr)
	listen := f.String("listen", console.ListenDefault, "address to serve on; anything but loopback lets other hosts read the console")
	allowReplay := f.Bool("allow-replay", false, "allow replaying dead letters from the console (default read-only)")
	var hosts, metrics listFlag
	f.Var(&hosts, "host", "another host name the console answers to, behind a proxy say (repeatable); other Host headers are refused")
	f.Var(&metrics, "ingest-metrics", "an ingest's /metrics URL, to count duplicates (repeatable, or comma separated)")
	poll := f.Duration("poll", console.PollIntervalDefault, "how often the live views are recomputed")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	cfg := console.Config{Listen: *listen, Hosts: hosts, AllowReplay: *allowReplay, PollInterval: *poll, IngestMetrics: metrics}
	if err := checkConsoleConfig(cfg); err != nil {
		return err
	}

	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A console outlives a NATS restart.
	nc, js, err := f.JetStream(nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Close()
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: stderr}, nil))
	srv, err := console.New(cfg, console.Deps{Ledger: &ctlLedger{g: &f.Globals, pool: pool, js: js},
		Pool: pool, NC: nc, JS: js, Subjects: f.Subjects(), Logger: log})
	if err != nil {
		return Usagef("%v", err)
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	mode := "read-only"
	if *allowReplay {
		mode = "replays allowed"
	}
	fmt.Fprintf(stdout, "ledger console on %s (%s); interrupt to stop\n", srv.URL(), mode)
	if host, _, _ := net.SplitHostPort(srv.Addr()); !net.ParseIP(host).IsLoopback() {
		fmt.Fprintf(stderr, "ledgerctl console: listening on %s: other hosts can read the console (it has no login)\n", srv.Addr())
	}
	<-ctx.Done()
	srv.Stop()
	return nil
}

// checkConsoleConfig turns what console.New would refuse into usage errors.
func checkConsoleConfig(cfg console.Config) error {
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return Usagef("-listen %q: %v", cfg.Listen, err)
	}
	if cfg.PollInterval < 100*time.Millisecond {
		return Usagef("-poll must be at least 100ms")
	}
	for _, u := range cfg.IngestMetrics {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return Usagef("-ingest-metrics %q is not an http(s) URL", u)
		}
	}
	return nil
}

// ctlLedger is the console's reading and replaying of the ledger: the
// queries and codecs of the commands above.
type ctlLedger struct {
	g    *Globals
	pool *pgxpool.Pool
	js   jetstream.JetStream
}

// Leases lists the leases as "ledgerctl leases" does.
func (l *ctlLedger) Leases(ctx context.Context) ([]console.Lease, error) {
	rows, err := l.pool.Query(ctx, sqlLeases, nil)
	if err != nil {
		return nil, schemaHint("list leases", err)
	}
	leases, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (console.Lease, error) {
		var c console.Lease
		err := r.Scan(&c.Partition, &c.Holder, &c.Generation, &c.ExpiresAt, &c.TTLMS, &c.Valid, &c.TimeLeftMS)
		return c, err
	})
	if err != nil {
		return nil, schemaHint("list leases", err)
	}
	return leases, nil
}

// DeadLetter decodes a dead letter as "ledgerctl dlq list" does.
func (l *ctlLedger) DeadLetter(seq uint64, subject string, h nats.Header, data []byte) console.DeadLetter {
	d := newDeadLetter(l.g.Subjects(), seq, subject, h, data)
	return console.DeadLetter{Seq: d.StreamSeq, Subject: d.Subject, Partition: d.Partition, Task: d.Task,
		EventID: d.EventID, Version: d.Version, Type: d.Type, Holder: d.Holder, Generation: d.Generation,
		Verdict: d.Verdict, Reason: d.Reason, CurrentGeneration: d.CurrentGeneration, CurrentHolder: d.CurrentHolder,
		RejectedAt: d.RejectedAt, SourceSubject: h.Get(wire.HeaderSourceSubject), SourceSeq: d.SourceSeq,
		Header: d.header, Body: d.data, Unusable: d.unusable}
}

// Task reads a task as "ledgerctl task" does.
func (l *ctlLedger) Task(ctx context.Context, id string) (console.Task, error) {
	t := console.Task{ID: id}
	events, err := taskEvents(ctx, l.pool, id)
	if err != nil {
		return t, err
	}
	rejections, err := taskRejections(ctx, l.pool, id)
	if err != nil {
		return t, err
	}
	proj, err := projection(ctx, l.js, id)
	if err != nil {
		return t, err
	}
	archived, err := taskArchivedVersions(ctx, l.pool, id)
	if err != nil {
		return t, err
	}
	t.Archived = archived.Explanation
	if err := l.pool.QueryRow(ctx, sqlTaskOwner, id).Scan(&t.Owner, &t.Snapshot); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return t, schemaHint("read the task's owner", err)
	}
	for _, e := range events {
		t.Events = append(t.Events, console.TaskEvent{Seq: e.Seq, EventID: e.EventID, Partition: e.Partition,
			Version: e.Version, Type: e.Type, Holder: e.Holder, Generation: e.Generation, CommittedAt: e.CommittedAt,
			Payload: e.Payload})
	}
	for _, r := range rejections {
		t.Rejections = append(t.Rejections, console.TaskRejection{ID: r.ID, EventID: r.EventID, Partition: r.Partition,
			Version: r.Version, Holder: r.Holder, Generation: r.Generation, Verdict: r.Verdict, Reason: r.Reason,
			CurrentGeneration: r.CurrentGeneration, RejectedAt: r.RejectedAt})
	}
	t.Projection = console.TaskProjection{Revision: proj.Revision, StoredAt: proj.StoredAt, Value: proj.Value, Note: proj.Note}
	return t, nil
}

// Replay re-submits one dead letter as "ledgerctl dlq replay -seq N
// [-new-id] -wait D" does. Each replay has a connection of its own, so
// that the receipt subscriptions it makes end with it.
func (l *ctlLedger) Replay(ctx context.Context, seq uint64, newID bool, wait time.Duration) (console.ReplayResult, error) {
	nc, js, err := l.g.JetStream()
	if err != nil {
		return console.ReplayResult{}, err
	}
	defer nc.Close()
	subj := l.g.Subjects()
	letters, results, err := chooseDeadLetters(ctx, js, subj, seqList{seq}, &dlqFilter{partition: -1}, 0)
	if err != nil {
		return console.ReplayResult{}, err
	}
	if len(letters) == 0 {
		return console.ReplayResult{Seq: seq, Result: replayNotFound}, console.ErrNotFound
	}
	var receipts chan *nats.Msg
	if wait > 0 {
		if receipts, err = subscribeReceipts(nc, subj, letters); err != nil {
			return console.ReplayResult{}, err
		}
	}
	results = append(results, replayOne(ctx, js, subj, letters[0], newID, false))
	if receipts != nil {
		awaitVerdicts(ctx, receipts, results, wait)
	}
	r := results[len(results)-1]
	return console.ReplayResult{Seq: r.StreamSeq, EventID: r.EventID, NewEventID: r.NewEventID, Subject: r.Subject,
		Result: r.Result, InSeq: r.InSeq, Verdict: r.Verdict, Reason: r.Reason, Detail: r.Detail}, nil
}
