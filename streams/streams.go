// Package streams holds the ledger's JetStream streams and consumers as JSON
// (see README.md in this folder for why each setting is what it is) and
// applies them idempotently.
package streams

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

//go:embed *.json
var files embed.FS

// Options adjust the embedded definitions to a deployment.
type Options struct {
	// Prefix is the subject prefix; default "ledger".
	Prefix string
	// Replicas is the replica count of every stream; default 1 (3 in a cluster).
	Replicas int
	// Partitions, when set, makes LEDGER_IN store only the subjects of
	// partitions 0..Partitions-1, so every stored event belongs to one
	// partition's consumer (the ingest sets it). Zero keeps the subjects
	// LEDGER_IN already has, or <prefix>.in.> for a new stream.
	Partitions int
	// Principals, when set, gives each of them an inbox stream of its own,
	// LEDGER_IN_<principal> (InboxStream), in place of the shared LEDGER_IN,
	// which must then not exist. An inbox stream that exists is kept and
	// applied again whether listed or not. Default none: one LEDGER_IN.
	Principals []string
	// InboxMaxBytes is the max_bytes of each principal's inbox stream: its
	// share. Default: what the stream has, or InboxMaxBytesDefault.
	InboxMaxBytes int64
}

// InboxMaxBytesDefault is a principal's inbox share when none is given:
// 256 MiB.
const InboxMaxBytesDefault = 256 << 20

// ErrSharedInboxInUse is Apply's error when principals are given inboxes of
// their own while LEDGER_IN still exists: both cannot hold the same
// subjects (docs/operations.md, "Inboxes per principal").
var ErrSharedInboxInUse = errors.New("streams: LEDGER_IN exists; drain and delete it before giving principals inboxes of their own")

func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = wire.PrefixDefault
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	return o
}

func load(name string, o Options, into any) error {
	b, err := files.ReadFile(name)
	if err != nil {
		return fmt.Errorf("streams: read %s: %w", name, err)
	}
	b = []byte(strings.ReplaceAll(string(b), "{prefix}", o.Prefix))
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("streams: parse %s: %w", name, err)
	}
	return nil
}

// Stream returns the definition of one of the ledger's streams
// (wire.StreamIn, wire.StreamLog or wire.StreamDLQ).
func Stream(name string, o Options) (jetstream.StreamConfig, error) {
	o = o.withDefaults()
	var cfg jetstream.StreamConfig
	file := map[string]string{wire.StreamIn: "ledger_in.json", wire.StreamLog: "ledger_log.json", wire.StreamDLQ: "ledger_dlq.json"}[name]
	if file == "" {
		return cfg, fmt.Errorf("streams: no stream named %q", name)
	}
	if err := load(file, o, &cfg); err != nil {
		return cfg, err
	}
	cfg.Replicas = o.Replicas
	return cfg, nil
}

// Consumer returns the definition of a durable consumer by file stem, for
// example "ingest" (consumer_ingest.json).
func Consumer(stem string, o Options) (jetstream.ConsumerConfig, error) {
	var cfg jetstream.ConsumerConfig
	err := load("consumer_"+stem+".json", o.withDefaults(), &cfg)
	return cfg, err
}

// Apply creates or updates the three streams. It is idempotent, so every
// process may call it at start. With Principals, each gets its inbox
// stream (ApplyInboxes) in place of LEDGER_IN. Without, LEDGER_IN is
// applied unless principals' inboxes already hold its subjects: then it is
// left out, so services need not know the principals (nor list streams).
func Apply(ctx context.Context, js jetstream.JetStream, o Options) error {
	o = o.withDefaults()
	if len(o.Principals) > 0 {
		if err := ApplyInboxes(ctx, js, o, o.Principals); err != nil {
			return err
		}
	}
	for _, name := range []string{wire.StreamIn, wire.StreamLog, wire.StreamDLQ} {
		if name == wire.StreamIn && len(o.Principals) > 0 {
			continue
		}
		cfg, err := Stream(name, o)
		if err != nil {
			return err
		}
		if name == wire.StreamIn {
			if cfg.Subjects, err = inSubjects(ctx, js, o); err != nil {
				return err
			}
		}
		_, err = CreateOrUpdateStream(ctx, js, cfg)
		if name == wire.StreamIn && isSubjectOverlap(err) {
			continue // the principals have inboxes of their own
		}
		if err != nil {
			return fmt.Errorf("streams: apply %s: %w", name, err)
		}
	}
	return nil
}

