package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// restoreScanMax bounds how far back from its end LEDGER_LOG is read for
// copies the database lacks.
const restoreScanMax = 1 << 20

// restoreRow is one copy in the output of restore.
type restoreRow struct {
	Seq     int64  `json:"seq"`
	EventID string `json:"event_id"`
	Task    string `json:"task"`
	Version int64  `json:"version"`
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
}

// Restore writes back from LEDGER_LOG the acknowledged commits the
// database forgot ("restore").
func Restore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl restore", "[-dry-run]",
		"Write back, from their LEDGER_LOG copies, acknowledged commits the database forgot (a failover\n"+
			"to a lagging standby, a restore from an older backup), with their original seq, version,\n"+
			"generation, holder and payload. The ingest commits nothing on such a database and names\n"+
			"the missing events in its log; after this it commits again. Run it as the schema's owner.", stderr)
	dry := f.Bool("dry-run", false, "list what would be restored; change nothing")
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
	store, err := fence.New(pool, fence.Config{})
	if err != nil {
		return err
	}
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()
	var newest int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM ledger.events`).Scan(&newest); err != nil {
		return schemaHint("read the newest seq", err)
	}
	copies, err := copiesAfter(ctx, js, wire.Subjects{Prefix: f.Prefix}, newest)
	if err != nil {
		return err
	}
	if copies, err = lacking(ctx, pool, copies); err != nil {
		return err
	}
	var rows []restoreRow
	if *dry {
		for _, c := range copies {
			rows = append(rows, restoreRow{Seq: c.Seq, EventID: c.EventID, Task: c.Task, Version: c.Version, Outcome: "to restore"})
		}
	} else {
		done, err := store.RestoreCommits(ctx, copies)
		if err != nil {
			return err
		}
		for _, r := range done {
			c := r.Copy
			rows = append(rows, restoreRow{Seq: c.Seq, EventID: c.EventID, Task: c.Task, Version: c.Version, Outcome: r.Outcome, Reason: r.Reason})
		}
	}
	if f.JSON {
		for _, r := range rows {
			if err := writeJSON(stdout, r); err != nil {
				return err
			}
		}
		return nil
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "the database holds every commit LEDGER_LOG has (newest seq %d)\n", newest)
		return nil
	}
	t := newTable(stdout, "SEQ", "EVENT", "TASK", "VERSION", "OUTCOME", "REASON")
	for _, r := range rows {
		t.row(r.Seq, r.EventID, r.Task, r.Version, r.Outcome, r.Reason)
	}
	return t.flush()
}

// sqlLacking keeps, of the copies' event ids and seqs, those the database
// holds neither in its hot log nor below its archive horizon.
const sqlLacking = `
SELECT c.id FROM unnest($1::text[], $2::bigint[]) AS c(id, seq)
WHERE NOT EXISTS (SELECT 1 FROM ledger.event_ids e WHERE e.event_id = c.id)
  AND c.seq >= coalesce((SELECT below_seq FROM ledger.horizon), 0)`

// lacking keeps the copies whose commit the database does not hold.
func lacking(ctx context.Context, pool *pgxpool.Pool, copies []wire.LogCopy) ([]wire.LogCopy, error) {
	ids, seqs := make([]string, len(copies)), make([]int64, len(copies))
	for i, c := range copies {
		ids[i], seqs[i] = c.EventID, c.Seq
	}
	rows, err := pool.Query(ctx, sqlLacking, ids, seqs)
	if err != nil {
		return nil, schemaHint("look up the copies' events", err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, schemaHint("look up the copies' events", err)
	}
	keep := make(map[string]bool, len(missing))
	for _, id := range missing {
		keep[id] = true
	}
	return slices.DeleteFunc(copies, func(c wire.LogCopy) bool { return !keep[c.EventID] }), nil
}

// copiesAfter reads LEDGER_LOG back from its end and returns the copies it
// passed until a long run of copies at or below seq newest. Copies are
// stored in commit order per task, nearly so across tasks; and seqs are
// drawn before their commits, so a database that lost the end of its WAL
// may lack commits below its newest seq too: those copies are returned
// as well, for lacking to sort out.
func copiesAfter(ctx context.Context, js jetstream.JetStream, subj wire.Subjects, newest int64) ([]wire.LogCopy, error) {
	s, err := stream(ctx, js, wire.StreamLog)
	if err != nil {
		return nil, err
	}
	last := s.CachedInfo().State.LastSeq
	var out []wire.LogCopy
	older := 0
	for seq := last; seq > 0 && last-seq < restoreScanMax && older < 10000; seq-- {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read LEDGER_LOG message %d: %w", seq, err)
		}
		copies, err := subj.DecodeLogCopies(m.Subject, m.Header, m.Data)
		if err != nil {
			return nil, fmt.Errorf("LEDGER_LOG message %d: %w", seq, err)
		}
		for _, c := range slices.Backward(copies) { // a log batch's, newest first as the scan goes
			if c.Seq <= newest {
				older++
			} else {
				older = 0
			}
			out = append(out, c)
		}
	}
	return out, nil
}
