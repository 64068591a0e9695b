package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// The log arrives out of order, duplicated, and without version 2, which
// only PostgreSQL has: the projection waits with its gap showing, re-fetches
// version 2 after the gap timeout, and ends right.
func TestOutOfOrderDuplicatedAndMissingVersionsEndRight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs := e.commit(3, "report-7", []string{"running", "progress", "progress", "completed"},
		[]string{`{"step":1,"owner":"a"}`, `{"step":2}`, `{"step":3,"owner":null}`, `{"result":"ok"}`})
	e.start(projector.Config{Engine: projection.Config{GapTimeout: 700 * time.Millisecond}})

	e.publishLog(evs[2]) // v3 first
	e.publishLog(evs[0]) // then v1
	e.publishLog(evs[0]) // v1 again
	e.publishLog(evs[3]) // v4; v2 never comes on the log

	st := e.waitState("report-7", 5*time.Second, func(s projection.State) bool { return s.Version == 1 && s.Gap != nil && s.Gap.Buffered == 2 })
	require.EqualValues(t, 2, st.Gap.NextVersion, "the gap shows the version it waits for")
	require.Equal(t, "running", st.Status)
	require.False(t, st.Gap.Since.IsZero())

	st = e.waitState("report-7", 10*time.Second, func(s projection.State) bool { return s.Version == 4 })
	require.Nil(t, st.Gap, "the gap clears after the re-fetch")
	status, data := fold(t, evs)
	require.Equal(t, status, st.Status)
	jsonEq(t, data, st.Data, "data is the merge of the payloads in version order")
	require.Equal(t, evs[3].seq, st.Seq)
	require.Equal(t, 3, st.Partition)
}

// A projector dies while a task waits for a missing version; the next one
// finishes the task from PostgreSQL.
func TestProjectorKilledDuringAGapRestartsRight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs := e.commit(1, "t-gap", []string{"a", "b", "c"}, []string{`{"a":1}`, `{"b":2}`, `{"c":3}`})
	first := e.start(projector.Config{Engine: projection.Config{GapTimeout: time.Hour}})
	e.publishLog(evs[0])
	e.publishLog(evs[2]) // v2 missing
	e.waitState("t-gap", 5*time.Second, func(s projection.State) bool { return s.Gap != nil && s.Version == 1 })
	first.Stop() // killed with the gap open; v3 was acked once the gap was stored

	e.start(projector.Config{Engine: projection.Config{GapTimeout: 300 * time.Millisecond}})
	st := e.waitState("t-gap", 10*time.Second, func(s projection.State) bool { return s.Version == 3 && s.Gap == nil })
	status, data := fold(t, evs)
	require.Equal(t, status, st.Status)
	jsonEq(t, data, st.Data, "state after restart")
}

