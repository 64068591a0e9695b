package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// bigPayload is an object of one member, about n bytes long.
func bigPayload(key string, n int) string {
	return fmt.Sprintf(`{%q:%q}`, key, strings.Repeat(key[:1], n))
}

// Five valid 250 KB events merge past a bucket value (1 MiB). The task is
// stored with data null and data_too_large, its version, status and seq
// exact, and the task after it is projected all the same. A rebuild from
// PostgreSQL stores the same; a projector that loads the value folds the data
// again from PostgreSQL, and once the data shrinks it is stored again.
func TestProjectionTooLargeForAValueIsStoredWithoutItsData(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var big []string
	for k := range 5 {
		big = append(big, bigPayload(fmt.Sprintf("%c%d", 'a'+k, k), 250_000))
	}
	evs := e.commit(2, "big", repeat("chunk", 5), big)
	other := e.commit(5, "other", []string{"done"}, []string{`{"ok":true}`})
	reg := prometheus.NewRegistry()
	p := e.startWith(projector.Config{}, reg)

	for _, c := range evs {
		e.publishLog(c)
	}
	waitMetric(t, reg, "ledger_projector_events_total", 5, "outcome", "applied")
	e.publishLog(other[0]) // after the big task's turn: it would wait behind a wedged write
	e.waitState("other", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })

	st := e.waitState("big", 10*time.Second, func(s projection.State) bool { return s.Version == 5 })
	_, data := fold(t, evs)
	require.Greater(t, len(data), 1<<20)
	v := e.value("big")
	require.Nil(t, v["data"], "data is null")
	require.EqualValues(t, len(data), v["data_too_large"], "data_too_large is the size of the data")
	require.Equal(t, "chunk", st.Status)
	require.Equal(t, evs[4].seq, st.Seq)
	require.GreaterOrEqual(t, metric(t, reg, "ledger_projector_values_without_data_total"), 1.0)

	// Later events still fold into the true data.
	evs = append(evs, e.commit(2, "big", []string{"more"}, []string{`{"f5":"x"}`})...)
	e.publishLog(evs[5])
	e.waitState("big", 10*time.Second, func(s projection.State) bool { return s.Version == 6 })
	_, data = fold(t, evs)
	require.EqualValues(t, len(data), e.value("big")["data_too_large"])
	p.Stop()

	// A rebuild from PostgreSQL comes to the same value.
	live := e.value("big")
	rebuilt := e.newProjector(projector.Config{}, nil)
	require.NoError(t, rebuilt.Rebuild(context.Background(), nil))
	v = e.value("big")
	for _, k := range []string{"version", "status", "seq", "data", "data_too_large"} {
		require.Equal(t, live[k], v[k], k)
	}

	// A fresh projector has only the size in the bucket: it folds the data
	// again from PostgreSQL, and stores it once it fits again.
	e.start(projector.Config{})
	evs = append(evs, e.commit(2, "big", []string{"trimmed"}, []string{`{"b1":null,"c2":null,"d3":null}`})...)
	e.publishLog(evs[6])
	st = e.waitState("big", 10*time.Second, func(s projection.State) bool { return s.Version == 7 })
	status, data := fold(t, evs)
	require.Less(t, len(data), 1<<20)
	require.Equal(t, status, st.Status)
	jsonEq(t, data, st.Data, "the data is stored again, the fold of all seven versions")
	require.NotContains(t, e.value("big"), "data_too_large")
}

