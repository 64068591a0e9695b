package ctl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
)

// claimRow is one partition's ingest claim as claims prints it.
type claimRow struct {
	Partition int    `json:"partition"`
	Owner     string `json:"owner"`
	Epoch     int64  `json:"epoch"`
	Valid     bool   `json:"valid"`
	// TimeLeftMS is expires_at minus the database's clock.
	TimeLeftMS int64  `json:"time_left_ms"`
	ClaimedAt  string `json:"claimed_at"`
}

// Claims lists which ingest decides each partition ("claims").
func Claims(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl claims", "",
		"List which ingest process decides each partition's events: its owner id, the claim's epoch\n(raised by every takeover), and the time left before another ingest may take it over.", stderr)
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, sqlClaims)
	if err != nil {
		return schemaHint("list claims", err)
	}
	claims, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimRow, error) {
		var c claimRow
		var at time.Time
		err := r.Scan(&c.Partition, &c.Owner, &c.Epoch, &c.Valid, &c.TimeLeftMS, &at)
		c.ClaimedAt = at.UTC().Format(time.RFC3339Nano)
		return c, err
	})
	if err != nil {
		return schemaHint("list claims", err)
	}
	if f.JSON {
		for _, c := range claims {
			if err := writeJSON(stdout, c); err != nil {
				return err
			}
		}
		return nil
	}
	if len(claims) == 0 {
		fmt.Fprintln(stdout, "no ingest has claimed a partition yet")
		return nil
	}
	t := newTable(stdout, "PARTITION", "INGEST", "EPOCH", "VALID", "TIME LEFT", "CLAIMED AT")
	for _, c := range claims {
		t.row(c.Partition, c.Owner, c.Epoch, c.Valid, timeLeft(c.TimeLeftMS), c.ClaimedAt)
	}
	return t.flush()
}
