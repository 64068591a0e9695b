package ctl

import (
	"context"
	"io"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/demo"
)

// Demo runs the ledger in-process and plays the two seed stories ("demo").
// It uses -database-url / DATABASE_URL when that answers, else a throwaway
// PostgreSQL cluster.
func Demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl demo", "",
		"Start NATS in-process, PostgreSQL from DATABASE_URL (or a throwaway cluster when none\nanswers), the ingest and the projector; play the seed stories; print what the ledger did.\n"+
			"With -external, play them against a ledger that already runs (DATABASE_URL, NATS_URL).", stderr)
	external := f.Bool("external", false, "use the running ledger at DATABASE_URL and NATS_URL instead of starting one")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	o := demo.Options{DatabaseURL: f.Conn.DatabaseURL, Out: stdout, External: *external}
	if *external {
		if f.Conn.DatabaseURL == "" {
			return Usagef("-external needs DATABASE_URL (or -database-url)")
		}
		o.NATS = func(opts ...nats.Option) (*nats.Conn, error) {
			return f.NATS(append([]nats.Option{nats.MaxReconnects(-1)}, opts...)...)
		}
	}
	_, err := demo.Run(ctx, o)
	return err
}
