package ctl

import (
	"context"
	"io"

	"github.com/flowness/ledger/internal/demo"
)

// Demo runs the ledger in-process and plays the two seed stories ("demo").
// It uses -database-url / DATABASE_URL when that answers, else a throwaway
// PostgreSQL cluster.
func Demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl demo", "",
		"Start NATS in-process, PostgreSQL from DATABASE_URL (or a throwaway cluster when none\nanswers), the ingest and the projector; play the seed stories; print what the ledger did.", stderr)
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	_, err := demo.Run(ctx, demo.Options{DatabaseURL: f.Conn.DatabaseURL, Out: stdout})
	return err
}
