package wire

import "strconv"

// Lease TTL bounds (docs/contract.md §1).
const (
	// TTLDefaultMillis is the default lease TTL: 3000 ms.
	TTLDefaultMillis = 3000
	// TTLMinMillis is the shortest TTL a request may ask for.
	TTLMinMillis = 100
	// TTLMaxMillis is the longest TTL a request may ask for.
	TTLMaxMillis = 300000
)

// Error codes of the lease service.
const (
	ErrCodeHeld    = "held"
	ErrCodeLost    = "lost"
	ErrCodeNoLease = "no_lease"
	ErrCodeInvalid = "invalid"
	// ErrCodeForbidden refuses an acquire of a partition outside the
	// requester's partition ranges (an operator's configuration,
	// ledgerctl partition-ranges). Retrying does not help.
	ErrCodeForbidden = "forbidden"
	// ErrCodeUnavailable is this implementation's code for "the ledger's
	// database could not be reached": nothing changed, retry. It says
	// nothing about the lease, so it is not one of the contract's outcomes.
	ErrCodeUnavailable = "unavailable"
	// ErrCodeRateLimited and ErrCodeBusy refuse a request of a principal
	// over its share of the service (this implementation's codes): over
	// its request rate, or with too many requests waiting or in service.
	// Nothing was done; retry after a short backoff.
	ErrCodeRateLimited = "rate_limited"
	ErrCodeBusy        = "busy"
)

// LeaseRequest is the body of acquire, renew, release and get. Fields a
// call does not use are ignored. Pointers tell "absent" from zero.
type LeaseRequest struct {
	Partition *int `json:"partition"`
	// Holder is optional: the subject names the holder, and a holder in
	// the body must be the same.
	Holder     string `json:"holder,omitempty"`
	Generation *int64 `json:"generation,omitempty"`
	TTLMillis  *int64 `json:"ttl_ms,omitempty"`
	// RequestID, on an acquire only, makes a retry of the same request
	// return the same grant.
	RequestID string `json:"request_id,omitempty"`
}

// LeaseReply is the success reply of acquire, renew and get.
type LeaseReply struct {
	Partition  int    `json:"partition"`
	Holder     string `json:"holder"`
	Generation int64  `json:"generation"`
	ExpiresAt  string `json:"expires_at"`
	TTLMillis  int64  `json:"ttl_ms"`
	// Valid is set by get only.
	Valid *bool `json:"valid,omitempty"`
	// Partitions is the deployment's partition count N, set by get only
	// (this implementation's addition: a worker need not be configured
	// with it).
	Partitions int `json:"partitions,omitempty"`
}

// ReleaseReply is the success reply of release.
type ReleaseReply struct {
	Partition int  `json:"partition"`
	Released  bool `json:"released"`
}

// ErrorReply is the body of every error reply of the service. Holder,
// Generation and ExpiresAt describe the current lease where it is known.
type ErrorReply struct {
	Error      string `json:"error"`
	Message    string `json:"message"`
	Holder     string `json:"holder,omitempty"`
	Generation int64  `json:"generation,omitempty"`
	ExpiresAt  string `json:"expires_at,omitempty"`
	// Partitions is the deployment's partition count, on replies of get.
	Partitions int `json:"partitions,omitempty"`
	// Revoked, on a lost reply, is the operator's revoke that fenced the
	// requester's generation; Cordoned, on a held reply, the cordon that
	// refuses every grant of the partition (docs/contract.md §12).
	Revoked  *OperatorAction `json:"revoked,omitempty"`
	Cordoned *OperatorAction `json:"cordoned,omitempty"`
}

// OperatorAction is an operator's revoke or cordon as an error reply tells
// it: who (as the operator named themself), why and when (RFC 3339, the
// database's clock).
type OperatorAction struct {
	By     string `json:"by"`
	Reason string `json:"reason"`
	At     string `json:"at"`
}

