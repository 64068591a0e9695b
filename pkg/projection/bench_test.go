package projection

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// benchPayloads are small payloads of the kinds workers publish: progress
// objects that patch a few keys, a nested object, and a completion.
var benchPayloads = []json.RawMessage{
	json.RawMessage(`{"step":1,"progress":0.1,"note":"started"}`),
	json.RawMessage(`{"step":2,"progress":0.5}`),
	json.RawMessage(`{"progress":0.9,"detail":{"rows":1200,"ok":true}}`),
	json.RawMessage(`{"step":3,"progress":1,"note":null,"result":"s3://bucket/key"}`),
}

var benchTypes = []string{"started", "running", "running", "completed"}

// benchApply offers in-order events round-robin over tasks, the projector's
// steady state, and reports events/s.
func benchApply(b *testing.B, r Reducer, tasks int) {
	e, err := New(Config{Reducer: r})
	require.NoError(b, err)
	ids := make([]string, tasks)
	versions := make([]int64, tasks)
	for k := range ids {
		ids[k] = fmt.Sprintf("task-%06d", k)
		require.NoError(b, e.Load(State{Task: ids[k]}))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % tasks
		versions[k]++
		v := versions[k]
		p := int(v-1) % len(benchPayloads)
		res, err := e.Offer(Event{Task: ids[k], Partition: 3, Version: v, Seq: int64(i + 1), Type: benchTypes[p], Payload: benchPayloads[p]})
		if err != nil || res.Outcome != OutcomeApplied {
			b.Fatalf("offer %s v%d: %v %v", ids[k], v, res.Outcome, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// trivialReducer keeps only the status, to measure the ordering engine alone.
var trivialReducer = ReducerFunc(func(s State, ev Event) (State, error) {
	s.Status = ev.Type
	return s, nil
})

func BenchmarkEngineApplyMergeReducer(b *testing.B) {
	for _, tasks := range []int{1, 1000, 100_000} {
		b.Run(fmt.Sprintf("tasks=%d", tasks), func(b *testing.B) { benchApply(b, MergeReducer{}, tasks) })
	}
}

func BenchmarkEngineApplyTrivialReducer(b *testing.B) {
	for _, tasks := range []int{1, 1000, 100_000} {
		b.Run(fmt.Sprintf("tasks=%d", tasks), func(b *testing.B) { benchApply(b, trivialReducer, tasks) })
	}
}

// BenchmarkEngineReorder offers each task's versions in pairs swapped
// (2,1,4,3,…), so half the events go through the buffer.
func BenchmarkEngineReorder(b *testing.B) {
	const tasks = 1000
	e, err := New(Config{})
	require.NoError(b, err)
	ids := make([]string, tasks)
	for k := range ids {
		ids[k] = fmt.Sprintf("task-%06d", k)
		require.NoError(b, e.Load(State{Task: ids[k]}))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % tasks
		n := int64(i/tasks) + 1 // this task's n-th event
		v := n + 1              // odd n offers n+1, even n offers n-1
		if n%2 == 0 {
			v = n - 1
		}
		p := int(v-1) % len(benchPayloads)
		if _, err := e.Offer(Event{Task: ids[k], Version: v, Seq: int64(i + 1), Type: benchTypes[p], Payload: benchPayloads[p]}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkMergePatch(b *testing.B) {
	target := json.RawMessage(`{"step":2,"progress":0.5,"note":"started","detail":{"rows":1000,"ok":false}}`)
	patch := json.RawMessage(`{"progress":0.9,"detail":{"rows":1200,"ok":true}}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := MergePatch(target, patch); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFingerprint(b *testing.B) {
	c := newCanonicalizer()
	payload := []byte(`{"step":3,"progress":1,"note":null,"result":"s3://bucket/key"}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := c.fingerprint("completed", payload); err != nil {
			b.Fatal(err)
		}
	}
}
