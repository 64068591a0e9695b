package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/flowness/ledger/pkg/wire"
)

// FuzzVerdictReply feeds any reply body to a lookup of one event: it must
// never panic, and it settles the event only with a contract verdict given
// for that very event, keeping what the client knows of it.
func FuzzVerdictReply(f *testing.F) {
	const id = "01JD0000000000000000000001"
	for _, seed := range []string{
		`{"task":"job","partition":2,"version":1,"seq":7,"event":{"event_id":"` + id + `","verdict":"committed","reason":"","seq":7}}`,
		`{"task":"job","partition":2,"version":1,"seq":7,"event":{"event_id":"` + id + `","verdict":"conflict","reason":"version_taken","seq":0}}`,
		`{"task":"job","partition":null,"version":0,"seq":0,"event":null}`,
		`{"task":"job","version":0}`,
		`{"event":{"event_id":"01JD0000000000000000000002","verdict":"committed","seq":9}}`,
		`{"event":{"event_id":"` + id + `","verdict":"not_yet"}}`,
		`{"event":{"event_id":"` + id + `","verdict":"committed","seq":1e400}}`,
		`{"event":{"event_id":"` + id + `","event_id":"x","verdict":"committed"}}`,
		`{"event":[1,2,3]}`,
		`{"event":"committed"}`,
		`null`, ``, `{`,
	} {
		f.Add([]byte(seed))
	}
	l := &Lease{partition: 2, generation: 3}
	p := &Pending{lease: l, id: id, task: "job", version: 1}
	f.Fuzz(func(t *testing.T, body []byte) {
		var reply wire.TaskHeadEventReply
		if json.Unmarshal(body, &reply) != nil {
			return // the request fails and the lookup is tried again
		}
		r, found, err := p.lookedUp(reply.Event)
		if !found {
			return
		}
		if err != nil {
			t.Fatalf("found with an error: %v", err)
		}
		ev := reply.Event
		if ev.EventID != id || !ev.Verdict.Final() {
			t.Fatalf("settled by %+v", *ev)
		}
		want := wire.Receipt{EventID: id, Task: "job", Partition: 2, Version: 1, Verdict: ev.Verdict,
			Reason: ev.Reason, Seq: ev.Seq, Generation: 3}
		if r != want {
			t.Fatalf("receipt %+v, want %+v", r, want)
		}
	})
}

// A run of busy refusals of verdict lookups is logged once, at Warn, and
// its end once, at Info, with how many lookups were refused: not one line
// per event.
// Switch: refusalRun.note logging every refusal (100 Warn lines).
func TestRefusedLookupsAreLoggedOncePerRun(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	var run refusalRun
	busy := newServiceError(wire.ErrorReply{Error: wire.ErrCodeBusy, Message: "over its share"})
	for range 2 {
		for range 100 {
			run.note(log, fmt.Errorf("worker: verdict: %w", busy), 10)
		}
		run.note(log, nil, 10)
	}
	var levels []string
	refused := 0
	for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var rec struct {
			Level   string
			Refused int
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %s: %v", line, err)
		}
		levels = append(levels, rec.Level)
		refused += rec.Refused
	}
	if want := []string{"WARN", "INFO", "WARN", "INFO"}; !slices.Equal(levels, want) {
		t.Fatalf("logged at %v, want %v", levels, want)
	}
	if refused != 2000 {
		t.Fatalf("logged %d lookups refused, want 2000", refused)
	}
}
