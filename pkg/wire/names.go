package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PrefixDefault is the default subject prefix ("ledger").
const PrefixDefault = "ledger"

// Stream, consumer and bucket names are fixed by the contract, whatever the
// subject prefix.
const (
	StreamIn = "LEDGER_IN"
	// StreamInboxPrefix begins the name of a principal's own inbox,
	// LEDGER_IN_<principal>, in a deployment that gives each principal a
	// share of its own (docs/contract.md §2, "Inboxes").
	StreamInboxPrefix = StreamIn + "_"
	StreamLog         = "LEDGER_LOG"
	StreamDLQ         = "LEDGER_DLQ"
	// BucketTasks is the KV bucket holding one projection per task.
	BucketTasks = "ledger_tasks"
	// BucketProjector is the projector's own bookkeeping (which tasks wait
	// for a missing version); not part of the contract.
	BucketProjector = "ledger_projector"
	// BucketWitness is what the ledger acknowledged, kept outside
	// PostgreSQL: per partition, the highest lease generation granted, so
	// that a database that forgot grants never issues one twice.
	BucketWitness = "ledger_witness"
	// ServiceName is the name of the lease micro service.
	ServiceName = "ledger"
)

// Headers of inbound events (docs/contract.md §2).
const (
	HeaderMsgID      = "Nats-Msg-Id"
	HeaderHolder     = "Ledger-Holder"
	HeaderGeneration = "Ledger-Generation"
	HeaderVersion    = "Ledger-Version"
	HeaderType       = "Ledger-Type"
	// HeaderKind, optional, is the kind of task the event is for:
	// KindSnapshot, or KindEvents (the default when absent). The first
	// committed event of a task chooses its kind for ever (docs/contract.md
	// §14). Log copies of a snapshot task carry it too.
	HeaderKind = "Ledger-Kind"
)

// The kinds of task (docs/contract.md §14).
const (
	// KindEvents is a task applied event by event: dense versions, an
	// early version waits for the missing ones.
	KindEvents = "events"
	// KindSnapshot is a task whose every event is a complete snapshot of
	// its state: versions rise, a later version does not wait for missing
	// ones, and the newest committed snapshot is the task's state.
	KindSnapshot = "snapshot"
)

// ValidKind reports whether k names a kind of task.
func ValidKind(k string) bool { return k == KindEvents || k == KindSnapshot }

// Extra headers of committed-log copies (docs/contract.md §4).
const (
	HeaderSeq         = "Ledger-Seq"
	HeaderTask        = "Ledger-Task"
	HeaderPartition   = "Ledger-Partition"
	HeaderCommittedAt = "Ledger-Committed-At"
	// HeaderWouldReject, on a log copy committed under the observe fence
	// mode, is what enforce would have answered: "stale/<reason>".
	HeaderWouldReject = "Ledger-Would-Reject"
)

// Extra headers of dead letters (docs/contract.md §5).
const (
	HeaderVerdict           = "Ledger-Verdict"
	HeaderReason            = "Ledger-Reason"
	HeaderCurrentGeneration = "Ledger-Current-Generation"
	HeaderCurrentHolder     = "Ledger-Current-Holder"
	HeaderRejectedAt        = "Ledger-Rejected-At"
	HeaderSourceSeq         = "Ledger-Source-Seq"
	// HeaderTruncated is set on a dead letter whose original body was cut
	// to fit the stream; its value is the original body's size in bytes.
	HeaderTruncated = "Ledger-Truncated"
	// HeaderSourceSubject is the subject the rejected message was published
	// on (it names the holder that sent it).
	HeaderSourceSubject = "Ledger-Source-Subject"
	// HeaderHeadersDropped is set on a dead letter whose original headers
	// were too large to carry; its value is their size in bytes.
	HeaderHeadersDropped = "Ledger-Headers-Dropped"
)

// HeaderExpectedPrefix starts the names of JetStream's publish
// preconditions (Nats-Expected-Stream, ...): one-shot, so a dead letter
// and a replay leave them out.
const HeaderExpectedPrefix = "Nats-Expected-"

// DeadLetterHeaders are the headers only the ledger writes on a dead
// letter; a worker's own headers of these names are not carried over.
var DeadLetterHeaders = []string{HeaderVerdict, HeaderReason, HeaderCurrentGeneration, HeaderCurrentHolder,
	HeaderRejectedAt, HeaderSourceSeq, HeaderSourceSubject, HeaderTruncated, HeaderHeadersDropped}

// Limits on an inbound message's headers (docs/contract.md §3: oversized headers
// are invalid). They keep every dead letter within the stream's message
// size, whatever a worker sends: the contract's headers need a few hundred
// bytes.
const (
	// MaxHeaderBytes is the most header bytes (names, values and their
	// framing, as NATS sends them) an inbound event may carry: 8 KiB.
	MaxHeaderBytes = 8 << 10
	// MaxHeaderValues is the most header values an inbound event may carry.
	MaxHeaderValues = 64
)

