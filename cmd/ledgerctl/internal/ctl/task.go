package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// taskEvent is a committed event as task prints it.
type taskEvent struct {
	Kind        string          `json:"kind"` // "event"
	Task        string          `json:"task"`
	Seq         int64           `json:"seq"`
	EventID     string          `json:"event_id"`
	Partition   int             `json:"partition"`
	Version     int64           `json:"version"`
	Type        string          `json:"type"`
	Holder      string          `json:"holder"`
	Generation  int64           `json:"generation"`
	CommittedAt string          `json:"committed_at"`
	Payload     json.RawMessage `json:"payload"`
}

// taskRejection is a row of ledger.rejections as task prints it.
type taskRejection struct {
	Kind              string `json:"kind"` // "rejection"
	Task              string `json:"task"`
	ID                int64  `json:"id"`
	EventID           string `json:"event_id"`
	Partition         int    `json:"partition"`
	Version           int64  `json:"version"`
	Holder            string `json:"holder"`
	Generation        int64  `json:"generation"`
	Verdict           string `json:"verdict"`
	Reason            string `json:"reason"`
	CurrentGeneration int64  `json:"current_generation"`
	RejectedAt        string `json:"rejected_at"`
}

// taskArchived says that a task's first versions are archived: they are in
// the archive's files, no longer in ledger.events.
type taskArchived struct {
	Kind        string `json:"kind"` // "archived"
	Task        string `json:"task"`
	Versions    int64  `json:"versions"` // versions 1..Versions
	BelowSeq    int64  `json:"below_seq"`
	Explanation string `json:"note"`
}

// taskProjection is the task's value in the projection bucket; Value is
// null when there is none yet.
type taskProjection struct {
	Kind     string          `json:"kind"` // "projection"
	Task     string          `json:"task"`
	Bucket   string          `json:"bucket"`
	Revision uint64          `json:"revision,omitempty"`
	StoredAt string          `json:"stored_at,omitempty"`
	Value    json.RawMessage `json:"value"`
	// Note says why there is no value.
	Note string `json:"note,omitempty"`
}

// Task shows one task: its committed events in version order, its
// rejections, and its projection ("task <id>").
func Task(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl task", "[flags] <id>",
		"Show a task: its committed events from ledger.events in version order, its rejections\nfrom ledger.rejections, and its projection in the KV bucket "+wire.BucketTasks+".", stderr)
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case f.NArg() == 0:
		return Usagef("missing the task id")
	case f.NArg() > 1:
		return Usagef("one task id expected, got %d arguments", f.NArg())
	case !wire.ValidID(f.Arg(0)):
		return Usagef("task id %q is not 1..%d characters of [A-Za-z0-9_-]", f.Arg(0), wire.MaxIDLen)
	}
	id := f.Arg(0)

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

	events, err := taskEvents(ctx, pool, id)
	if err != nil {
		return err
	}
	rejections, err := taskRejections(ctx, pool, id)
	if err != nil {
		return err
	}
	archived, err := taskArchivedVersions(ctx, pool, id)
	if err != nil {
		return err
	}
	var owner string
	var snapshot bool
	if err := pool.QueryRow(ctx, sqlTaskOwner, id).Scan(&owner, &snapshot); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return schemaHint("read the task's owner", err)
	}
	proj, err := projection(ctx, js, id)
	if err != nil {
		return err
	}

	if f.JSON {
		if archived.Versions > 0 {
			if err := writeJSON(stdout, archived); err != nil {
				return err
			}
		}
		for _, e := range events {
			if err := writeJSON(stdout, e); err != nil {
				return err
			}
		}
		for _, r := range rejections {
			if err := writeJSON(stdout, r); err != nil {
				return err
			}
		}
		return writeJSON(stdout, proj)
	}
	if archived.Versions > 0 {
		fmt.Fprintf(stdout, "task %s: %s\n", id, archived.Explanation)
	}
	if owner != "" {
		fmt.Fprintf(stdout, "task %s: owned by principal %s, which alone may write it\n", id, owner)
	}
	if snapshot {
		fmt.Fprintf(stdout, "task %s: a snapshot task: its versions rise with gaps, and its projection is the newest snapshot\n", id)
	}
	return printTask(stdout, id, events, rejections, proj)
}

