package projection_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flowness/ledger/pkg/projection"
)

// The projector's loop, with maps standing in for the KV bucket and the
// events table.
func Example() {
	kv := map[string]projection.State{}
	db := map[string][]projection.Event{"report-7": {
		{Task: "report-7", Partition: 3, Version: 1, Seq: 10, Type: "running", Payload: json.RawMessage(`{"step":1}`)},
		{Task: "report-7", Partition: 3, Version: 2, Seq: 11, Type: "running", Payload: json.RawMessage(`{"step":2}`)},
		{Task: "report-7", Partition: 3, Version: 3, Seq: 12, Type: "completed", Payload: json.RawMessage(`{"result":"ok"}`)},
	}}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, err := projection.New(projection.Config{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	offer := func(ev projection.Event) {
		res, err := e.Offer(ev)
		if errors.Is(err, projection.ErrNotLoaded) {
			stored, ok := kv[ev.Task]
			if !ok {
				stored = projection.State{Task: ev.Task}
			}
			if err := e.Load(stored); err != nil {
				panic(err)
			}
			res, err = e.Offer(ev)
		}
		if err != nil {
			fmt.Println("error:", err)
		}
		if res.Changed {
			kv[ev.Task] = res.State // the projector puts it in ledger_tasks
		}
		fmt.Printf("v%d %s -> version %d\n", ev.Version, res.Outcome, res.State.Version)
	}

	// Version 2 is lost on the way; 3 arrives, then 1.
	offer(db["report-7"][2])
	offer(db["report-7"][0])
	fmt.Printf("gap: waits for v%d\n", kv["report-7"].Gap.NextVersion)

	// On the projector's timer, once the gap has lasted GapTimeout: read the
	// missing versions from the events table and offer them.
	now = now.Add(projection.GapTimeoutDefault)
	for _, r := range e.DueRefetches() {
		fmt.Println("re-fetch", r.Task, r.FromVersion, "to", r.ToVersion)
		for v := r.FromVersion; v <= r.ToVersion; v++ {
			offer(db[r.Task][v-1])
		}
	}

	st := kv["report-7"]
	fmt.Printf("%s v%d %s %s gap=%v\n", st.Task, st.Version, st.Status, st.Data, st.Gap)
	// Output:
	// v3 buffered -> version 0
	// v1 applied -> version 1
	// gap: waits for v2
	// re-fetch report-7 2 to 2
	// v2 applied -> version 3
	// report-7 v3 completed {"step":2,"result":"ok"} gap=<nil>
}
