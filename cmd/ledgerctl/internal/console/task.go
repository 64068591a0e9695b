package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/flowness/ledger/pkg/canonjson"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

func checkTaskID(id string) error {
	if !wire.ValidID(id) {
		return fmt.Errorf("task id %q is not 1..%d characters of [A-Za-z0-9_-]", id, wire.MaxIDLen)
	}
	return nil
}

// eventRow is a committed event with what changed since the one before.
type eventRow struct {
	TaskEvent
	// NewGeneration is set on the first event of a generation other than
	// the previous event's; PrevHolder and PrevGeneration are that one's.
	NewGeneration  bool
	PrevHolder     string
	PrevGeneration int64
}

// taskView is one task: its log, its rejections and its projection beside
// the fold of its log.
type taskView struct {
	ID         string
	Found      bool
	Partition  int
	Head       int64
	Owner      string
	Snapshot   bool
	Events     []eventRow
	Rejections []TaskRejection
	Projection TaskProjection
	Compare    comparison
	Problem    string
}

// comparison sets the stored projection beside the fold of the task's log
// from PostgreSQL.
type comparison struct {
	// Stored and Folded are the two values, indented.
	Stored, Folded string
	// Match is set when they agree on version, status, seq, partition and
	// data; Differences lists where they do not.
	Match       bool
	Differences []string
	// Note says what could not be compared.
	Note string
}

func (s *Server) taskView(ctx context.Context, id string) taskView {
	v := taskView{ID: id}
	t, err := s.deps.Ledger.Task(ctx, id)
	if err != nil {
		v.Problem = s.hub.problem("read task", "the task could not be read (the console's log says why)", err)
		return v
	}
	v.Rejections, v.Projection, v.Owner, v.Snapshot = t.Rejections, t.Projection, t.Owner, t.Snapshot
	for i, e := range t.Events {
		row := eventRow{TaskEvent: e}
		if i > 0 && (e.Generation != t.Events[i-1].Generation || e.Holder != t.Events[i-1].Holder) {
			row.NewGeneration, row.PrevHolder, row.PrevGeneration = true, t.Events[i-1].Holder, t.Events[i-1].Generation
		}
		v.Events = append(v.Events, row)
	}
	if n := len(t.Events); n > 0 {
		v.Found, v.Partition, v.Head = true, t.Events[n-1].Partition, t.Events[n-1].Version
	}
	v.Compare = taskComparison(id, t)
	return v
}

// taskComparison compares a task's stored projection with the fold of its
// log, when the log holds all of it: a task whose first versions were
// archived folds only what is left, which is not its projection.
func taskComparison(id string, t Task) comparison {
	if t.Archived != "" {
		return comparison{Note: t.Archived + "; the stored projection is not compared with the fold of the versions left"}
	}
	fold, err := foldLog(id, t.Events, t.Snapshot)
	if err != nil {
		return comparison{Note: "the log could not be folded: " + err.Error()}
	}
	return compareProjection(t.Projection, fold)
}

// foldLog folds a task's committed events with the projector's engine and
// reducer: the projection the log implies.
func foldLog(id string, events []TaskEvent, snapshot bool) (projection.State, error) {
	e, err := projection.New(projection.Config{})
	if err != nil {
		return projection.State{}, err
	}
	if err := e.Load(projection.State{Task: id}); err != nil {
		return projection.State{}, err
	}
	for _, ev := range events {
		if _, err := e.Offer(projection.Event{Task: id, Partition: ev.Partition, Version: ev.Version, Seq: ev.Seq,
			Type: ev.Type, Payload: ev.Payload, Snapshot: snapshot}); err != nil {
			return projection.State{}, fmt.Errorf("version %d: %w", ev.Version, err)
		}
	}
	st, _ := e.State(id)
	return st, nil
}

// folded is what the comparison shows of a state: the fields a log
// decides (updated_at and gap are the projector's own).
type folded struct {
	Task      string          `json:"task"`
	Partition int             `json:"partition"`
	Version   int64           `json:"version"`
	Status    string          `json:"status"`
	Seq       int64           `json:"seq"`
	Data      json.RawMessage `json:"data"`
}

func indent(v any) string {
	b, _ := json.Marshal(v)
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil {
		return string(b)
	}
	return out.String()
}

// compareProjection compares a stored projection with the fold of the log.
func compareProjection(p TaskProjection, fold projection.State) comparison {
	c := comparison{Folded: indent(folded{fold.Task, fold.Partition, fold.Version, fold.Status, fold.Seq, orNull(fold.Data)})}
	if p.Revision == 0 {
		c.Note = "no stored projection: " + p.Note
		c.Match = fold.Version == 0
		if !c.Match {
			c.Differences = append(c.Differences, fmt.Sprintf("the log is at version %d and nothing is stored", fold.Version))
		}
		return c
	}
	var stored projection.State
	if err := json.Unmarshal(p.Value, &stored); err != nil {
		c.Stored, _ = showBody(p.Value)
		c.Note = "the stored value is not a projection: " + err.Error()
		c.Differences = append(c.Differences, "the stored value cannot be read")
		return c
	}
	c.Stored = indent(folded{stored.Task, stored.Partition, stored.Version, stored.Status, stored.Seq, orNull(stored.Data)})
	diff := func(field string, stored, folded any) {
		if stored != folded {
			c.Differences = append(c.Differences, fmt.Sprintf("%s: stored %v, the log gives %v", field, stored, folded))
		}
	}
	diff("version", stored.Version, fold.Version)
	diff("status", fmt.Sprintf("%q", stored.Status), fmt.Sprintf("%q", fold.Status))
	diff("seq", stored.Seq, fold.Seq)
	diff("partition", stored.Partition, fold.Partition)
	switch {
	case stored.DataTooLarge > 0:
		c.Note = fmt.Sprintf("the stored value carries no data (data_too_large: %d bytes): data not compared", stored.DataTooLarge)
	default:
		if eq, err := canonjson.Equal(orNull(stored.Data), orNull(fold.Data)); err != nil || !eq {
			c.Differences = append(c.Differences, "data: the stored data is not the fold of the log's payloads")
		}
	}
	if stored.Gap != nil {
		c.Differences = append(c.Differences, fmt.Sprintf("the projector waits for version %d (gap since %s)",
			stored.Gap.NextVersion, wire.FormatTime(stored.Gap.Since)))
	}
	c.Match = len(c.Differences) == 0
	return c
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(b)) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// taskSource is a task's view, read again at every snapshot.
type taskSource struct {
	s    *Server
	id   string
	next <-chan struct{}
}

func (t *taskSource) data(ctx context.Context) any {
	_, t.next = t.s.hub.current()
	return t.s.taskView(ctx, t.id)
}

func (t *taskSource) changed() <-chan struct{} { return t.next }
func (t *taskSource) close()                   {}

func (s *Server) taskForm(w http.ResponseWriter, r *http.Request) {
	if id := r.URL.Query().Get("id"); id != "" {
		http.Redirect(w, r, "/task/"+url.PathEscape(id), http.StatusSeeOther)
		return
	}
	s.render(w, http.StatusOK, "task", page{Title: "Task", Nav: "task", Data: taskView{}})
}

func (s *Server) taskPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := checkTaskID(id); err != nil {
		s.fail(w, http.StatusBadRequest, err.Error())
		return
	}
	r.URL.RawQuery = url.Values{"id": {id}}.Encode()
	s.livePage(w, r, "task", "Task "+id, "task", "task", s.taskView(r.Context(), id))
}
