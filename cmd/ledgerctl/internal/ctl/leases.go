package ctl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowness/ledger/pkg/wire"
)

// leaseRow is one lease as leases prints it.
type leaseRow struct {
	Partition  int    `json:"partition"`
	Holder     string `json:"holder"`
	Generation int64  `json:"generation"`
	Valid      bool   `json:"valid"`
	// TimeLeftMS is expires_at minus the database's clock; negative once
	// the lease has expired.
	TimeLeftMS int64  `json:"time_left_ms"`
	TTLMS      int64  `json:"ttl_ms"`
	ExpiresAt  string `json:"expires_at"`
	// Cordoned is the partition's cordon, Revoked the revoke that raised
	// it to its generation (nobody was granted it since); nil if none.
	Cordoned *actionRow `json:"cordoned,omitempty"`
	Revoked  *actionRow `json:"revoked,omitempty"`
	// FenceMode is the partition's effective fence mode (contract §13).
	FenceMode string `json:"fence_mode"`
}

// Leases lists the leases of every partition ever leased ("leases").
func Leases(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl leases", "[-partition N]",
		"List the partitions' leases from the database: holder, generation, whether the lease is\nvalid, and the time left by the database's clock (the one that decides expiry).", stderr)
	partition := f.Int("partition", -1, "show only this partition (-1: all)")
	history := f.Bool("history", false, "list the grants and the operators' actions (revoke, cordon, uncordon), newest first")
	limit := f.Int("n", 50, "with -history: at most this many entries")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	if *partition < -1 {
		return Usagef("-partition must be >= 0, got %d", *partition)
	}
	var only *int
	if *partition >= 0 {
		only = partition
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *history {
		return leaseHistory(ctx, pool, *partition, *limit, f.JSON, stdout)
	}

	rows, err := pool.Query(ctx, sqlLeases, only)
	if err != nil {
		return schemaHint("list leases", err)
	}
	leases, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (leaseRow, error) {
		var l leaseRow
		var expires time.Time
		err := r.Scan(&l.Partition, &l.Holder, &l.Generation, &expires, &l.TTLMS, &l.Valid, &l.TimeLeftMS)
		l.ExpiresAt = wire.FormatTime(expires)
		return l, err
	})
	if err != nil {
		return schemaHint("list leases", err)
	}
	leases, err = withOperatorActions(ctx, pool, leases, *partition)
	if err != nil {
		return schemaHint("list operator actions", err)
	}

	if f.JSON {
		for _, l := range leases {
			if err := writeJSON(stdout, l); err != nil {
				return err
			}
		}
		return nil
	}
	if len(leases) == 0 {
		if only != nil {
			fmt.Fprintf(stdout, "partition %d was never leased\n", *only)
		} else {
			fmt.Fprintln(stdout, "no partition was ever leased")
		}
		return nil
	}
	t := newTable(stdout, "PARTITION", "HOLDER", "GENERATION", "VALID", "TIME LEFT", "TTL", "EXPIRES AT", "OPERATOR")
	for _, l := range leases {
		if l.Generation == 0 { // cordoned, never leased
			t.row(l.Partition, "-", "-", false, "-", "-", "-", operatorNote(l))
			continue
		}
		t.row(l.Partition, l.Holder, l.Generation, l.Valid, timeLeft(l.TimeLeftMS),
			time.Duration(l.TTLMS)*time.Millisecond, l.ExpiresAt, operatorNote(l))
	}
	return t.flush()
}

// timeLeft shows a lease's remaining time, or how long ago it expired.
func timeLeft(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	if d > 0 {
		return d.String()
	}
	d = -d
	if d >= time.Minute {
		d = d.Round(time.Second)
	}
	return "expired " + d.String() + " ago"
}
