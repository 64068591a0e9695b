package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Outcomes of the lease service (docs/contract.md §1). A *ServiceError carries one
// of them and matches it with errors.Is.
var (
	// ErrHeld: acquire found a valid lease of another holder.
	ErrHeld = errors.New("worker: partition is held by another holder")
	// ErrLost: renew or release found the lease expired, or of another
	// holder or generation.
	ErrLost = errors.New("worker: lease service: lease no longer held")
	// ErrNoLease: the partition was never leased.
	ErrNoLease = errors.New("worker: partition was never leased")
	// ErrInvalid: the request is malformed, as the service said (for
	// example a partition outside [0, N)) or as the client found before
	// sending it (a bad task id, event type or payload).
	ErrInvalid = errors.New("worker: invalid request")
	// ErrUnavailable: the service could not be reached (no responder,
	// timeout) or its database was down. Retrying may succeed.
	ErrUnavailable = errors.New("worker: lease service unavailable")
	// ErrBusy: the service refused the request because this principal is
	// over its share of it (reply rate_limited or busy); nothing was done.
	// It matches ErrUnavailable too, so every retry of the SDK backs off
	// and tries again.
	ErrBusy = fmt.Errorf("worker: lease service busy with this principal's requests: %w", ErrUnavailable)
)

// Errors of the SDK itself.
var (
	// ErrLeaseLost is the cause of a lease's Context when the lease ended
	// without Release: a renewal was refused, a renewal was not confirmed
	// before the local deadline, or an event came back stale. Publish on
	// such a lease returns an error matching it. The wrapped error says why.
	ErrLeaseLost = errors.New("worker: lease lost")
	// ErrReleased is the cause of a lease's Context after Release, and
	// Publish's error on a lease being released.
	ErrReleased = errors.New("worker: lease released")
	// ErrClosed is the cause of every lease's Context after Client.Close,
	// and the error of calls on a closed client.
	ErrClosed = errors.New("worker: client closed")
	// ErrLeaseActive: Acquire of a partition this client already holds.
	// Acquiring it again would fence the client's own lease.
	ErrLeaseActive = errors.New("worker: this client already holds the partition")
	// ErrWrongPartition: the task is pinned to another partition by its
	// first committed event; nothing was published.
	ErrWrongPartition = errors.New("worker: task is pinned to another partition")
	// ErrResyncNeeded: an earlier event of the task was refused (invalid,
	// conflict or gap), so versions assigned after it cannot commit. Call
	// Lease.ResyncTask to learn the head again.
	ErrResyncNeeded = errors.New("worker: task needs a resync after a refused event")
	// ErrRejected: an event's receipt is not a success (anything but
	// committed and duplicate). Pending.Wait returns a *RejectedError.
	ErrRejected = errors.New("worker: event rejected")
)

// ServiceError is an error reply of the lease service. It matches one of
// ErrHeld, ErrLost, ErrNoLease, ErrInvalid, ErrBusy or ErrUnavailable with errors.Is,
// and carries the current lease where the service knew it.
type ServiceError struct {
	// Code is the reply's "error": held, lost, no_lease, invalid,
	// unavailable, busy or rate_limited.
	Code    string
	Message string
	// Holder, Generation and ExpiresAt describe the current lease; zero
	// when the service did not say.
	Holder     string
	Generation int64
	ExpiresAt  time.Time
	// Partitions is the deployment's partition count, told by a get's
	// no_lease reply; 0 otherwise.
	Partitions int
	// Revoked is set on a lost reply when an operator revoked the lease
	// (ledgerctl revoke): who, why and when. A lease ended by it has a
	// cause that matches ErrLeaseLost and wraps this error.
	Revoked *wire.OperatorAction
	// Cordoned is set on a held reply when an operator cordoned the
	// partition (ledgerctl cordon): nobody is granted it until uncordoned.
	Cordoned *wire.OperatorAction
}

func newServiceError(r wire.ErrorReply) *ServiceError {
	e := &ServiceError{Code: r.Error, Message: r.Message, Holder: r.Holder, Generation: r.Generation,
		Partitions: r.Partitions, Revoked: r.Revoked, Cordoned: r.Cordoned}
	if r.ExpiresAt != "" {
		e.ExpiresAt, _ = time.Parse(time.RFC3339Nano, r.ExpiresAt)
	}
	return e
}

// Error describes the reply: its code and the service's message.
func (e *ServiceError) Error() string {
	return fmt.Sprintf("worker: lease service: %s: %s", e.Code, e.Message)
}

// Unwrap returns the sentinel of e's code. An unknown code counts as
// ErrInvalid: the request was not served and the reply says nothing about
// the lease.
func (e *ServiceError) Unwrap() error {
	switch e.Code {
	case wire.ErrCodeHeld:
		return ErrHeld
	case wire.ErrCodeLost:
		return ErrLost
	case wire.ErrCodeNoLease:
		return ErrNoLease
	case wire.ErrCodeUnavailable:
		return ErrUnavailable
	case wire.ErrCodeBusy, wire.ErrCodeRateLimited:
		return ErrBusy
	}
	return ErrInvalid
}

// RejectedError is Pending.Wait's error for an event whose verdict is not a
// success. It matches ErrRejected.
type RejectedError struct {
	Receipt wire.Receipt
}

// Error names the event, its task and version, and the verdict.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("worker: event %s (task %s, version %d) rejected: %s/%s",
		e.Receipt.EventID, e.Receipt.Task, e.Receipt.Version, e.Receipt.Verdict, e.Receipt.Reason)
}

// Unwrap returns ErrRejected.
func (e *RejectedError) Unwrap() error { return ErrRejected }