// Inboxes lists the streams that hold workers' events: LEDGER_IN, or the
// principals' own LEDGER_IN_<principal>, sorted. It asks the server for the
// streams whose subjects meet <prefix>.in.>.
func Inboxes(ctx context.Context, js jetstream.JetStream, prefix string) ([]string, error) {
	subj := wire.Subjects{Prefix: Options{Prefix: prefix}.withDefaults().Prefix}
	names := js.StreamNames(ctx, jetstream.WithStreamListSubject(subj.InAll()))
	var out []string
	for n := range names.Name() {
		if _, ok := wire.InboxPrincipal(n); ok {
			out = append(out, n)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, fmt.Errorf("streams: list the inbox streams: %w", err)
	}
	slices.Sort(out)
	return out, nil
}

// PartitionsOf is the partition count the streams of workers' events were
// made with: that of LEDGER_IN, or else of the first inbox whose subjects
// are two per partition (Options.Partitions); 0 when none has such
// subjects. `ledgerctl streams apply` gives it to the inboxes it makes: in
// an authenticated deployment the ingest may not update them to its own.
func PartitionsOf(ctx context.Context, js jetstream.JetStream, prefix string) (int, error) {
	subj := wire.Subjects{Prefix: Options{Prefix: prefix}.withDefaults().Prefix}
	names, err := Inboxes(ctx, js, prefix)
	if err != nil {
		return 0, err
	}
	for _, n := range names {
		st, err := js.Stream(ctx, n)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("streams: read %s: %w", n, err)
		}
		have := st.CachedInfo().Config.Subjects
		principal, _ := wire.InboxPrincipal(n)
		k := len(have) / 2
		want := make([]string, 0, len(have))
		for p := range k {
			want = append(want, subj.InPrincipalPartition(principal, p), subj.InPrincipalBatchPartition(principal, p))
		}
		if k > 0 && len(have)%2 == 0 && slices.Equal(slices.Sorted(slices.Values(have)), slices.Sorted(slices.Values(want))) {
			return k, nil
		}
	}
	return 0, nil
}

// Inbox is the definition of principal's inbox stream: LEDGER_IN's, with
// the principal's subjects only and its own max_bytes.
func Inbox(principal string, o Options) (jetstream.StreamConfig, error) {
	if !wire.ValidID(principal) {
		return jetstream.StreamConfig{}, fmt.Errorf("streams: %q is not a principal", principal)
	}
	cfg, err := Stream(wire.StreamIn, o)
	if err != nil {
		return cfg, err
	}
	cfg.Name = wire.InboxStream(principal)
	cfg.Description = "Inbound events of the principal " + principal +
		", within its own share; each message gets exactly one verdict from the ingest service."
	cfg.MaxBytes = InboxMaxBytesDefault
	if o.InboxMaxBytes != 0 {
		cfg.MaxBytes = o.InboxMaxBytes
	}
	subj := wire.Subjects{Prefix: o.withDefaults().Prefix}
	cfg.Subjects = []string{subj.InPrincipal(principal)}
	if o.Partitions > 0 {
		cfg.Subjects = make([]string, 0, 2*o.Partitions)
		for p := range o.Partitions {
			cfg.Subjects = append(cfg.Subjects, subj.InPrincipalPartition(principal, p),
				subj.InPrincipalBatchPartition(principal, p))
		}
	}
	return cfg, nil
}