// Subjects builds and parses the contract's subjects under one prefix.
// The zero value uses PrefixDefault.
type Subjects struct {
	// Prefix is the first subject token, "ledger" by default.
	Prefix string
}

func (s Subjects) p() string {
	if s.Prefix == "" {
		return PrefixDefault
	}
	return s.Prefix
}

// In is the subject a holder publishes an event to (docs/contract.md §2):
// <prefix>.in.<principal>.<instance>.<partition>.<task>. holder is the
// holder id, <principal>.<instance>.
func (s Subjects) In(holder string, partition int, task string) string {
	return s.p() + ".in." + holder + "." + strconv.Itoa(partition) + "." + task
}

// InAll is the filter of every inbound subject.
func (s Subjects) InAll() string { return s.p() + ".in.>" }

// InTask is the filter of one task's inbound subjects, whoever publishes.
func (s Subjects) InTask(partition int, task string) string {
	return s.p() + ".in.*.*." + strconv.Itoa(partition) + "." + task
}

// InPartition is the filter of partition's events in LEDGER_IN, from any
// holder: <prefix>.in.*.*.<partition>.*.
func (s Subjects) InPartition(partition int) string {
	return s.p() + ".in.*.*." + strconv.Itoa(partition) + ".*"
}

// InPrincipalPartition is the filter of one principal's events in
// partition: <prefix>.in.<principal>.*.<partition>.*. principal "*" is
// InPartition.
func (s Subjects) InPrincipalPartition(principal string, partition int) string {
	return s.p() + ".in." + principal + ".*." + strconv.Itoa(partition) + ".*"
}

// InPrincipalBatchPartition is the filter of one principal's batches in
// partition: <prefix>.in.<principal>.*.<partition>.
func (s Subjects) InPrincipalBatchPartition(principal string, partition int) string {
	return s.p() + ".in." + principal + ".*." + strconv.Itoa(partition)
}

// InboxStream is the inbox stream of principal's events:
// LEDGER_IN_<principal> (docs/contract.md §2, "Inboxes").
func InboxStream(principal string) string { return StreamInboxPrefix + principal }

// InboxPrincipal is the principal whose events the inbox stream name holds:
// "*" (every principal's) for LEDGER_IN, the principal for
// LEDGER_IN_<principal>; ok is false for any other name.
func InboxPrincipal(stream string) (principal string, ok bool) {
	if stream == StreamIn {
		return "*", true
	}
	p, ok := strings.CutPrefix(stream, StreamInboxPrefix)
	if !ok || !ValidID(p) {
		return "", false
	}
	return p, true
}

// InPrincipal is the filter of every inbound subject of one principal:
// what a worker of that principal may publish to.
func (s Subjects) InPrincipal(principal string) string { return s.p() + ".in." + principal + ".>" }

// Log is the committed-log subject of a task: <prefix>.log.<partition>.<task>.
func (s Subjects) Log(partition int, task string) string {
	return s.p() + ".log." + strconv.Itoa(partition) + "." + task
}

// LogTask is the filter of a task's copies whatever its partition:
// <prefix>.log.*.<task>.
func (s Subjects) LogTask(task string) string { return s.p() + ".log.*." + task }

// LogAll is the filter of the whole committed log.
func (s Subjects) LogAll() string { return s.p() + ".log.>" }

// LogPartition is the filter of one partition's committed log.
func (s Subjects) LogPartition(partition int) string {
	return s.p() + ".log." + strconv.Itoa(partition) + ".*"
}

// DLQ is the dead-letter subject of a task: <prefix>.dlq.<partition>.<task>.
func (s Subjects) DLQ(partition int, task string) string {
	return s.p() + ".dlq." + strconv.Itoa(partition) + "." + task
}

// DLQInvalid is the dead-letter subject for messages whose subject is unusable.
func (s Subjects) DLQInvalid() string { return s.p() + ".dlq.invalid" }

// DLQAll is the filter of every dead letter.
func (s Subjects) DLQAll() string { return s.p() + ".dlq.>" }

// Receipt is the core-NATS subject a holder's verdicts are sent to:
// <prefix>.receipt.<principal>.<instance>.
func (s Subjects) Receipt(holder string) string { return s.p() + ".receipt." + holder }

// ReceiptPrincipal is the filter of every receipt subject of one principal.
func (s Subjects) ReceiptPrincipal(principal string) string {
	return s.p() + ".receipt." + principal + ".>"
}

// Lease operations a holder calls with its own holder id in the subject
// (docs/contract.md §1).
const (
	LeaseAcquire = "acquire"
	LeaseRenew   = "renew"
	LeaseRelease = "release"
)

// Lease is the subject of a lease operation of holder:
// <prefix>.lease.<op>.<principal>.<instance>.
func (s Subjects) Lease(op, holder string) string { return s.p() + ".lease." + op + "." + holder }

