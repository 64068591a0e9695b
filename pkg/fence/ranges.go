package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/pkg/wire"
)

// Partition ranges (docs/contract.md §1, forbidden): an operator may say
// which partitions a principal leases. PostgreSQL keeps them (migration
// 00017, ledger.partition_ranges) and refuses, with SQLSTATE LFP01, every
// grant outside them, whoever grants: the same rule for every ingest, and
// across restarts. With no range configured anyone may lease anything.
//
//   - A principal with ranges is granted only partitions within them.
//   - A partition within any range is granted only to a principal whose
//     range holds it.

// sqlStateOutOfRange is raised by ledger.partition_range_check.
const sqlStateOutOfRange = "LFP01"

// Range is partitions Lo to Hi, both included.
type Range struct{ Lo, Hi int }

// String is "lo-hi", or "p" for one partition.
func (r Range) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(r.Lo)
	}
	return strconv.Itoa(r.Lo) + "-" + strconv.Itoa(r.Hi)
}

// ParseRanges reads "0-15,32,40-47" (empty: no ranges).
func ParseRanges(s string) ([]Range, error) {
	var out []Range
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		if !isRange {
			hi = lo
		}
		a, errA := strconv.Atoi(lo)
		b, errB := strconv.Atoi(hi)
		if errA != nil || errB != nil || a < 0 || b < a {
			return nil, fmt.Errorf("fence: partition range %q is not p or lo-hi with 0 <= lo <= hi", part)
		}
		out = append(out, Range{a, b})
	}
	return out, nil
}

// PrincipalRange is a range of a principal, as an operator set it.
type PrincipalRange struct {
	Principal  string
	Range      Range
	By, DBUser string
	Reason     string
	At         time.Time
}

const (
	sqlRangeRefusal = `SELECT coalesce(ledger.partition_range_refusal($1, $2), '')`
	sqlSetRanges    = `SELECT ledger.set_partition_ranges($1, $2, $3, $4)`
	sqlRanges       = `
SELECT principal, lo, hi, changed_by, db_user, reason, changed_at FROM ledger.partition_ranges ORDER BY principal, lo`
)

// SetPartitionRanges replaces principal's ranges (none: the principal may
// lease any partition no other principal's range holds). Leases granted
// before keep running until they end. Only the schema's owner and
// ledger_operator may.
func SetPartitionRanges(ctx context.Context, pool *pgxpool.Pool, principal string, ranges []Range, by, reason string) error {
	if !wire.ValidID(principal) {
		return fmt.Errorf("fence: principal %q is not 1..64 of [A-Za-z0-9_-]", principal)
	}
	flat := make([]int32, 0, 2*len(ranges))
	for _, r := range ranges {
		if r.Lo < 0 || r.Hi < r.Lo {
			return fmt.Errorf("fence: partition range %d-%d is not 0 <= lo <= hi", r.Lo, r.Hi)
		}
		flat = append(flat, int32(r.Lo), int32(r.Hi))
	}
	if _, err := pool.Exec(ctx, sqlSetRanges, principal, flat, by, reason); err != nil {
		return fmt.Errorf("fence: set the partition ranges of %s: %w", principal, err)
	}
	return nil
}

// PartitionRanges lists every principal's ranges.
func PartitionRanges(ctx context.Context, pool *pgxpool.Pool) ([]PrincipalRange, error) {
	rows, err := pool.Query(ctx, sqlRanges)
	if err != nil {
		return nil, fmt.Errorf("fence: read the partition ranges: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (PrincipalRange, error) {
		var r PrincipalRange
		err := row.Scan(&r.Principal, &r.Range.Lo, &r.Range.Hi, &r.By, &r.DBUser, &r.Reason, &r.At)
		return r, err
	})
}

// outOfRange is the ErrForbidden of a grant ledger.partition_range_check
// refused, with the database's message (it names the partition, the
// principal and its ranges).
func outOfRange(err error) error {
	msg := "the partition is outside the principal's partition ranges"
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg = strings.TrimPrefix(pgErr.Message, "ledger partition ranges: ")
	}
	return &LeaseError{Kind: ErrForbidden, Msg: msg}
}

// rangeRefusal says why partition is not holder's to lease, or "" where it
// is (or the database could not say: the grant's own check decides then).
func (s *Store) rangeRefusal(ctx context.Context, partition int, holder string) string {
	var why string
	if err := s.pool.QueryRow(ctx, sqlRangeRefusal, partition, holder).Scan(&why); err != nil {
		return ""
	}
	return why
}
