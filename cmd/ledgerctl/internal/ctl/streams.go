package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

var streamsCommands = map[string]Command{
	"apply": {StreamsApply, "[-replicas N] [-tasks-max-bytes N] [-marks-max-bytes N] [-principals a,b -inbox-max-bytes N]",
		"create or update the ledger's streams and buckets"},
	"list": {StreamsList, "", "every stream and bucket of the ledger, whichever account holds it, with its consumers"},
}

// Streams dispatches the "streams" subcommands.
func Streams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "ledgerctl streams", streamsCommands, args, stdout, stderr)
}

// streamRow is one stream or bucket in the output of streams apply and list.
type streamRow struct {
	Stream            string   `json:"stream"`
	Subjects          []string `json:"subjects"`
	Retention         string   `json:"retention"`
	Replicas          int      `json:"replicas"`
	DuplicateWindowMS int64    `json:"duplicate_window_ms"`
	Messages          uint64   `json:"messages"`
	Bytes             uint64   `json:"bytes"`
	MaxBytes          int64    `json:"max_bytes"`
	Consumers         []string `json:"consumers"`
}

// ledgerStreams are the names of the ledger's streams and of its buckets'
// streams. An authenticated deployment keeps them in three accounts
// (docs/security.md), so an account-wide listing ($JS.API.STREAM.LIST)
// shows only one account's: each is asked for by name, which the
// operators' imports send to the account that holds it. optional are
// those that may well be missing: the scratch bucket of a rebuild.
func ledgerStreams(prefix string) (names, optional []string, err error) {
	names = []string{wire.StreamIn, wire.StreamLog, wire.StreamDLQ}
	for _, b := range []string{wire.BucketTasks, wire.BucketProjector, wire.BucketWitness, wire.BucketLeases} {
		cfg, err := streams.Bucket(b, streams.Options{Prefix: prefix})
		if err != nil {
			return nil, nil, err
		}
		names = append(names, "KV_"+cfg.Bucket)
	}
	return names, []string{"KV_" + projector.RebuildBucket}, nil
}

// StreamsApply creates or updates the ledger's streams and buckets from the
// embedded definitions ("streams apply"). It is idempotent. The services
// of an authenticated deployment may not update a stream or bucket, so a
// changed setting is applied here.
func StreamsApply(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl streams apply", "[-replicas N] [-partitions N] [-tasks-max-bytes N] [-marks-max-bytes N] [-principals a,b -inbox-max-bytes N]",
		"Create or update the streams LEDGER_IN, LEDGER_LOG and LEDGER_DLQ and the buckets from the\n"+
			"definitions embedded in the binary (streams/*.json), with the subject prefix of -prefix.\n"+
			"Give the bucket sizes the projector runs with: the services create, never update.\n"+
			"With -principals, each principal gets an inbox of its own, LEDGER_IN_<principal>, in place\n"+
			"of LEDGER_IN, which must then be empty: it is deleted (docs/operations.md, \"Inboxes per\n"+
			"principal\"). Run it again with a new principal added; the others' inboxes are kept.", stderr)
	replicas := f.Int("replicas", 1, "replicas of every stream: 1, or 3 in a cluster (env LEDGER_REPLICAS)")
	tasksMax := f.Int64("tasks-max-bytes", 0, "max_bytes of ledger_tasks, as the projector's flag: 0 keeps the default (512 MiB), -1 lifts it (env LEDGER_TASKS_MAX_BYTES)")
	var principals listFlag
	f.Var(&principals, "principals", "principals to give an inbox of their own, comma-separated (env LEDGER_PRINCIPALS)")
	inboxMax := f.Int64("inbox-max-bytes", 0, "max_bytes of each principal's inbox: 0 keeps what it has, or 256 MiB for a new one (env LEDGER_INBOX_MAX_BYTES)")
	partitions := f.Int("partitions", 0, "partition count N of the deployment: LEDGER_IN's and each inbox's subjects, two per partition; 0 keeps the subjects a stream has, and with -principals takes N from LEDGER_IN or an inbox (env LEDGER_PARTITIONS)")
	marksMax := f.Int64("marks-max-bytes", 0, "max_bytes of ledger_projector, as the projector's flag: 0 keeps the default (32 MiB), -1 lifts it (env LEDGER_MARKS_MAX_BYTES)")
	// Not connect.EnvInt: it exits the process on a malformed value.
	for env, flag := range map[string]string{"LEDGER_REPLICAS": "replicas", "LEDGER_TASKS_MAX_BYTES": "tasks-max-bytes",
		"LEDGER_MARKS_MAX_BYTES": "marks-max-bytes", "LEDGER_INBOX_MAX_BYTES": "inbox-max-bytes", "LEDGER_PARTITIONS": "partitions"} {
		if v := connect.Env(env, ""); v != "" {
			if err := f.Set(flag, v); err != nil {
				return Usagef("%s=%q is not an integer", env, v)
			}
		}
	}
	if v := connect.Env("LEDGER_PRINCIPALS", ""); v != "" {
		_ = principals.Set(v)
	}
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	for _, p := range principals {
		if !wire.ValidID(p) {
			return Usagef("-principals: %q is not a principal (1..128 of [A-Za-z0-9_-])", p)
		}
	}
	if *inboxMax < 0 {
		return Usagef("-inbox-max-bytes must not be negative")
	}
	if *partitions < 0 || *partitions > ingest.MaxPartitions {
		return Usagef("-partitions must be 0..%d", ingest.MaxPartitions)
	}
	if *replicas < 1 || *replicas > 5 {
		return Usagef("-replicas must be 1..5, got %d", *replicas)
	}
	if *tasksMax < -1 || *marksMax < -1 {
		return Usagef("-tasks-max-bytes and -marks-max-bytes must be -1 or more")
	}
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()
	opts := streams.Options{Prefix: f.Prefix, Replicas: *replicas, Partitions: *partitions, Principals: principals, InboxMaxBytes: *inboxMax}
	actx, cancel := context.WithTimeout(ctx, 3*RequestTimeout)
	defer cancel()
	if len(principals) > 0 {
		// New inboxes get the subjects the ingest gives LEDGER_IN: in an
		// authenticated deployment it may create a stream, never update one.
		if opts.Partitions == 0 {
			if opts.Partitions, err = streams.PartitionsOf(actx, js, f.Prefix); err != nil {
				return err
			}
		}
		if err := dropEmptySharedInbox(actx, js); err != nil {
			return err
		}
	}
	if err := streams.Apply(actx, js, opts); err != nil {
		return err
	}
	sizes := map[string]int64{wire.BucketTasks: *tasksMax, wire.BucketProjector: *marksMax}
	for _, b := range []string{wire.BucketTasks, wire.BucketProjector, wire.BucketWitness, wire.BucketLeases} {
		cfg, err := streams.Bucket(b, opts)
		if err != nil {
			return err
		}
		if n := sizes[b]; n != 0 {
			cfg.MaxBytes = n
		}
		if _, err := streams.CreateOrUpdateKeyValue(actx, js, cfg); err != nil {
			return fmt.Errorf("streams: apply bucket %s: %w", cfg.Bucket, err)
		}
	}
	return listStreams(ctx, f, js, stdout)
}