// A reader watching the bucket sees each task's version only ever rise.
func TestWatchersSeeVersionsOnlyRise(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kvw := e.start(projector.Config{Engine: projection.Config{GapTimeout: 200 * time.Millisecond}})
	_ = kvw
	w, err := e.bucket().WatchAll(context.Background())
	require.NoError(t, err)
	defer w.Stop()

	const tasks, versions = 20, 15
	var all [][]committed
	for i := range tasks {
		task := fmt.Sprintf("w-%d", i)
		all = append(all, e.commit(i%16, task, repeat("step", versions), payloads(versions)))
	}
	// Publish out of order per task: pairs swapped, some copies repeated, one
	// version left to the re-fetch.
	for _, evs := range all {
		for v := 0; v+1 < len(evs); v += 2 {
			e.publishLog(evs[v+1])
			if v != 6 {
				e.publishLog(evs[v])
			}
			if v%4 == 0 {
				e.publishLog(evs[v+1])
			}
		}
		e.publishLog(evs[len(evs)-1])
	}

	last := map[string]int64{}
	done := 0
	timeout := time.After(20 * time.Second)
	for done < tasks {
		select {
		case entry := <-w.Updates():
			if entry == nil {
				continue
			}
			var st projection.State
			require.NoError(t, json.Unmarshal(entry.Value(), &st))
			require.GreaterOrEqual(t, st.Version, last[st.Task], "task %s went back from %d to %d", st.Task, last[st.Task], st.Version)
			if st.Version == versions && last[st.Task] != versions {
				done++
			}
			last[st.Task] = st.Version
		case <-timeout:
			t.Fatalf("only %d of %d tasks reached version %d: %v", done, tasks, versions, last)
		}
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func payloads(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"step":%d,"k%d":true}`, i+1, i%3)
	}
	return out
}

// Two projectors on disjoint partition sets split the log: each projects
// only its own partitions' tasks, and together they project every task.
func TestProjectorsOnDisjointPartitionsSplitTheLog(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	low, err := projector.ParsePartitions("0-7", 16)
	require.NoError(t, err)
	high, err := projector.ParsePartitions("8-15", 16)
	require.NoError(t, err)
	e.start(projector.Config{Partitions: low})
	e.start(projector.Config{Partitions: high})

	var tasks []string
	for p := range 16 {
		task := fmt.Sprintf("split-%d", p)
		tasks = append(tasks, task)
		for _, c := range e.commit(p, task, []string{"a", "b"}, []string{`{"x":1}`, `{"y":2}`}) {
			e.publishLog(c)
		}
	}
	for p, task := range tasks {
		st := e.waitState(task, 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
		require.Equal(t, p, st.Partition)
	}
	for _, durable := range []string{"projector-0-7", "projector-8-15"} {
		c, err := e.js.Consumer(context.Background(), "LEDGER_LOG", durable)
		require.NoError(t, err, durable)
		info, err := c.Info(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 16, info.Delivered.Consumer, "%s saw only its 8 partitions' 16 events", durable)
	}
}

// A message on the log that is not a contract log copy is terminated and
// logged, never applied, and the copies after it are projected: a version
// 0, headers that name another task than the subject, and a copy without
// its task, partition, holder and generation headers.
func TestUndecodableLogCopyIsTerminatedAndTheLogFlows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	advisories, err := e.nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.LEDGER_LOG.projector")
	require.NoError(t, err)
	logs := e.startLogged()

	bad := e.commit(1, "bad", []string{"x"}, []string{`{"a":1}`})[0]
	good := e.commit(2, "good", []string{"x"}, []string{`{"b":2}`})[0]
	terminated := map[uint64]bool{}
	for _, spoil := range []func(nats.Header){
		func(h nats.Header) { h.Set(wire.HeaderVersion, "0") },
		func(h nats.Header) { h.Set(wire.HeaderTask, "good") },
		func(h nats.Header) {
			for _, name := range []string{wire.HeaderTask, wire.HeaderPartition, wire.HeaderHolder, wire.HeaderGeneration} {
				h.Del(name)
			}
		},
	} {
		m := e.subj.LogMsg(bad.logCopy())
		m.Header.Set(wire.HeaderMsgID, ledgertest.NewID()) // past the stream's dedup
		spoil(m.Header)
		ack, err := e.js.PublishMsg(ctx, m)
		require.NoError(t, err)
		terminated[ack.Sequence] = false
	}
	require.Len(t, terminated, 3)
	e.publishLog(good)

	st := e.waitState("good", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	jsonEq(t, json.RawMessage(good.payload), st.Data, "good")
	for range terminated {
		m, err := advisories.NextMsg(10 * time.Second)
		require.NoError(t, err, "a terminated advisory for each undecodable copy")
		var adv struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		require.NoError(t, json.Unmarshal(m.Data, &adv))
		seen, ok := terminated[adv.StreamSeq]
		require.True(t, ok && !seen, "terminated stream seq %d is not one of the undecodable copies %v", adv.StreamSeq, terminated)
		terminated[adv.StreamSeq] = true
	}
	_, ok := e.state("bad")
	require.False(t, ok, "an undecodable copy is never applied")
	require.Equal(t, len(terminated), logs.count("undecodable message on the committed log; terminated"))
	cons, err := e.js.Consumer(ctx, wire.StreamLog, "projector")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumRedelivered == 0
	}, 10*time.Second, 10*time.Millisecond, "every copy is settled at its first delivery")
}

// The first event of a new task is applied once its empty projection is
// loaded, and nothing says otherwise: no warning that it will be read
// again (there were thousands a run), and no redelivery.
func TestNewTasksFirstEventIsAppliedWithoutAWarning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	logs := e.startLogged()
	for _, c := range e.commit(3, "fresh", []string{"created", "running"}, []string{`{"a":1}`, `{"b":2}`}) {
		e.publishLog(c)
	}
	e.waitState("fresh", 10*time.Second, func(st projection.State) bool { return st.Version == 2 })
	require.Zero(t, logs.count("event not applied; it will be read again"))
}
