package projector

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/projection"
)

// FuzzStoredState: whatever a bucket value holds, storedState never panics;
// what it accepts is the task's own, the engine either resumes from it or
// refuses it as ErrInvalidState (which load answers by folding the task again
// from PostgreSQL), and it encodes back to a value that decodes the same.
func FuzzStoredState(f *testing.F) {
	addStateSeeds(f, `{"a":[1,{"b":null}]}`)
	for _, seed := range []string{``, `null`, `[]`, `{"task":"t","version":-7}`, `{"task":"u","version":1}`,
		`{"task":"t","version":1,"data":{"a":}`, `{"task":"t","version":2,"data_too_large":-1}`,
		`{"task":"t","updated_at":"yesterday"}`, `{"task":"t","gap":{"next_version":"x"}}`, "{\"task\":\"t\",\"status\":\"\xff\"}"} {
		f.Add("t", []byte(seed))
	}
	f.Fuzz(func(t *testing.T, task string, value []byte) {
		st, err := storedState(task, value)
		if err != nil {
			return
		}
		require.Equal(t, task, st.Task)
		e, err := projection.New(projection.Config{})
		require.NoError(t, err)
		if err := e.Load(st); err != nil {
			require.ErrorIs(t, err, projection.ErrInvalidState)
		}
		b, err := json.Marshal(st)
		require.NoError(t, err)
		again, err := storedState(task, b)
		require.NoError(t, err)
		b2, err := json.Marshal(again)
		require.NoError(t, err)
		require.Equal(t, string(b), string(b2))
	})
}

// addStateSeeds seeds a target of (task, value) with task "t"'s values: a
// state with data, gap and every field, the same without its data, and an
// empty state.
func addStateSeeds(f *testing.F, data string) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)
	st := projection.State{Task: "t", Partition: 3, Version: 4, Status: "running", Data: json.RawMessage(data),
		Seq: 99, UpdatedAt: at, Gap: &projection.GapInfo{NextVersion: 5, Buffered: 2, Since: at}}
	for _, seed := range []any{st, st.WithoutData(), projection.State{Task: "t"}} {
		b, err := json.Marshal(seed)
		require.NoError(f, err)
		f.Add("t", b)
	}
}