// ApplyInboxes applies the inbox stream of each of principals, and fails
// with ErrSharedInboxInUse while LEDGER_IN exists. A stream that exists
// keeps its max_bytes unless o gives one, and its subjects unless o names
// the partitions.
func ApplyInboxes(ctx context.Context, js jetstream.JetStream, o Options, principals []string) error {
	o = o.withDefaults()
	if _, err := js.Stream(ctx, wire.StreamIn); err == nil {
		return ErrSharedInboxInUse
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("streams: read %s: %w", wire.StreamIn, err)
	}
	for _, p := range principals {
		po := o
		st, err := js.Stream(ctx, wire.InboxStream(p))
		exists := err == nil
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("streams: read %s: %w", wire.InboxStream(p), err)
		}
		if exists && o.InboxMaxBytes == 0 {
			po.InboxMaxBytes = st.CachedInfo().Config.MaxBytes
		}
		cfg, err := Inbox(p, po)
		if err != nil {
			return err
		}
		if exists && o.Partitions == 0 {
			cfg.Subjects = st.CachedInfo().Config.Subjects
		}
		if _, err := CreateOrUpdateStream(ctx, js, cfg); err != nil {
			return fmt.Errorf("streams: apply %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// isSubjectOverlap reports whether err is the server refusing a stream
// whose subjects another stream holds.
func isSubjectOverlap(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jsErrStreamSubjectOverlap
}

// jsErrStreamSubjectOverlap is the server's error code for "subjects
// overlap with an existing stream" (nats-server JSStreamSubjectOverlapErr).
const jsErrStreamSubjectOverlap = 10065

// CreateOrUpdateStream creates the stream, and updates it only when it
// exists with another configuration. The services of an authenticated
// deployment may create a missing stream but never update one (an update
// could make a stream republish what it stores, or take in another
// stream's messages under new subjects), so a stream that matches must not
// cost an update.
func CreateOrUpdateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.UpdateStream(ctx, cfg)
	}
	return st, err
}

// CreateOrUpdateKeyValue is CreateOrUpdateStream for a bucket.
func CreateOrUpdateKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.UpdateKeyValue(ctx, cfg)
	}
	return kv, err
}

// inSubjects are LEDGER_IN's subjects: two per partition (its single
// events and its batches), or (Partitions unset) those it has, with the
// batch subject of each partition it has added.
func inSubjects(ctx context.Context, js jetstream.JetStream, o Options) ([]string, error) {
	subj := wire.Subjects{Prefix: o.withDefaults().Prefix}
	if o.Partitions > 0 {
		out := make([]string, 0, 2*o.Partitions)
		for p := range o.Partitions {
			out = append(out, subj.InPartition(p), subj.InBatchPartition(p))
		}
		return out, nil
	}
	st, err := js.Stream(ctx, wire.StreamIn)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return []string{subj.InAll()}, nil
	case err != nil:
		return nil, fmt.Errorf("streams: read %s: %w", wire.StreamIn, err)
	}
	have := st.CachedInfo().Config.Subjects
	for _, sub := range have {
		if !strings.HasPrefix(sub, subj.InAll()[:len(subj.InAll())-1]) {
			return []string{subj.InAll()}, nil // another prefix: start afresh
		}
	}
	return withBatchSubjects(subj, have), nil
}

// withBatchSubjects is have with the batch subject of each partition whose
// single-event subject it has: a stream made before batches existed gets
// them from `ledgerctl streams apply` (docs/operations.md, "Upgrading to
// an ingest that takes batches").
func withBatchSubjects(subj wire.Subjects, have []string) []string {
	out := slices.Clone(have)
	for _, sub := range have {
		batch, ok := strings.CutSuffix(sub, ".*")
		if !ok || !strings.HasPrefix(sub, subj.InBatchPartition(0)[:len(subj.InBatchPartition(0))-1]) {
			continue
		}
		if !slices.Contains(out, batch) {
			out = append(out, batch)
		}
	}
	return out
}

// bucketFiles maps each bucket's name to the file that defines it.
var bucketFiles = map[string]string{
	wire.BucketTasks:     "bucket_tasks.json",
	wire.BucketProjector: "bucket_projector.json",
	wire.BucketWitness:   "bucket_witness.json",
	wire.BucketLeases:    "bucket_leases.json",
}

// Bucket returns the definition of a KV bucket by its name: wire.BucketTasks,
// wire.BucketProjector, wire.BucketWitness or wire.BucketLeases.
func Bucket(name string, o Options) (jetstream.KeyValueConfig, error) {
	o = o.withDefaults()
	var cfg jetstream.KeyValueConfig
	file := bucketFiles[name]
	if file == "" {
		return cfg, fmt.Errorf("streams: no bucket named %q", name)
	}
	if err := load(file, o, &cfg); err != nil {
		return cfg, err
	}
	cfg.Replicas = o.Replicas
	return cfg, nil
}

// ApplyBucket creates or updates a KV bucket by its name (see Bucket).
func ApplyBucket(ctx context.Context, js jetstream.JetStream, name string, o Options) (jetstream.KeyValue, error) {
	cfg, err := Bucket(name, o)
	if err != nil {
		return nil, err
	}
	kv, err := CreateOrUpdateKeyValue(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("streams: apply bucket %s: %w", name, err)
	}
	return kv, nil
}
