package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/flowness/ledger/migrations"
)

// Migrate applies the embedded migrations ("migrate"), or with -check only
// reports whether the schema is current (exit 1 if it is not).
func Migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl migrate", "[-check]",
		"Apply the ledger's database migrations. Safe to repeat, and safe while services start:\nconcurrent migrators wait for each other.", stderr)
	check := f.Bool("check", false, "only report whether the schema is current; exit 1 if it is not")
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
	total, err := migrations.Count()
	if err != nil {
		return err
	}

	if *check {
		err := migrations.Check(ctx, pool)
		current := err == nil
		if err != nil && !errors.Is(err, migrations.ErrPending) {
			return err
		}
		if f.JSON {
			if werr := writeJSON(stdout, map[string]any{"current": current, "migrations": total}); werr != nil {
				return werr
			}
		} else if current {
			fmt.Fprintf(stdout, "schema current (%d migrations)\n", total)
		}
		return err
	}

	applied, err := migrations.Up(ctx, pool, nil)
	if err != nil {
		return err
	}
	if f.JSON {
		return writeJSON(stdout, map[string]any{"applied": applied, "migrations": total})
	}
	if len(applied) == 0 {
		fmt.Fprintf(stdout, "schema already current (%d migrations)\n", total)
		return nil
	}
	fmt.Fprintf(stdout, "applied migrations %v; schema current (%d migrations)\n", applied, total)
	return nil
}
