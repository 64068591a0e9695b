package fence

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flowness/ledger/pkg/wire"
)

// Sentinel errors of the lease calls, usable with errors.Is. The error a call
// returns is a *LeaseError that matches one of them and carries the current
// lease where it is known.
var (
	// ErrHeld: the lease is valid and held by another holder.
	ErrHeld = errors.New("lease held by another holder")
	// ErrLost: the caller is not the current holder and generation of an
	// unexpired lease (renew, release).
	ErrLost = errors.New("lease lost")
	// ErrNoLease: the partition was never leased.
	ErrNoLease = errors.New("no lease")
	// ErrInvalid: the request itself is malformed (partition out of range,
	// bad holder id, TTL out of bounds).
	ErrInvalid = errors.New("invalid lease request")
	// ErrForbidden: the partition is outside the holder's principal's
	// partition ranges (ledgerctl partition-ranges); no grant is made.
	ErrForbidden = errors.New("partition outside the principal's ranges")
	// ErrObservationStale: TakeOver's observed generation is no longer the
	// current one, though the lease is not validly held by another; the
	// caller must observe again.
	ErrObservationStale = errors.New("observed generation is no longer current")
)

// ErrNoAnswer: an append attempt got no answer from the database within
// Config.AttemptTimeout (a silent connection). Transient: nothing of the
// attempt is known to have committed unless a retry finds it so.
var ErrNoAnswer = errors.New("fence: the database did not answer")

// LeaseError is the error of a lease call.
type LeaseError struct {
	// Kind is one of the sentinels above.
	Kind error
	// Msg says what happened, for people.
	Msg string
	// Current is the lease as the database showed it, or nil if unknown.
	Current *Lease
	// Revoked is the operator's revoke that fenced the caller's generation
	// (ErrLost), and Cordon the cordon that refused a grant (ErrHeld);
	// nil otherwise (operator.go).
	Revoked, Cordon *Action
}

func (e *LeaseError) Error() string { return e.Kind.Error() + ": " + e.Msg }

// Is makes errors.Is(err, ErrHeld) and friends work.
func (e *LeaseError) Is(target error) bool { return target == e.Kind }

// Code is the wire error code of the error: held, lost, no_lease, forbidden
// or invalid.
func (e *LeaseError) Code() string {
	switch e.Kind {
	case ErrHeld:
		return wire.ErrCodeHeld
	case ErrLost:
		return wire.ErrCodeLost
	case ErrNoLease:
		return wire.ErrCodeNoLease
	case ErrObservationStale:
		return wire.ErrCodeHeld
	case ErrForbidden:
		return wire.ErrCodeForbidden
	}
	return wire.ErrCodeInvalid
}

func leaseErr(kind error, cur *Lease, format string, args ...any) error {
	return &LeaseError{Kind: kind, Msg: fmt.Sprintf(format, args...), Current: cur}
}

// IsTransient reports whether err is a failure that may succeed if retried
// unchanged: the connection was lost, refused or found closed when used,
// the server is shutting down or out of resources, or the transaction lost
// a serialisation or deadlock race, or an append attempt got no answer in
// time (ErrNoAnswer). Context cancellation is not transient: the caller
// gave up.
func IsTransient(err error) bool {
	if errors.Is(err, ErrNoAnswer) || errors.Is(err, ErrUnwitnessedTimeline) {
		return true
	}
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		c := pgErr.Code
		return pgerrcode.IsConnectionException(c) || // class 08
			pgerrcode.IsTransactionRollback(c) || // 40: serialization_failure, deadlock_detected
			pgerrcode.IsInsufficientResources(c) || // 53
			pgerrcode.IsOperatorIntervention(c) || // 57: admin_shutdown, query_canceled (statement_timeout), ...
			c == pgerrcode.LockNotAvailable || c == pgerrcode.ObjectInUse
	}
	var netErr net.Error
	var connErr *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.As(err, &connErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.Timeout(err) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, pgconn.ErrConnClosed)
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
