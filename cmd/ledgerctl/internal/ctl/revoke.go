package ctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// actionRow is an operator action as revoke, cordon and uncordon print it.
type actionRow struct {
	Partition     int    `json:"partition"`
	Action        string `json:"action"`
	Holder        string `json:"holder,omitempty"`
	Generation    int64  `json:"generation,omitempty"`
	NewGeneration int64  `json:"new_generation,omitempty"`
	By            string `json:"by"`
	DBUser        string `json:"db_user,omitempty"`
	Reason        string `json:"reason"`
	At            string `json:"at"`
}

func toActionRow(a fence.Action) actionRow {
	return actionRow{Partition: a.Partition, Action: a.Kind, Holder: a.Holder, Generation: a.Generation,
		NewGeneration: a.NewGeneration, By: a.By, DBUser: a.DBUser, Reason: a.Reason, At: wire.FormatTime(a.At)}
}

// operatorFlags are the flags every operator action takes.
type operatorFlags struct {
	*Flags
	partition *int
	reason    *string
	by        *string
}

func newOperatorFlags(cmd, summary string, stderr io.Writer) *operatorFlags {
	f := NewFlags("ledgerctl "+cmd, "-partition P -reason R [-by NAME]", summary, stderr)
	return &operatorFlags{Flags: f,
		partition: f.Int("partition", -1, "the partition (required)"),
		reason:    f.String("reason", "", "why, recorded with the action (required)"),
		by:        f.String("by", defaultActor(), "who acts, recorded with the action (default: $USER@host)"),
	}
}

func (f *operatorFlags) parse(args []string) error {
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	return f.check()
}

// check checks the flags every action requires.
func (f *operatorFlags) check() error {
	switch {
	case *f.partition < 0:
		return Usagef("-partition is required (>= 0)")
	case strings.TrimSpace(*f.reason) == "":
		return Usagef("-reason is required: the action is recorded with it")
	case strings.TrimSpace(*f.by) == "":
		return Usagef("-by must name who acts")
	}
	return nil
}

// defaultActor is $USER@host, or what of it is known.
func defaultActor() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); name == "" && err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	if host == "" {
		return cmp.Or(name, "unknown")
	}
	return cmp.Or(name, "unknown") + "@" + host
}

// Revoke fences a partition's holder now ("revoke").
func Revoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newOperatorFlags("revoke", "Fence the current holder of a partition now: raise its generation above the holder's\n"+
		"(and above the ingest's witness, bucket ledger_witness) and end the lease, without waiting\n"+
		"for its TTL. The holder's next write is stale/superseded, its next renewal lost. Anyone\n"+
		"may acquire the partition at once unless it is cordoned. Needs PostgreSQL and NATS.", stderr)
	if err := f.parse(args); err != nil {
		return err
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()
	a, err := ingest.Revoke(ctx, js, pool, *f.partition, *f.by, *f.reason)
	if err != nil {
		return schemaHint("revoke", err)
	}
	if f.JSON {
		return writeJSON(stdout, toActionRow(a))
	}
	fmt.Fprintf(stdout, "partition %d: revoked %s at generation %d; the partition is now at generation %d (by %s: %s)\n",
		a.Partition, a.Holder, a.Generation, a.NewGeneration, a.By, a.Reason)
	return nil
}

// Cordon stops every grant of a partition ("cordon").
func Cordon(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return cordon(ctx, true, args, stdout, stderr)
}

// Uncordon lets a cordoned partition be granted again ("uncordon").
func Uncordon(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return cordon(ctx, false, args, stdout, stderr)
}

