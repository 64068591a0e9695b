package projection_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/projection"
)

// stateJSONCases are states the fast path writes itself and states it
// hands to json.Marshal, side by side.
var stateJSONCases = []projection.State{
	{},
	{Task: "order-1", Partition: 3, Version: 7, Status: "shipped", Data: json.RawMessage(`{"a":1,"b":[true,null,"x"]}`),
		Seq: 1234, UpdatedAt: time.Date(2026, 12, 3, 8, 0, 0, 123456789, time.UTC)},
	{Task: "t", Version: 2, Gap: &projection.GapInfo{NextVersion: 3, Buffered: 4, Since: time.Unix(1, 5).In(time.FixedZone("x", 3600))}},
	{Task: "t", DataTooLarge: 70000, Kind: "snapshot", UpdatedAt: time.Unix(0, 0)},
	{Task: "t", Data: json.RawMessage(`{"a": 1}`)},                       // not compact
	{Task: "t", Data: json.RawMessage(`{"a":"<b>&"}`)},                   // escaped for HTML
	{Task: "t", Data: json.RawMessage("{\"a\":\"\u2028\"}")},             // escaped as a line separator
	{Task: "t", Data: json.RawMessage(`{"a":"é"}`)},                      // left as it is
	{Task: "t", Data: json.RawMessage(`{"a":`)},                          // not JSON: an error
	{Task: "t\"<\x01é", Status: "a\\b", Kind: "\u2029"},                  // strings escaped
	{Task: "t", UpdatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, // a time MarshalJSON refuses
}

func TestStateAppendJSONIsJSONMarshal(t *testing.T) {
	for i, st := range stateJSONCases {
		want, wantErr := json.Marshal(st)
		got, err := st.AppendJSON([]byte("prefix"))
		if wantErr != nil {
			require.Error(t, err, "case %d", i)
			continue
		}
		require.NoError(t, err, "case %d", i)
		require.Equal(t, "prefix"+string(want), string(got), "case %d", i)
	}
}

func FuzzStateAppendJSON(f *testing.F) {
	for _, st := range stateJSONCases {
		f.Add(st.Task, st.Status, st.Kind, []byte(st.Data), st.Data == nil, st.Version, st.UpdatedAt.UnixNano(), st.Gap != nil, st.DataTooLarge)
	}
	f.Fuzz(func(t *testing.T, task, status, kind string, data []byte, nilData bool, version, nanos int64, gap bool, tooLarge int) {
		st := projection.State{Task: task, Partition: int(version % 64), Version: version, Status: status, Data: data,
			Seq: version * 3, UpdatedAt: time.Unix(0, nanos).UTC(), DataTooLarge: tooLarge, Kind: kind}
		if nilData {
			st.Data = nil
		}
		if gap {
			st.Gap = &projection.GapInfo{NextVersion: version + 1, Buffered: tooLarge, Since: time.Unix(0, nanos/2)}
		}
		want, wantErr := json.Marshal(st)
		got, err := st.AppendJSON(nil)
		if wantErr != nil {
			if err == nil {
				t.Fatalf("json.Marshal: %v, AppendJSON: no error (%s)", wantErr, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("AppendJSON: %v, json.Marshal: %s", err, want)
		}
		if string(got) != string(want) {
			t.Fatalf("AppendJSON:   %s\njson.Marshal: %s", got, want)
		}
	})
}

func BenchmarkStateJSON(b *testing.B) {
	st := stateJSONCases[1]
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = st.AppendJSON(buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
