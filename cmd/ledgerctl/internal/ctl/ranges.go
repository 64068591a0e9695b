package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// PartitionRanges sets or lists which partitions each principal may lease
// ("partition-ranges").
func PartitionRanges(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl partition-ranges", "[-principal NAME -ranges 0-15,32 | -clear -reason R [-by NAME]]",
		"Say which partitions a principal may lease (contract §1, forbidden). A principal with ranges\n"+
			"is granted only partitions within them, and a partition within any range only to a principal\n"+
			"whose range holds it; everything else stays open to everyone. The database refuses every\n"+
			"other grant, for every ingest. Leases granted before run until they end. With no -principal,\n"+
			"list the ranges.", stderr)
	principal := f.String("principal", "", "the principal whose ranges are replaced")
	ranges := f.String("ranges", "", "its partitions: comma-separated p or lo-hi, both included")
	clear := f.Bool("clear", false, "remove the principal's ranges")
	reason := f.String("reason", "", "why, recorded with the ranges (required to set them)")
	by := f.String("by", defaultActor(), "who acts, recorded with the ranges (default: $USER@host)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	if *principal == "" {
		if *ranges != "" || *clear {
			return Usagef("-ranges and -clear need -principal")
		}
		return listPartitionRanges(ctx, f, stdout)
	}
	rs, err := fence.ParseRanges(*ranges)
	switch {
	case !wire.ValidID(*principal):
		return Usagef("-principal %q is not 1..64 of [A-Za-z0-9_-]", *principal)
	case err != nil:
		return Usagef("-ranges: %v", err)
	case *clear == (len(rs) > 0):
		return Usagef("give either -ranges or -clear")
	case strings.TrimSpace(*reason) == "":
		return Usagef("-reason is required: the ranges are recorded with it")
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := fence.SetPartitionRanges(ctx, pool, *principal, rs, *by, *reason); err != nil {
		return schemaHint("partition-ranges", err)
	}
	if *clear {
		fmt.Fprintf(stdout, "principal %s: no partition ranges (by %s: %s)\n", *principal, *by, *reason)
		return nil
	}
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.String()
	}
	fmt.Fprintf(stdout, "principal %s: partitions %s (by %s: %s)\n", *principal, strings.Join(names, ","), *by, *reason)
	return nil
}

func listPartitionRanges(ctx context.Context, f *Flags, stdout io.Writer) error {
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rs, err := fence.PartitionRanges(ctx, pool)
	if err != nil {
		return schemaHint("partition ranges", err)
	}
	type row struct {
		Principal string `json:"principal"`
		Lo        int    `json:"lo"`
		Hi        int    `json:"hi"`
		By        string `json:"by"`
		DBUser    string `json:"db_user"`
		Reason    string `json:"reason"`
		At        string `json:"at"`
	}
	if f.JSON {
		for _, r := range rs {
			if err := writeJSON(stdout, row{r.Principal, r.Range.Lo, r.Range.Hi, r.By, r.DBUser, r.Reason, wire.FormatTime(r.At)}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(rs) == 0 {
		fmt.Fprintln(stdout, "no partition ranges: every principal may lease every partition")
		return nil
	}
	t := newTable(stdout, "PRINCIPAL", "PARTITIONS", "BY", "DB USER", "REASON", "SINCE")
	for _, r := range rs {
		t.row(r.Principal, r.Range.String(), r.By, r.DBUser, r.Reason, wire.FormatTime(r.At))
	}
	return t.flush()
}
