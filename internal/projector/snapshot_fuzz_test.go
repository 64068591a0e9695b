package projector

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzSnapshotValueWrittenIsRead: whatever a bucket value holds, a value
// WriteSnapshot keeps (storedState, then checkSnapshotValue) is written as
// a line that ReadSnapshot takes (DecodeSnapshotValue) as the same state:
// a snapshot never holds a line its reader refuses.
func FuzzSnapshotValueWrittenIsRead(f *testing.F) {
	addStateSeeds(f, `{"a":[1,{"b":"<&>"}]}`)
	for _, seed := range []string{`{"task":"t","version":1,"extra":[1]}`, `{"task":"t","version":-1}`,
		`{"task":"t","data": { "a" : 1 } ,"updated_at":"0000-01-01T00:00:00+23:59"}`, `{"TASK":"t","Version":2}`,
		`{"task":"t","version":3,"gap":{"next_version":3}}`, "{\"task\":\"t\",\"status\":\"\xff\"}"} {
		f.Add("t", []byte(seed))
	}
	f.Fuzz(func(t *testing.T, task string, value []byte) {
		st, err := storedState(task, value)
		if err != nil || checkSnapshotValue(st) != nil {
			return
		}
		var line bytes.Buffer
		enc := json.NewEncoder(&line)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(st), "a kept value encodes")
		got, err := DecodeSnapshotValue(bytes.TrimSuffix(line.Bytes(), []byte("\n")))
		require.NoError(t, err, "a kept value is read back")
		want, err := json.Marshal(st)
		require.NoError(t, err)
		again, err := json.Marshal(got)
		require.NoError(t, err)
		require.Equal(t, string(want), string(again))
	})
}
