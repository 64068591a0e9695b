package projector

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/strictjson"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// A snapshot is the bucket ledger_tasks as it stood: every task's
// projection with the version and seq it reflects. A rebuild can start from
// it and replay only the hot log (RebuildSource.Snapshot), so projections
// survive the archiving of the history they were folded from.
//
// The file is gzip-compressed JSON lines: a header, one bucket value per
// line (projection.State, as the bucket holds it), and an end line that
// counts them, so that a truncated snapshot is told from a whole one.

// SnapshotFormat names the format in every snapshot's header.
const SnapshotFormat = "ledger-snapshot/1"

// maxSnapshotLine bounds a line: a bucket value is at most 1 MiB.
const maxSnapshotLine = 2 << 20

// SnapshotHeader is the first line of a snapshot.
type SnapshotHeader struct {
	Format  string    `json:"format"`
	TakenAt time.Time `json:"taken_at"`
	Bucket  string    `json:"bucket"`
	// BelowSeq is the archive horizon when the snapshot was taken: history
	// below it was already archived.
	BelowSeq int64 `json:"below_seq"`
}

// snapshotEnd is the last line of a snapshot.
type snapshotEnd struct {
	End   bool  `json:"end"`
	Tasks int64 `json:"tasks"`
}

// WriteSnapshot writes every value of the bucket ledger_tasks to w and
// returns the header and how many values it wrote. Values that are not a
// projection of their key are left out and counted in skipped. It reads the
// bucket as it stands while the projectors keep writing: each value is
// whole, and a rebuild replays every later event of its task.
func WriteSnapshot(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, w io.Writer) (h SnapshotHeader, tasks, skipped int64, err error) {
	h = SnapshotHeader{Format: SnapshotFormat, TakenAt: time.Now().UTC(), Bucket: wire.BucketTasks}
	var first int64
	if err := pool.QueryRow(ctx, sqlHorizon).Scan(&h.BelowSeq, &first); err != nil {
		return h, 0, 0, fmt.Errorf("projector: snapshot: read the archive horizon: %w", err)
	}
	kv, err := js.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		return h, 0, 0, fmt.Errorf("projector: snapshot: open bucket %s: %w", wire.BucketTasks, err)
	}
	watch, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return h, 0, 0, fmt.Errorf("projector: snapshot: read bucket %s: %w", wire.BucketTasks, err)
	}
	defer watch.Stop() //nolint:errcheck
	gz := gzip.NewWriter(w)
	enc := json.NewEncoder(gz)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(h); err != nil {
		return h, 0, 0, err
	}
	for {
		var entry jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return h, tasks, skipped, ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return h, tasks, skipped, errors.New("projector: snapshot: the bucket's watch ended early")
			}
			entry = e
		}
		if entry == nil {
			break // every value that was there when the watch began
		}
		st, err := storedState(entry.Key(), entry.Value())
		if err == nil {
			err = checkSnapshotValue(st)
		}
		if err != nil {
			skipped++
			continue
		}
		// Encoded again, so that a line holds exactly the fields a reader
		// takes, on one line.
		if err := enc.Encode(st); err != nil {
			return h, tasks, skipped, err
		}
		tasks++
	}
	if err := enc.Encode(snapshotEnd{End: true, Tasks: tasks}); err != nil {
		return h, tasks, skipped, err
	}
	return h, tasks, skipped, gz.Close()
}

// ReadSnapshot reads a snapshot from r, calling fn with each projection in
// it, and returns its header. It fails on anything but a whole snapshot:
// the header first, each value a projection (projection.State with a valid
// task id, a version of at least 0, JSON data) on one line, and the end line
// last, counting them.
func ReadSnapshot(r io.Reader, fn func(projection.State) error) (SnapshotHeader, error) {
	var h SnapshotHeader
	gz, err := gzip.NewReader(r)
	if err != nil {
		return h, fmt.Errorf("snapshot: %w", err)
	}
	sc := bufio.NewScanner(gz)
	sc.Buffer(make([]byte, 64<<10), maxSnapshotLine)
	if !sc.Scan() {
		return h, fmt.Errorf("snapshot: no header: %w", errOr(sc.Err(), io.ErrUnexpectedEOF))
	}
	if err := strictjson.Decode(sc.Bytes(), &h); err != nil || h.Format != SnapshotFormat || h.Bucket == "" {
		return h, fmt.Errorf("snapshot: the first line is not a %s header", SnapshotFormat)
	}
	var n int64
	for sc.Scan() {
		line := sc.Bytes()
		st, err := DecodeSnapshotValue(line)
		if err != nil {
			// Not a projection (it has no task): the end line, or nothing.
			var end snapshotEnd
			if strictjson.Decode(line, &end) != nil || !end.End {
				return h, fmt.Errorf("snapshot: line %d: %w", n+2, err)
			}
			if end.Tasks != n {
				return h, fmt.Errorf("snapshot: %d projections, the end line says %d", n, end.Tasks)
			}
			if sc.Scan() {
				return h, errors.New("snapshot: more after the end line")
			}
			return h, errOr(sc.Err(), nil)
		}
		n++
		if err := fn(st); err != nil {
			return h, err
		}
	}
	return h, fmt.Errorf("snapshot: no end line after %d projections (truncated?): %w", n, errOr(sc.Err(), io.ErrUnexpectedEOF))
}

// DecodeSnapshotValue reads one projection of a snapshot, strictly: the
// fields of the bucket's value, a valid task id, a version of at least 0,
// JSON data.
func DecodeSnapshotValue(line []byte) (projection.State, error) {
	var st projection.State
	if err := strictjson.Decode(line, &st); err != nil {
		return st, fmt.Errorf("not a projection: %w", err)
	}
	return st, checkSnapshotValue(st)
}

// checkSnapshotValue is what DecodeSnapshotValue asks of a decoded
// projection: a valid task id, a version of at least 0, JSON data.
func checkSnapshotValue(st projection.State) error {
	switch {
	case !wire.ValidID(st.Task):
		return fmt.Errorf("task id %.40q is not 1..128 of [A-Za-z0-9_-]", st.Task)
	case st.Version < 0 || st.Seq < 0 || st.Partition < 0 || st.DataTooLarge < 0:
		return fmt.Errorf("task %s: version %d, seq %d, partition %d out of range", st.Task, st.Version, st.Seq, st.Partition)
	case len(st.Data) > 0 && !wire.ValidJSON(st.Data):
		return fmt.Errorf("task %s: data is not JSON", st.Task)
	case st.Gap != nil && (st.Gap.NextVersion <= st.Version || st.Gap.Buffered < 0):
		return fmt.Errorf("task %s: gap at version %d, buffered %d, does not follow version %d", st.Task,
			st.Gap.NextVersion, st.Gap.Buffered, st.Version)
	}
	return nil
}

func errOr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}
