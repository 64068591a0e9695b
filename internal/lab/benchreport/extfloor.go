package benchreport

import (
	"context"
	"fmt"
	"time"
)

// LabelFloor is the external report's floor row: the storage's own limit
// on the deployment's PostgreSQL, which the SDK → receipt target of
// issue 28 is a ratio to (at least 0.5 of it).
const LabelFloor = "floor: " + LabelSetInsert + ", flat table, the same PostgreSQL"

// floor measures, after the run, the set-based fenced insert into a flat
// table (the in-process report's floor, sqlSetInsert) on the deployment's
// own PostgreSQL: as many events as the run, over as many tasks, one
// connection, 1,000 a statement. The deployment stays up but idle. The
// ratio of the run's receipts to it is the deployment's share of what its
// storage can take, measured in one run on one machine.
func (e *external) floor(ctx context.Context) (Row, error) {
	pool := e.d.Pool()
	drop, err := createScratch(ctx, pool)
	if err != nil {
		return Row{}, err
	}
	defer drop()
	var gens [partitions]int64
	for p := range gens {
		gens[p] = 1
	}
	events := newLoad("bench-floor-", e.o.Tasks).events(e.o.Events, baselineHolder, gens)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Row{}, fmt.Errorf("benchreport: floor: connect: %w", err)
	}
	defer conn.Release()
	n := 0
	start := time.Now()
	if err := setInsert(ctx, conn.Conn(), events, func(k int) { n += k }); err != nil {
		return Row{}, fmt.Errorf("benchreport: floor: %w", err)
	}
	elapsed := time.Since(start)
	if n != len(events) {
		return Row{}, fmt.Errorf("benchreport: floor: %d of %d events inserted: the fence refused the others", n, len(events))
	}
	return throughputRow(LabelFloor, n, elapsed), nil
}

// relativeToFloor sets row's ratio to the floor.
func relativeToFloor(row *Row, floor Row) {
	if floor.PerSecond > 0 && row.PerSecond > 0 {
		row.Relative, row.RelativeTo = row.PerSecond/floor.PerSecond, "the floor"
	}
}