func cordon(ctx context.Context, on bool, args []string, stdout, stderr io.Writer) error {
	name, summary := "uncordon", "Let a cordoned partition be granted again."
	if on {
		name, summary = "cordon", "Stop granting a partition: every acquire is refused (held, with the cordon) until it is\n"+
			"uncordoned. The current holder keeps its lease and may renew and release it, so it\n"+
			"drains; revoke fences it at once."
	}
	f := newOperatorFlags(name, summary, stderr)
	if err := f.parse(args); err != nil {
		return err
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := fence.Cordon(ctx, pool, *f.partition, on, *f.by, *f.reason)
	if err != nil {
		return schemaHint(name, err)
	}
	if f.JSON {
		return writeJSON(stdout, toActionRow(a))
	}
	fmt.Fprintf(stdout, "partition %d: %sed (by %s: %s)\n", a.Partition, name, a.By, a.Reason)
	return nil
}

// withOperatorActions adds to leases each partition's cordon and the revoke
// that made its generation, and a row for each cordoned partition never
// leased (of partition only, when it is >= 0).
func withOperatorActions(ctx context.Context, pool *pgxpool.Pool, leases []leaseRow, partition int) ([]leaseRow, error) {
	cordons, err := fence.Cordons(ctx, pool)
	if err != nil {
		return nil, err
	}
	revokes, err := fence.Actions(ctx, pool, partition, 1000)
	if err != nil {
		return nil, err
	}
	modes, err := fence.FenceModes(ctx, pool)
	if err != nil {
		return nil, err
	}
	byPartition := map[int]int{}
	for i, l := range leases {
		byPartition[l.Partition] = i
	}
	for _, m := range modes {
		if m.Mode != fence.ModeObserve || (partition >= 0 && m.Partition != partition) {
			continue
		}
		if _, ok := byPartition[m.Partition]; !ok {
			leases = append(leases, leaseRow{Partition: m.Partition})
			byPartition[m.Partition] = len(leases) - 1
		}
		leases[byPartition[m.Partition]].FenceMode = fence.ModeObserve
	}
	for i := range leases {
		if leases[i].FenceMode == "" {
			leases[i].FenceMode = fence.ModeEnforce
		}
	}
	for _, a := range cordons {
		if partition >= 0 && a.Partition != partition {
			continue
		}
		row := toActionRow(a)
		i, ok := byPartition[a.Partition]
		if !ok {
			leases = append(leases, leaseRow{Partition: a.Partition, FenceMode: fence.ModeEnforce})
			i = len(leases) - 1
			byPartition[a.Partition] = i
		}
		leases[i].Cordoned = &row
	}
	for _, a := range revokes { // newest first: the first match is the one
		i, ok := byPartition[a.Partition]
		if !ok || a.Kind != fence.ActionRevoke || a.NewGeneration != leases[i].Generation || leases[i].Revoked != nil {
			continue
		}
		row := toActionRow(a)
		leases[i].Revoked = &row
	}
	slices.SortFunc(leases, func(a, b leaseRow) int { return a.Partition - b.Partition })
	return leases, nil
}

// operatorNote tells a lease's cordon and revoke in a table cell.
func operatorNote(l leaseRow) string {
	var notes []string
	if l.FenceMode == fence.ModeObserve {
		notes = append(notes, "fence observe (would-reject commits)")
	}
	if a := l.Revoked; a != nil {
		notes = append(notes, fmt.Sprintf("revoked %s (generation %d) by %s at %s: %s", a.Holder, a.Generation, a.By, a.At, a.Reason))
	}
	if a := l.Cordoned; a != nil {
		notes = append(notes, fmt.Sprintf("cordoned by %s at %s: %s", a.By, a.At, a.Reason))
	}
	if len(notes) == 0 {
		return "-"
	}
	return strings.Join(notes, "; ")
}

// leaseHistory prints the grants and operator actions, newest first.
func leaseHistory(ctx context.Context, pool *pgxpool.Pool, partition, limit int, asJSON bool, stdout io.Writer) error {
	var only *int
	if partition >= 0 {
		only = &partition
	}
	rows, err := pool.Query(ctx, sqlLeaseHistory, only, limit)
	if err != nil {
		return schemaHint("lease history", err)
	}
	hist, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (actionRow, error) {
		var a actionRow
		var at time.Time
		err := r.Scan(&a.Partition, &a.Action, &a.Holder, &a.Generation, &a.NewGeneration, &a.By, &a.DBUser, &a.Reason, &at)
		a.At = wire.FormatTime(at)
		return a, err
	})
	if err != nil {
		return schemaHint("lease history", err)
	}
	if asJSON {
		return writeJSONLines(stdout, hist)
	}
	t := newTable(stdout, "AT", "PARTITION", "WHAT", "HOLDER", "GENERATION", "BY", "REASON")
	for _, h := range hist {
		gen := fmt.Sprint(h.Generation)
		if h.Action == fence.ActionRevoke {
			gen = fmt.Sprintf("%d -> %d", h.Generation, h.NewGeneration)
		}
		t.row(h.At, h.Partition, h.Action, cmp.Or(h.Holder, "-"), gen, cmp.Or(h.By, "-"), cmp.Or(h.Reason, "-"))
	}
	return t.flush()
}

// sqlLeaseHistory merges ledger.lease_grants and ledger.lease_actions, of
// partition $1 (null: all), newest first, at most $2.
const sqlLeaseHistory = `
SELECT partition, action, holder, generation, new_generation, by_name, db_user, reason, at FROM (
    SELECT partition, 'grant' AS action, holder, generation, 0::bigint AS new_generation,
           '' AS by_name, '' AS db_user, '' AS reason, granted_at AS at
    FROM ledger.lease_grants WHERE $1::int IS NULL OR partition = $1
    UNION ALL
    SELECT partition, action, coalesce(holder, ''), coalesce(generation, 0), coalesce(new_generation, 0),
           by_name, db_user, reason, at
    FROM ledger.lease_actions WHERE $1::int IS NULL OR partition = $1
) h ORDER BY at DESC, partition LIMIT $2`