// LeaseAny is the subject the lease service serves op on, for every holder.
func (s Subjects) LeaseAny(op string) string { return s.p() + ".lease." + op + ".*.*" }

// LeaseGet and TaskHead are the public reads of the lease service.
func (s Subjects) LeaseGet() string { return s.p() + ".lease.get" }
func (s Subjects) TaskHead() string { return s.p() + ".task.head" }

// ParseLease reads the holder of a lease operation's subject.
func (s Subjects) ParseLease(op, subject string) (holder string, err error) {
	holder, ok := strings.CutPrefix(subject, s.p()+".lease."+op+".")
	if !ok || !ValidHolder(holder) {
		return "", fmt.Errorf("subject %q is not %s.lease.%s.<principal>.<instance>", subject, s.p(), op)
	}
	return holder, nil
}

// ParseIn splits an inbound subject into holder, partition and task. It
// checks the shape and the ids; whether the partition is below the
// configured count is the caller's check. A subject whose holder is valid
// returns the holder also with an error about the rest, so that its
// publisher can be told. The ingest parses every inbound
// subject twice (to route it, to decode it), so a well-formed one costs no
// allocation: the holder is the subject's own bytes.
func (s Subjects) ParseIn(subject string) (holder string, partition int, task string, err error) {
	rest, ok := strings.CutPrefix(subject, s.p()+".in.")
	principal, after, ok2 := strings.Cut(rest, ".")
	instance, tail, ok3 := strings.Cut(after, ".")
	if !ok || !ok2 || !ok3 {
		return "", 0, "", s.inShapeError(subject)
	}
	holder = rest[:len(principal)+1+len(instance)]
	if !ValidHolder(holder) {
		return "", 0, "", fmt.Errorf("subject %q: holder %q is not <principal>.<instance>, each 1..64 of [A-Za-z0-9_-]", subject, holder)
	}
	partition, task, err = partitionTask(tail)
	switch {
	case err == errNotPartitionTask:
		return holder, 0, "", s.inShapeError(subject)
	case err != nil:
		return holder, 0, "", fmt.Errorf("subject %q: %w", subject, err)
	}
	return holder, partition, task, nil
}

func (s Subjects) inShapeError(subject string) error {
	return fmt.Errorf("subject %q is not %s.in.<principal>.<instance>.<partition>.<task>", subject, s.p())
}

// ParseLog splits a committed-log subject into partition and task.
func (s Subjects) ParseLog(subject string) (partition int, task string, err error) {
	return s.parse(subject, "log")
}

// ParseDLQ splits a dead-letter subject into partition and task. The
// subject of dead letters whose own subject was unusable,
// <prefix>.dlq.invalid, has neither and is an error here.
func (s Subjects) ParseDLQ(subject string) (partition int, task string, err error) {
	return s.parse(subject, "dlq")
}

func (s Subjects) parse(subject, kind string) (int, string, error) {
	rest, ok := strings.CutPrefix(subject, s.p()+"."+kind+".")
	if !ok {
		return 0, "", fmt.Errorf("subject %q is not under %s.%s.", subject, s.p(), kind)
	}
	p, task, err := partitionTask(rest)
	switch {
	case err == errNotPartitionTask:
		return 0, "", fmt.Errorf("subject %q is not %s.%s.<partition>.<task>", subject, s.p(), kind)
	case err != nil:
		return 0, "", fmt.Errorf("subject %q: %w", subject, err)
	}
	return p, task, nil
}

// errNotPartitionTask is partitionTask's error for a tail that is not two
// tokens.
var errNotPartitionTask = errors.New("not <partition>.<task>")

// partitionTask reads the <partition>.<task> that ends every per-task
// subject.
func partitionTask(tail string) (int, string, error) {
	ps, task, ok := strings.Cut(tail, ".")
	if !ok || strings.Contains(task, ".") {
		return 0, "", errNotPartitionTask
	}
	p, err := parsePartition(ps)
	if err != nil {
		return 0, "", err
	}
	if !ValidID(task) {
		return 0, "", fmt.Errorf("task id %q is not 1..128 of [A-Za-z0-9_-]", task)
	}
	return p, task, nil
}

// parsePartition reads a partition token of a subject. One partition has
// one spelling: "03" would be a second subject for the same task, past the
// filters and permissions written for "3".
func parsePartition(ps string) (int, error) {
	p, err := canonicalInt(ps)
	if err != nil || p > 1<<30 {
		return 0, fmt.Errorf("partition %q is not a non-negative integer without leading zeros", ps)
	}
	return int(p), nil
}

// ParseInt parses a plain non-negative decimal integer (no sign, no spaces,
// no leading "+"), as used in headers.
func ParseInt(s string) (int64, error) {
	if s == "" || len(s) > 18 {
		return 0, fmt.Errorf("%q is not a decimal integer", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal integer", s)
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// FormatTime renders a time the way every contract field does (RFC3339Nano, UTC).
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
