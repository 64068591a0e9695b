package natsauth

import (
	"fmt"
	"slices"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// Accounts of an authenticated deployment. The streams and buckets live in
// three accounts that have no users: AccountLedger (what workers send and
// what the ingest refuses), AccountLog (the committed log) and
// AccountProjections (the buckets the projector writes). Every user is in
// an account of its own role, which reaches them only through their
// exports.
//
// Separate accounts are what keep a reply subject from being a weapon: a
// client names any reply subject it likes, and the NATS server (JetStream's
// API, publish acks, direct gets) and the lease service answer on it
// without a permission check. Across an import the server rewrites every
// reply subject, so answers land back in the requester's own account. A
// user in the account of LEDGER_IN could have had a direct get answered on
// ledger.in.<another principal>.…, which LEDGER_IN stored as that
// principal's event. A consumer delivers in the account of its stream, so
// the accounts also part what a service may create consumers on from what
// it must not write: the projector's consumers are on the log and on its
// own buckets, neither beside LEDGER_IN, LEDGER_DLQ or the receipts.
const (
	// AccountLedger holds LEDGER_IN, LEDGER_DLQ and the ingest's buckets.
	AccountLedger = "LEDGER"
	// AccountLog holds LEDGER_LOG.
	AccountLog = "LEDGER_COMMITTED"
	// AccountProjections holds the projector's buckets.
	AccountProjections = "LEDGER_PROJECTIONS"
	// AccountIngest holds the ingest's users; it serves the lease service
	// and sends the receipts.
	AccountIngest = "LEDGER_INGEST"
	// AccountProjector holds the projector's users.
	AccountProjector = "LEDGER_PROJECTOR"
	// AccountOperators holds the ledgerctl users.
	AccountOperators = "LEDGER_OPERATORS"
	// AccountWorkerPrefix, followed by the principal, is a worker
	// principal's account. Principals never share one: a reply one names
	// lands in its own account, never on another's receipts or inbox.
	AccountWorkerPrefix = "LEDGER_WORKER_"
	// AccountReaderPrefix, followed by the reader's name, is a reader's account.
	AccountReaderPrefix = "LEDGER_READER_"
	// AccountSystem is the NATS system account of operator mode.
	AccountSystem = "SYS"
)

// Roles of the users.
const (
	RoleIngest    = "ingest"
	RoleProjector = "projector"
	// RoleLedgerctl is the operators' role: ledgerctl and the nats CLI.
	RoleLedgerctl = "ledgerctl"
	RoleWorker    = "worker"
	RoleReader    = "reader"
)

// ServiceRoles are the roles of the LEDGER account's users.
var ServiceRoles = []string{RoleIngest, RoleProjector, RoleLedgerctl}

// MaxNameLen is the longest worker principal or reader name.
const MaxNameLen = wire.MaxHolderPartLen

// ValidName reports whether s may name a worker principal or a reader:
// 1..64 characters of [A-Za-z0-9_-]. A name is spliced into subjects and
// account names, so a dot would let a user named "reports.pod-1" publish as
// that holder of principal "reports", and "*" would match every principal.
func ValidName(s string) bool { return len(s) <= MaxNameLen && wire.ValidID(s) }

// InboxPrefix is the inbox prefix a user of role connects with; name is the
// principal or reader name, ignored for the services.
func InboxPrefix(role, name string) string {
	switch role {
	case RoleWorker:
		return wire.InboxPrefix(name)
	case RoleReader:
		return connect.InboxPrefixFor(name)
	}
	// The services default to the same prefix (cmd/ingest, cmd/projector,
	// ledgerctl's connections).
	return connect.InboxPrefixFor(role)
}

// Permissions are a user's subject permissions.
type Permissions struct {
	Publish, Subscribe []string
	// Responses lets the user answer each request it receives, once, on
	// the request's reply subject (allow_responses). Only the ingest has
	// it: it answers lease requests, whose replies come from the workers'
	// account as _R_ subjects the server made up.
	Responses bool
}

// Layout names the subjects of one ledger: its subject prefix, the names
// of the buckets, and the principals' inbox streams when they have them.
type Layout struct {
	prefix, tasksBucket, marksBucket string
	// inboxes are the streams LEDGER_IN_<principal> (WithInboxes), sorted.
	inboxes []string
}

// NewLayout returns the layout of a ledger with subject prefix prefix
// (default "ledger").
func NewLayout(prefix string) (Layout, error) {
	if prefix == "" {
		prefix = wire.PrefixDefault
	}
	if !wire.ValidID(prefix) {
		return Layout{}, fmt.Errorf("prefix %q is not one subject token of [A-Za-z0-9_-]", prefix)
	}
	marks, err := streams.Bucket(wire.BucketProjector, streams.Options{Prefix: prefix})
	if err != nil {
		return Layout{}, fmt.Errorf("natsauth: the projector's bucket: %w", err)
	}
	return Layout{prefix: prefix, tasksBucket: wire.BucketTasks, marksBucket: marks.Bucket}, nil
}

// Prefix is the subject prefix.
func (l Layout) Prefix() string { return l.prefix }

// WithInboxes returns l with an inbox stream of each of principals,
// LEDGER_IN_<principal> (docs/operations.md, "Inboxes per principal"):
// whatever reads and acks LEDGER_IN may do the same on each, by its name.
// A wildcard would match every stream of the account, not the inboxes only.
func (l Layout) WithInboxes(principals []string) Layout {
	l.inboxes = nil
	for _, p := range principals {
		l.inboxes = append(l.inboxes, wire.InboxStream(p))
	}
	slices.Sort(l.inboxes)
	l.inboxes = slices.Compact(l.inboxes)
	return l
}

// inStreams are the streams that hold workers' events: LEDGER_IN, and the
// principals' inboxes. LEDGER_IN stays: an ingest looks it up first, and
// it holds the events until an operator moves to inboxes.
func (l Layout) inStreams() []string { return append([]string{wire.StreamIn}, l.inboxes...) }

func (l Layout) p(rest string) string { return l.prefix + "." + rest }

// streamAPI lists the JetStream API subjects that create a missing stream
// and read the configuration of each stream. Never update, delete or
// purge: an update could make a stream republish what it stores, or take
// in another stream's messages under new subjects, so only operators
// change a stream that exists (`ledgerctl streams apply`).
func streamAPI(names ...string) []string {
	var s []string
	for _, n := range names {
		s = append(s, "$JS.API.STREAM.CREATE."+n, "$JS.API.STREAM.INFO."+n)
	}
	return s
}

// msgGetAPI lists the JetStream API subjects that read one message of
// each stream, directly or through the stream's leader.
func msgGetAPI(names ...string) []string {
	var s []string
	for _, n := range names {
		s = append(s, "$JS.API.STREAM.MSG.GET."+n, "$JS.API.DIRECT.GET."+n, "$JS.API.DIRECT.GET."+n+".>")
	}
	return s
}

// Permissions returns the permissions of a user of role; name is the
// principal of a worker or the name of a reader.
func (l Layout) Permissions(role, name string) (Permissions, error) {
	kvTasks, kvMarks := "KV_"+l.tasksBucket, "KV_"+l.marksBucket
	switch role {
	case RoleIngest:
		// Applies the streams and its consumer at start, consumes LEDGER_IN
		// (and each principal's inbox, with WithInboxes) and acks it, writes
		// the log copies, dead letters and receipts, and serves the lease
		// micro service. It reads single messages: the first queued message
		// of a task in LEDGER_IN or the inbox (is an earlier version still
		// waiting?) and the last copy of a task in LEDGER_LOG (did another
		// process store the version before?), by direct get where the
		// stream allows it. An inbox is confined as LEDGER_IN is: created
		// when missing, never updated, deleted or purged.
		kvWitness, kvLeases := "KV_"+wire.BucketWitness, "KV_"+wire.BucketLeases
		in := l.inStreams()
		pub := append([]string{"$JS.API.INFO"}, streamAPI(slices.Concat(in, []string{wire.StreamLog, wire.StreamDLQ, kvWitness, kvLeases})...)...)
		pub = append(pub, msgGetAPI(slices.Concat(in, []string{wire.StreamLog, kvWitness, kvLeases})...)...)
		pub = append(pub, "$KV."+wire.BucketWitness+".>", "$KV."+wire.BucketLeases+".>")
		if len(l.inboxes) > 0 {
			// It lists the inbox streams once LEDGER_IN is gone (names only).
			pub = append(pub, "$JS.API.STREAM.NAMES")
		}
		for _, st := range in {
			pub = append(pub,
				// One consumer per partition and inbox stream, named
				// ingest-<partition>-<epoch> (a new one per claim), and the
				// shared one of earlier versions to delete.
				"$JS.API.CONSUMER.CREATE."+st+".*",
				"$JS.API.CONSUMER.CREATE."+st+".*.>",
				"$JS.API.CONSUMER.INFO."+st+".*",
				"$JS.API.CONSUMER.DELETE."+st+".*",
				"$JS.API.CONSUMER.NAMES."+st,
				"$JS.API.CONSUMER.MSG.NEXT."+st+".*",
				"$JS.ACK."+st+".>")
		}
		pub = append(pub, l.p("log.>"), l.p("dlq.>"), l.p("receipt.>"))
		sub := []string{
			l.p("lease.acquire.*.*"), l.p("lease.renew.*.*"), l.p("lease.release.*.*"),
			l.p("lease.get"), l.p("task.head"),
			"$SRV.*", "$SRV.*." + wire.ServiceName, "$SRV.*." + wire.ServiceName + ".*",
			InboxPrefix(role, "") + ".>",
		}
		return Permissions{Publish: pub, Subscribe: sub, Responses: true}, nil
	case RoleProjector:
		// Applies the streams (so it may start before the ingest) and its
		// buckets, consumes LEDGER_LOG with one durable per partition set,
		// writes the buckets, lists its gap markers with an ordered
		// consumer, and on -rebuild builds in a scratch bucket, which it
		// reads with an ordered consumer and deletes, then recreates its
		// consumer. It never deletes ledger_tasks. It reads the ingests'
		// record of the newest PostgreSQL timeline (ledger_witness, key
		// timeline), never writes it.
		kvRebuild, kvWitness := "KV_"+projector.RebuildBucket, "KV_"+wire.BucketWitness
		pub := append([]string{"$JS.API.INFO"}, streamAPI(wire.StreamIn, wire.StreamLog, wire.StreamDLQ, kvTasks, kvMarks, kvRebuild)...)
		pub = append(pub, msgGetAPI(kvTasks, kvMarks, kvRebuild, kvWitness)...)
		pub = append(pub, "$JS.API.STREAM.INFO."+kvWitness)
		pub = append(pub,
			"$JS.API.STREAM.DELETE."+kvRebuild,
			"$JS.API.CONSUMER.CREATE."+kvRebuild+".>",
			"$JS.API.CONSUMER.INFO."+kvRebuild+".*",
			"$JS.API.CONSUMER.DELETE."+kvRebuild+".*",
			"$JS.FC."+kvRebuild+".>",
			"$KV."+projector.RebuildBucket+".>",
			"$JS.API.CONSUMER.CREATE."+wire.StreamLog+".*",
			"$JS.API.CONSUMER.CREATE."+wire.StreamLog+".*.>",
			"$JS.API.CONSUMER.INFO."+wire.StreamLog+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+wire.StreamLog+".*",
			"$JS.API.CONSUMER.DELETE."+wire.StreamLog+".*",
			"$JS.API.CONSUMER.CREATE."+kvMarks+".>",
			"$JS.API.CONSUMER.INFO."+kvMarks+".*",
			"$JS.API.CONSUMER.DELETE."+kvMarks+".*",
			"$JS.ACK."+wire.StreamLog+".>",
			"$JS.FC."+kvMarks+".>",
			"$KV."+l.tasksBucket+".>", "$KV."+l.marksBucket+".>")
		return Permissions{Publish: pub, Subscribe: []string{InboxPrefix(role, "") + ".>"}}, nil
	case RoleLedgerctl:
		// Everything in the account, but it reads only its own replies:
		// the services' deliveries of LEDGER_IN and LEDGER_LOG arrive on
		// their inboxes, which it cannot subscribe to.
		return Permissions{Publish: []string{">"},
			Subscribe: []string{InboxPrefix(role, "") + ".>", l.p(">"), "$KV.>", "$JS.EVENT.>"}}, nil
	case RoleWorker:
		// CONTRACT §9, word for word.
		return Permissions{
			Publish:   []string{l.p("in." + name + ".>"), l.p("lease.*." + name + ".*"), l.p("lease.get"), l.p("task.head")},
			Subscribe: []string{l.p("receipt." + name + ".>"), InboxPrefix(role, name) + ".>"},
		}, nil
	case RoleReader:
		// A direct get of one key, and the bucket's subjects to follow
		// changes. No JetStream API: across an import it would act on the
		// reader's own account, which has no JetStream; and no consumer,
		// whose delivery subject is the creator's choice.
		return Permissions{
			Publish:   []string{"$JS.API.DIRECT.GET." + kvTasks + ".>"},
			Subscribe: []string{"$KV." + l.tasksBucket + ".>", InboxPrefix(role, name) + ".>"},
		}, nil
	}
	return Permissions{}, fmt.Errorf("natsauth: no role %q", role)
}