// dropEmptySharedInbox deletes LEDGER_IN before principals get inboxes of
// their own, when it holds nothing: a message in it waits for its verdict,
// so a LEDGER_IN that holds one is an error (stop the workers, let the
// ingest decide what it holds, and run again).
func dropEmptySharedInbox(ctx context.Context, js jetstream.JetStream) error {
	st, err := js.Stream(ctx, wire.StreamIn)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", wire.StreamIn, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", wire.StreamIn, err)
	}
	if n := info.State.Msgs; n > 0 {
		return fmt.Errorf("%s holds %d events without a verdict: stop the workers, let the ingest decide them, and run again "+
			"(docs/operations.md, \"Inboxes per principal\")", wire.StreamIn, n)
	}
	if err := js.DeleteStream(ctx, wire.StreamIn); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete the empty %s: %w", wire.StreamIn, err)
	}
	return nil
}

// StreamsList lists every stream and bucket of the ledger ("streams list").
func StreamsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl streams list", "",
		"List the ledger's streams and buckets, whichever account holds each, with their consumers.", stderr)
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()
	return listStreams(ctx, f, js, stdout)
}

func listStreams(ctx context.Context, f *Flags, js jetstream.JetStream, stdout io.Writer) error {
	names, optional, err := ledgerStreams(f.Prefix)
	if err != nil {
		return err
	}
	// The inboxes in place of LEDGER_IN: one, or one per principal.
	names = append(inboxes(ctx, js, f.Prefix), slices.DeleteFunc(names, func(n string) bool { return n == wire.StreamIn })...)
	var rows []streamRow
	for _, name := range append(names, optional...) {
		r, err := describeStream(ctx, js, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) && slices.Contains(optional, name) {
			continue
		}
		if err != nil {
			return err
		}
		rows = append(rows, r)
	}
	if f.JSON {
		return writeJSONLines(stdout, rows)
	}
	t := newTable(stdout, "STREAM", "SUBJECTS", "RETENTION", "REPLICAS", "DUPLICATE WINDOW", "MESSAGES", "BYTES",
		"MAX BYTES", "CONSUMERS")
	for _, r := range rows {
		t.row(r.Stream, strings.Join(r.Subjects, ","), r.Retention, r.Replicas,
			time.Duration(r.DuplicateWindowMS)*time.Millisecond, r.Messages, r.Bytes, r.MaxBytes,
			strings.Join(r.Consumers, ","))
	}
	return t.flush()
}

// describeStream reads one stream's configuration, state and consumers.
func describeStream(ctx context.Context, js jetstream.JetStream, name string) (streamRow, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return streamRow{}, fmt.Errorf("stream %s: %w", name, err)
	}
	info := s.CachedInfo()
	r := streamRow{Stream: name, Subjects: info.Config.Subjects, Retention: retention(info.Config.Retention),
		Replicas: info.Config.Replicas, DuplicateWindowMS: info.Config.Duplicates.Milliseconds(),
		Messages: info.State.Msgs, Bytes: info.State.Bytes, MaxBytes: info.Config.MaxBytes, Consumers: []string{}}
	lister := s.ConsumerNames(ctx)
	for n := range lister.Name() {
		r.Consumers = append(r.Consumers, n)
	}
	if err := lister.Err(); err != nil {
		return streamRow{}, fmt.Errorf("consumers of %s: %w", name, err)
	}
	slices.Sort(r.Consumers)
	return r, nil
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