// TaskHeadRequest is the body of ledger.task.head. EventID is optional
// (this implementation's extension): with it the reply is a
// TaskHeadEventReply, which also tells that event's recorded verdict.
type TaskHeadRequest struct {
	Task    string `json:"task,omitempty"`
	EventID string `json:"event_id,omitempty"`
	// Version, Type and Payload go with EventID (contract v3): the event's
	// content as sent, its Ledger-Version, Ledger-Type and body (a JSON
	// text; "" is null). With them the verdict is committed only when the
	// ledger stored that content under the id. All three or none.
	Version int64   `json:"version,omitempty"`
	Type    string  `json:"type,omitempty"`
	Payload *string `json:"payload,omitempty"`
	// Tasks, instead of Task, asks for the heads of up to 1000 tasks at
	// once (this implementation's addition); the reply is a
	// TaskHeadsReply.
	Tasks []string `json:"tasks,omitempty"`
	// Lookups, instead of Task, asks for the verdicts of up to 1000
	// events at once (this implementation's addition); the reply is a
	// TaskHeadEventsReply.
	Lookups []VerdictLookup `json:"lookups,omitempty"`
}

// VerdictLookup is one verdict lookup of a batch: the members a single
// lookup's TaskHeadRequest carries, with the same rules.
type VerdictLookup struct {
	Task    string  `json:"task"`
	EventID string  `json:"event_id"`
	Version int64   `json:"version,omitempty"`
	Type    string  `json:"type,omitempty"`
	Payload *string `json:"payload,omitempty"`
}

// TaskHeadEventsReply is the reply of ledger.task.head to a request with
// lookups: for each, in the order asked, what the lookup alone answers.
type TaskHeadEventsReply struct {
	Heads []TaskHeadEventReply `json:"heads"`
}

// TaskHeadsReply is the reply of ledger.task.head to a request with tasks:
// one head per task asked for, in that order.
type TaskHeadsReply struct {
	Heads []TaskHeadReply `json:"heads"`
}

// TaskHeadReply is the reply of ledger.task.head. Partition is null and
// Version 0 for a task that has no committed event.
type TaskHeadReply struct {
	Task      string `json:"task"`
	Partition *int   `json:"partition"`
	Version   int64  `json:"version"`
	Seq       int64  `json:"seq"`
	// Type is the type of the task's last committed event (null if the
	// task has none), so that a new holder can tell a finished task from
	// a running one.
	Type *string `json:"type"`
	// Owner is the principal that wrote version 1, which alone may write
	// the task (this implementation's addition; contract §3, not_owner).
	// Null for a task never committed, or one whose owner is not known.
	Owner *string `json:"owner"`
	// Kind is the task's kind, KindEvents or KindSnapshot, pinned by its
	// first committed event (contract §14). Null for a task never
	// committed.
	Kind *string `json:"kind"`
}

// TaskHeadEventReply is the reply of ledger.task.head to a request with
// event_id: the task's head, and the final verdict the ledger recorded for
// that event of the task, or null while it has none (not judged yet, or a
// verdict that records nothing under the id: invalid, or a duplicate of
// identical content committed under another id).
type TaskHeadEventReply struct {
	TaskHeadReply
	Event *EventVerdict `json:"event"`
}

// EventVerdict is a recorded final verdict: committed with the row's Seq,
// or a rejection (stale, conflict, gap) with its Reason and Seq 0.
type EventVerdict struct {
	EventID string  `json:"event_id"`
	Verdict Verdict `json:"verdict"`
	Reason  string  `json:"reason"`
	Seq     int64   `json:"seq"`
}

// BucketLeases is the KV bucket the ingest mirrors every partition's lease
// into (docs/contract.md §10): a read-only, watchable view for downstream
// services. It lags the database and may miss a change: an optimisation,
// never the guarantee.
const BucketLeases = "ledger_leases"

// LeaseViewKey is a partition's key in BucketLeases: its number in decimal.
func LeaseViewKey(partition int) string { return strconv.Itoa(partition) }

// LeaseView is a value of BucketLeases: a partition's lease as the ingest
// last granted, renewed or released it.
type LeaseView struct {
	Partition  int    `json:"partition"`
	Holder     string `json:"holder"`
	Generation int64  `json:"generation"`
	// ExpiresAt is the database's expiry of the last grant or renewal
	// (RFC3339Nano); empty once released.
	ExpiresAt string `json:"expires_at,omitempty"`
	// TTLMillis is the TTL of the last grant or renewal.
	TTLMillis int64 `json:"ttl_ms,omitempty"`
	// Released is true once the holder released this generation.
	Released bool `json:"released"`
}

// Fence is the fence of the lease v shows.
func (v LeaseView) Fence() Fence {
	return Fence{Partition: v.Partition, Holder: v.Holder, Generation: v.Generation}
}