// The bucket has a size limit. A task the full bucket refuses is held: the
// other tasks keep flowing, the held one is written once there is room, and
// its log message stays unacked meanwhile, so that a projector that starts
// after this one died still projects it.
func TestFullBucketHoldsTheTaskItRefusesAndOthersFlow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const limit = 48 << 10
	filler := e.commit(1, "filler", []string{"x"}, []string{bigPayload("f", 20_000)})
	big1 := e.commit(2, "big-1", []string{"x"}, []string{bigPayload("b", 30_000)})
	small := e.commit(3, "small", []string{"x", "y"}, []string{`{"s":1}`, `{"s":2}`})
	big2 := e.commit(4, "big-2", []string{"x"}, []string{bigPayload("c", 30_000)})
	reg := prometheus.NewRegistry()
	p := e.startWith(projector.Config{TasksMaxBytes: limit, RetryMax: 200 * time.Millisecond}, reg)

	e.publishLog(filler[0])
	e.waitState("filler", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	e.publishLog(big1[0])
	waitMetric(t, reg, "ledger_projector_events_total", 2, "outcome", "applied")
	e.publishLog(small[0]) // after big-1's turn: it would wait behind a wedged write
	e.waitState("small", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	require.GreaterOrEqual(t, metric(t, reg, "ledger_projector_kv_refused_total"), 1.0)
	require.EqualValues(t, 1, metric(t, reg, "ledger_projector_held_tasks"))
	_, ok := e.state("big-1")
	require.False(t, ok, "big-1 is held")

	// An operator makes room: the held task is written by itself.
	grow(t, e.js, 64<<10) // room for big-1, not for big-2 as well
	st := e.waitState("big-1", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	require.Equal(t, big1[0].seq, st.Seq)
	waitMetricBelow(t, reg, "ledger_projector_held_tasks", 1)

	// Full again: big-2 is held when this projector dies; its message was
	// not acked, so the next one projects it.
	e.publishLog(big2[0])
	e.publishLog(small[1])
	e.waitState("small", 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
	waitMetric(t, reg, "ledger_projector_held_tasks", 1)
	p.Stop()
	e.start(projector.Config{TasksMaxBytes: -1})
	st = e.waitState("big-2", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	_, data := fold(t, big2)
	jsonEq(t, data, st.Data, "big-2")
}

// grow raises the max_bytes of ledger_tasks, as an operator would.
func grow(t *testing.T, js jetstream.JetStream, maxBytes int64) {
	t.Helper()
	cfg, err := streams.Bucket(wire.BucketTasks, streams.Options{})
	require.NoError(t, err)
	cfg.MaxBytes = maxBytes
	_, err = js.UpdateKeyValue(context.Background(), cfg)
	require.NoError(t, err)
}

// waitMetricBelow waits until a metric of reg is below want.
func waitMetricBelow(t testing.TB, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, reg, name) >= want {
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed at %v", name, metric(t, reg, name))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// While the bucket cannot be read, an event of a task not yet loaded is
// redelivered, not acked and lost; the rest of the batch is applied once,
// and so is that event when the bucket is back.
func TestEventWhoseProjectionCannotBeReadIsRedelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.commit(1, "a", []string{"x", "y"}, []string{`{"a":1}`, `{"a":2}`})
	b := e.commit(2, "b", []string{"x"}, []string{`{"b":1}`})
	reg := prometheus.NewRegistry()
	e.startWith(projector.Config{RetryMax: 200 * time.Millisecond}, reg)
	e.publishLog(a[0])
	e.waitState("a", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })

	ctx := context.Background()
	require.NoError(t, e.js.DeleteKeyValue(ctx, wire.BucketTasks))
	e.publishLog(b[0])
	waitMetric(t, reg, "ledger_projector_load_failures_total", 1)
	e.publishLog(a[1]) // a is loaded: its write waits for the bucket
	_, err := streams.ApplyBucket(ctx, e.js, wire.BucketTasks, streams.Options{})
	require.NoError(t, err)

	st := e.waitState("b", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	jsonEq(t, json.RawMessage(b[0].payload), st.Data, "b")
	st = e.waitState("a", 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
	_, data := fold(t, a)
	jsonEq(t, data, st.Data, "a")
	require.EqualValues(t, 3, metric(t, reg, "ledger_projector_events_total", "outcome", "applied"),
		"every event applied exactly once")
}

// A value deleted from the bucket behind the projector's back is written
// again: its compare-and-set goes on top of the delete marker.
func TestDeletedValueIsWrittenAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs := e.commit(1, "d", []string{"x", "y"}, []string{`{"a":1}`, `{"b":2}`})
	e.start(projector.Config{RetryMax: 200 * time.Millisecond})
	e.publishLog(evs[0])
	e.waitState("d", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	require.NoError(t, e.bucket().Delete(context.Background(), "d"))
	e.publishLog(evs[1])
	st := e.waitState("d", 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
	_, data := fold(t, evs)
	jsonEq(t, data, st.Data, "d")
}

// A value in the bucket that is not a projection of its task is replaced by
// the task's fold from PostgreSQL, rather than failing every event of it.
func TestStoredValueThatIsNotAProjectionIsFoldedAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs := e.commit(1, "c", []string{"x", "y"}, []string{`{"a":1}`, `{"b":2}`})
	_, err := streams.ApplyBucket(context.Background(), e.js, wire.BucketTasks, streams.Options{})
	require.NoError(t, err)
	_, err = e.bucket().Put(context.Background(), "c", []byte(`{"task":"c","version":-7}`))
	require.NoError(t, err)
	e.start(projector.Config{RetryMax: 200 * time.Millisecond})
	e.publishLog(evs[1])
	st := e.waitState("c", 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
	status, data := fold(t, evs)
	require.Equal(t, status, st.Status)
	jsonEq(t, data, st.Data, "c")
}
