package ctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// FenceMode switches a partition's fence mode ("fence-mode").
func FenceMode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newOperatorFlags("fence-mode", "Switch a partition's fence mode, recorded with who and why (contract §13):\n"+
		"  enforce  (the default) a write the fence refuses is stale, dead-lettered and not committed;\n"+
		"  observe  it commits anyway, and its receipt, row and log copy say would_reject: stale/<reason>.\n"+
		"With no mode, list the partitions whose mode was ever set.", stderr)
	f.SetSynopsis("[-partition P -reason R [-by NAME] enforce|observe]")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() == 0 && *f.partition < 0 {
		return listFenceModes(ctx, f, stdout)
	}
	if f.NArg() != 1 || (f.Arg(0) != fence.ModeEnforce && f.Arg(0) != fence.ModeObserve) {
		return Usagef("give one mode: %s or %s", fence.ModeEnforce, fence.ModeObserve)
	}
	mode := f.Arg(0)
	if err := f.check(); err != nil {
		return err
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := fence.SetFenceMode(ctx, pool, *f.partition, mode, *f.by, *f.reason)
	if err != nil {
		return schemaHint("fence-mode", err)
	}
	if f.JSON {
		return writeJSON(stdout, toActionRow(a))
	}
	fmt.Fprintf(stdout, "partition %d: fence mode %s (by %s: %s)\n", a.Partition, mode, a.By, a.Reason)
	return nil
}

func listFenceModes(ctx context.Context, f *operatorFlags, stdout io.Writer) error {
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	modes, err := fence.FenceModes(ctx, pool)
	if err != nil {
		return schemaHint("fence modes", err)
	}
	type row struct {
		Partition int    `json:"partition"`
		Mode      string `json:"mode"`
		By        string `json:"by"`
		DBUser    string `json:"db_user"`
		At        string `json:"at"`
	}
	if f.JSON {
		for _, m := range modes {
			if err := writeJSON(stdout, row{m.Partition, m.Mode, m.By, m.DBUser, wire.FormatTime(m.At)}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(modes) == 0 {
		fmt.Fprintln(stdout, "every partition enforces the fence (no mode was ever set)")
		return nil
	}
	t := newTable(stdout, "PARTITION", "MODE", "BY", "DB USER", "SINCE")
	for _, m := range modes {
		t.row(m.Partition, m.Mode, m.By, m.DBUser, wire.FormatTime(m.At))
	}
	return t.flush()
}

// WouldRejectReport answers "what would enforce have refused on these
// partitions since T" ("would-reject").
func WouldRejectReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl would-reject", "-since T [-partitions 1,2,3]",
		"Count the events committed under the observe fence mode that enforce would have refused,\n"+
			"by partition and reason. Turn enforce on when this has stayed 0 for long enough.", stderr)
	sinceFlag := f.String("since", "", "from this time on: RFC 3339, or a duration back from now like 24h (required)")
	parts := f.String("partitions", "", "comma-separated partitions (default: all)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	since, err := parseSince(*sinceFlag, time.Now())
	if err != nil {
		return err
	}
	var only []int32
	for p := range strings.SplitSeq(*parts, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 {
			return Usagef("-partitions: %q is not a partition", p)
		}
		only = append(only, int32(n))
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	counts, err := fence.WouldReject(ctx, pool, only, since)
	if err != nil {
		return schemaHint("would-reject", err)
	}
	type row struct {
		Partition   int    `json:"partition"`
		WouldReject string `json:"would_reject"`
		Count       int64  `json:"count"`
		Last        string `json:"last_committed_at"`
	}
	if f.JSON {
		for _, c := range counts {
			if err := writeJSON(stdout, row{c.Partition, c.WouldReject, c.Count, wire.FormatTime(c.Last)}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(counts) == 0 {
		fmt.Fprintf(stdout, "nothing enforce would have refused was committed since %s\n", wire.FormatTime(since))
		return nil
	}
	t := newTable(stdout, "PARTITION", "WOULD REJECT", "COUNT", "LAST")
	for _, c := range counts {
		t.row(c.Partition, c.WouldReject, c.Count, wire.FormatTime(c.Last))
	}
	return t.flush()
}

// parseSince reads -since: an RFC 3339 time, or a duration back from now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, Usagef("-since is required: an RFC 3339 time or a duration like 24h")
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, Usagef("-since: %q is neither an RFC 3339 time nor a duration", s)
	}
	return t, nil
}