// taskArchivedVersions reads how many of the task's first versions are
// archived.
func taskArchivedVersions(ctx context.Context, db querier, id string) (taskArchived, error) {
	a := taskArchived{Kind: "archived", Task: id}
	rows, err := db.Query(ctx, sqlTaskArchived, id)
	if err != nil {
		return a, schemaHint("read the archive horizon", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&a.Versions, &a.BelowSeq}, func() error { return nil })
	if err != nil {
		return a, schemaHint("read the archive horizon", err)
	}
	if a.Versions > 0 {
		a.Explanation = fmt.Sprintf("versions 1..%d are archived (history below seq %d): they are in the archive's files, not listed here",
			a.Versions, a.BelowSeq)
	}
	return a, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func taskEvents(ctx context.Context, db querier, id string) ([]taskEvent, error) {
	rows, err := db.Query(ctx, sqlTaskEvents, id)
	if err != nil {
		return nil, schemaHint("read events", err)
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (taskEvent, error) {
		e := taskEvent{Kind: "event", Task: id}
		var at time.Time
		var payload string
		err := r.Scan(&e.Seq, &e.EventID, &e.Partition, &e.Version, &e.Type, &e.Holder, &e.Generation, &at, &payload)
		e.CommittedAt, e.Payload = wire.FormatTime(at), json.RawMessage(compactJSON([]byte(payload)))
		return e, err
	})
	if err != nil {
		return nil, schemaHint("read events", err)
	}
	return events, nil
}

func taskRejections(ctx context.Context, db querier, id string) ([]taskRejection, error) {
	rows, err := db.Query(ctx, sqlTaskRejections, id)
	if err != nil {
		return nil, schemaHint("read rejections", err)
	}
	rejections, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (taskRejection, error) {
		j := taskRejection{Kind: "rejection", Task: id}
		var at time.Time
		err := r.Scan(&j.ID, &j.EventID, &j.Partition, &j.Version, &j.Holder, &j.Generation,
			&j.Verdict, &j.Reason, &j.CurrentGeneration, &at)
		j.RejectedAt = wire.FormatTime(at)
		return j, err
	})
	if err != nil {
		return nil, schemaHint("read rejections", err)
	}
	return rejections, nil
}

// projection reads the task's value from the projection bucket.
func projection(ctx context.Context, js jetstream.JetStream, id string) (taskProjection, error) {
	p := taskProjection{Kind: "projection", Task: id, Bucket: wire.BucketTasks, Value: json.RawMessage("null")}
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, wire.BucketTasks)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		p.Note = "no projection yet: bucket " + wire.BucketTasks + " does not exist (is the projector running?)"
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("open bucket %s: %w", wire.BucketTasks, err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		p.Note = "no projection yet"
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("read %s from bucket %s: %w", id, wire.BucketTasks, err)
	}
	p.Revision, p.StoredAt = e.Revision(), wire.FormatTime(e.Created())
	if v, ok := rawJSON(e.Value()); ok {
		p.Value = v
	} else {
		q, _ := json.Marshal(string(e.Value()))
		p.Value, p.Note = q, "the stored value is not JSON"
	}
	return p, nil
}

func printTask(w io.Writer, id string, events []taskEvent, rejections []taskRejection, proj taskProjection) error {
	if len(events) == 0 {
		fmt.Fprintf(w, "task %s: no committed events\n", id)
	} else {
		head := events[len(events)-1]
		fmt.Fprintf(w, "task %s: partition %d, head version %d (seq %d), committed events: %d\n",
			id, head.Partition, head.Version, head.Seq, len(events))
		fmt.Fprintln(w, "\nCOMMITTED EVENTS")
		t := newTable(w, "VERSION", "SEQ", "TYPE", "HOLDER/GEN", "COMMITTED AT", "EVENT ID", "PAYLOAD")
		for _, e := range events {
			t.row(e.Version, e.Seq, e.Type, fmt.Sprintf("%s/%d", e.Holder, e.Generation),
				e.CommittedAt, e.EventID, string(e.Payload))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nREJECTIONS")
	if len(rejections) == 0 {
		fmt.Fprintln(w, "none")
	} else {
		t := newTable(w, "VERSION", "VERDICT", "REASON", "HOLDER/GEN", "CURRENT GEN", "REJECTED AT", "EVENT ID")
		for _, r := range rejections {
			t.row(r.Version, r.Verdict, r.Reason, fmt.Sprintf("%s/%d", r.Holder, r.Generation),
				r.CurrentGeneration, r.RejectedAt, r.EventID)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	if proj.Revision == 0 {
		fmt.Fprintf(w, "\nPROJECTION\n%s\n", proj.Note)
		return nil
	}
	fmt.Fprintf(w, "\nPROJECTION (bucket %s, revision %d, stored %s)\n", proj.Bucket, proj.Revision, proj.StoredAt)
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, proj.Value, "", "  "); err != nil {
		pretty.Reset()
		pretty.Write(proj.Value)
	}
	if proj.Note != "" {
		fmt.Fprintln(w, proj.Note)
	}
	_, err := fmt.Fprintln(w, printableLines(pretty.String()))
	return err
}
