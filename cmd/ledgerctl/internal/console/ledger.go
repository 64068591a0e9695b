package console

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
)

// Ledger is what the console reads and does through ledgerctl's own
// commands (package ctl implements it), so that a page shows what "ledgerctl
// leases", "dlq list" and "task" print and a replay is "ledgerctl dlq
// replay", not a second reading of the contract.
type Ledger interface {
	// Leases lists the lease of every partition ever leased, in partition
	// order, with the time left by the database's clock.
	Leases(ctx context.Context) ([]Lease, error)
	// DeadLetter decodes one LEDGER_DLQ message. It never fails: what
	// cannot be read is said in DeadLetter.Unusable.
	DeadLetter(seq uint64, subject string, h nats.Header, data []byte) DeadLetter
	// Task reads a task's committed events in version order, its
	// rejections and its projection.
	Task(ctx context.Context, id string) (Task, error)
	// Replay re-submits the dead letter with LEDGER_DLQ sequence seq to
	// LEDGER_IN (under a fresh event id when newID is set) and waits up to
	// wait for its new verdict.
	Replay(ctx context.Context, seq uint64, newID bool, wait time.Duration) (ReplayResult, error)
}

// ErrNotFound is returned by Ledger.Replay for a sequence LEDGER_DLQ does
// not hold.
var ErrNotFound = errors.New("no such dead letter")

// Lease is one partition's lease.
type Lease struct {
	Partition  int
	Holder     string
	Generation int64
	Valid      bool
	// TimeLeftMS is the expiry minus the database's clock; negative once
	// expired.
	TimeLeftMS int64
	TTLMS      int64
	ExpiresAt  time.Time
}

// DeadLetter is one LEDGER_DLQ message as ledgerctl decodes it.
type DeadLetter struct {
	Seq     uint64
	Subject string
	// Partition is nil for <prefix>.dlq.invalid.
	Partition         *int
	Task              string
	EventID           string
	Version           int64
	Type              string
	Holder            string
	Generation        int64
	Verdict           string
	Reason            string
	CurrentGeneration int64
	CurrentHolder     string
	// RejectedAt is the Ledger-Rejected-At header as written.
	RejectedAt    string
	SourceSubject string
	SourceSeq     uint64
	// Header is the original message's headers (without the ledger's
	// dead-letter headers); Body its body.
	Header nats.Header
	Body   []byte
	// Unusable says why the letter cannot be replayed; empty if it can.
	Unusable string
}

// TaskEvent is one committed event of a task.
type TaskEvent struct {
	Seq         int64
	EventID     string
	Partition   int
	Version     int64
	Type        string
	Holder      string
	Generation  int64
	CommittedAt string
	Payload     json.RawMessage
}

// TaskRejection is one row of ledger.rejections for a task.
type TaskRejection struct {
	ID                int64
	EventID           string
	Partition         int
	Version           int64
	Holder            string
	Generation        int64
	Verdict           string
	Reason            string
	CurrentGeneration int64
	RejectedAt        string
}

// TaskProjection is a task's value in the bucket ledger_tasks; Revision is
// 0 and Note says why when there is none.
type TaskProjection struct {
	Revision uint64
	StoredAt string
	Value    json.RawMessage
	Note     string
}

// Task is what "ledgerctl task" shows of one task.
type Task struct {
	ID         string
	Events     []TaskEvent
	Rejections []TaskRejection
	Projection TaskProjection
	// Owner is the principal that wrote version 1, which alone may write
	// the task; "" where none is known.
	Owner string
	// Snapshot is set for a snapshot task (docs/contract.md §14): its
	// versions rise with gaps and its projection is the newest snapshot.
	Snapshot bool
	// Archived, when the task's first versions were archived (ledgerctl
	// archive), says which: Events then starts after them.
	Archived string
}

// ReplayResult is what became of one replayed dead letter, as "ledgerctl
// dlq replay" reports it.
type ReplayResult struct {
	Seq        uint64
	EventID    string
	NewEventID string
	// Subject is the LEDGER_IN subject it was published to.
	Subject string
	// Result is submitted, deduplicated, not_replayable, not_found or
	// failed.
	Result string
	InSeq  uint64
	// Verdict and Reason are the new verdict, from the holder's receipt;
	// empty if none came in time.
	Verdict, Reason string
	Detail          string
}
