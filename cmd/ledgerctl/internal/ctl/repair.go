package ctl

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/flowness/ledger/internal/projector"
)

// repairRow is one thing repair did, or left to the operator.
type repairRow struct {
	finding
	Outcome string `json:"outcome"`
	// Action is what the operator does, for what repair leaves alone.
	Action string `json:"action,omitempty"`
}

// Repair puts back from PostgreSQL what verify finds ("repair").
func Repair(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, opts := verifyFlags("ledgerctl repair",
		"Put back from PostgreSQL what 'ledgerctl verify' finds:\n"+
			"  log         re-publishes each task's missing LEDGER_LOG copies, in version order\n"+
			"  projection  folds the task again from PostgreSQL and writes its value (compare-and-set)\n"+
			"  consumer    changes nothing: says what to do (a consumer in use is not safe to remake)\n"+
			"Then verifies again, and exits 1 if anything is still found.", stderr)
	d, done, found, err := startVerify(ctx, f, opts, args)
	if err != nil {
		return err
	}
	defer done()
	rows, err := d.repair(ctx, f, found)
	if err != nil {
		return err
	}
	if err := printRepairs(stdout, f.JSON, rows); err != nil {
		return err
	}
	left, err := d.verify(ctx, *opts)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("%d still found after repair (run 'ledgerctl verify' for the list)", len(left))
	}
	return nil
}

// repair puts back the log copies first, so that a projector running
// meanwhile folds them in order, then the projections.
func (d *verifyDeps) repair(ctx context.Context, f *Flags, found []finding) ([]repairRow, error) {
	var rows []repairRow
	heads := map[string]int64{}
	for _, fd := range found {
		switch fd.Kind {
		case kindLog:
			n, err := d.republish(ctx, fd)
			if err != nil {
				return rows, err
			}
			rows = append(rows, repairRow{finding: fd, Outcome: fmt.Sprintf("republished %d", n)})
		case kindProjection:
			heads[fd.Task] = fd.Want
		case kindConsumer:
			rows = append(rows, repairRow{finding: fd, Outcome: "left alone", Action: consumerAction(fd)})
		}
	}
	if len(heads) == 0 {
		return rows, nil
	}
	nc, err := f.NATS()
	if err != nil {
		return rows, err
	}
	defer nc.Close()
	p, err := projector.New(projector.Config{Prefix: f.Prefix}, projector.Deps{NC: nc, Pool: d.pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return rows, err
	}
	if err := p.RepairTasks(ctx, heads); err != nil {
		return rows, err
	}
	for _, fd := range found {
		if fd.Kind == kindProjection {
			rows = append(rows, repairRow{finding: fd, Outcome: "folded again"})
		}
	}
	return rows, nil
}

// republish publishes again, from PostgreSQL, a task's versions after its
// last LEDGER_LOG copy, in version order, as the ingest's tail check does.
// Each copy carries its event id as its message id: one still in the
// stream's duplicate window is not stored twice.
func (d *verifyDeps) republish(ctx context.Context, fd finding) (int, error) {
	missing, err := d.store.Between(ctx, fd.Task, fd.Have, fd.Want+1)
	if err != nil {
		return 0, err
	}
	for i := range missing {
		if _, err := d.js.PublishMsg(ctx, d.subj.LogMsg(&missing[i])); err != nil {
			return i, fmt.Errorf("publish the copy of %s version %d again: %w", fd.Task, missing[i].Version, err)
		}
	}
	return len(missing), nil
}

// consumerAction is what the operator does about a consumer verify found.
func consumerAction(fd finding) string {
	if isInbox(fd.Stream) {
		return "restart the ingest that holds this partition's claim: it remakes its consumer from the stream's first message"
	}
	return "stop the projectors, delete this consumer, start them: it is made again from the log's start (duplicates are ignored)"
}

func printRepairs(w io.Writer, asJSON bool, rows []repairRow) error {
	if asJSON {
		return writeJSONLines(w, rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "nothing to repair")
		return nil
	}
	t := newTable(w, "KIND", "PROBLEM", "TASK/CONSUMER", "HAVE", "WANT", "OUTCOME", "ACTION")
	for _, r := range rows {
		who := r.Task
		if r.Kind == kindConsumer {
			who = r.Stream + "/" + r.Consumer
		}
		t.row(r.Kind, r.Problem, who, r.Have, r.Want, r.Outcome, r.Action)
	}
	return t.flush()
}
