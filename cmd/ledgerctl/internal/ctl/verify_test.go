package ctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// cutStreamTail stops the NATS server, cuts the newest block file of
// stream to half its size, as a power loss does to writes not yet synced,
// and starts the server again on the same store.
func (e *env) cutStreamTail(stream string) {
	e.t.Helper()
	e.ns.Shutdown()
	blocks, err := filepath.Glob(filepath.Join(e.ns.StoreDir(), "jetstream", "*", "streams", stream, "msgs", "*.blk"))
	require.NoError(e.t, err)
	require.NotEmpty(e.t, blocks, "the stream's block files")
	index := func(p string) int { n, _ := strconv.Atoi(filepath.Base(p[:len(p)-len(".blk")])); return n }
	slices.SortFunc(blocks, func(a, b string) int { return index(a) - index(b) })
	last := blocks[len(blocks)-1]
	info, err := os.Stat(last)
	require.NoError(e.t, err)
	require.NoError(e.t, os.Truncate(last, info.Size()/2))
	e.ns.Restart(e.t)
}

// logVersions is the versions of a task's copies in LEDGER_LOG, in stream
// order.
func (e *env) logVersions(partition int, task string) []int64 {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, wire.StreamLog)
	require.NoError(e.t, err)
	var out []int64
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(e.subj.Log(partition, task)))
		if err != nil {
			return out
		}
		v, _ := strconv.ParseInt(m.Header.Get(wire.HeaderVersion), 10, 64)
		out = append(out, v)
		seq = m.Sequence + 1
	}
}

// projected is the version of a task's projection; -1 if it has none.
func (e *env) projected(task string) int64 {
	e.t.Helper()
	kv, err := e.js.KeyValue(context.Background(), wire.BucketTasks)
	require.NoError(e.t, err)
	entry, err := kv.Get(context.Background(), task)
	if err != nil {
		return -1
	}
	var st projection.State
	require.NoError(e.t, json.Unmarshal(entry.Value(), &st))
	return st.Version
}

// findings are the (kind, task) pairs of verify's -json output.
func findings(t *testing.T, r result) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, f := range r.jsonLines(t) {
		kind, _ := f["kind"].(string)
		who, _ := f["task"].(string)
		if kind == "consumer" {
			who = fmt.Sprint(f["stream"], "/", f["consumer"])
		}
		out[kind] = append(out[kind], who)
	}
	return out
}

// JetStream loses a projection's value and the tail of LEDGER_LOG while
// the ingest and the projector are down. ledgerctl verify names each loss
// and exits 1; a repair without its fold step puts the log back but leaves
// the projection missing; a full repair puts everything back from
// PostgreSQL, in version order, and verify is clean.
func TestVerifyFindsAndRepairPutsBackWhatJetStreamLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, in.Start(ctx))
	proj, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(t), Pool: e.db.Pool, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, proj.Start(ctx))

	l := e.acquire(2, "worker-a.1")
	const tasks, versions = 12, 3
	for k := range tasks {
		for v := int64(1); v <= versions; v++ {
			e.publish(event{partition: 2, task: fmt.Sprintf("t-%d", k), holder: l.Holder, generation: l.Generation,
				version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)})
		}
	}
	for k := range tasks {
		task := fmt.Sprintf("t-%d", k)
		require.Eventually(t, func() bool { return e.projected(task) == versions }, 20*time.Second, 20*time.Millisecond)
	}
	require.Equal(t, 0, e.run("verify", "-grace", "0").ok(t).code, "nothing is lost yet")
	proj.Stop()
	in.Stop()

	// The losses: a bucket value, and the tail of LEDGER_LOG's files.
	kv, err := e.js.KeyValue(ctx, wire.BucketTasks)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "t-0"))
	older, err := kv.Get(ctx, "t-1") // and t-1's newest write: its value is one version back
	require.NoError(t, err)
	var st projection.State
	require.NoError(t, json.Unmarshal(older.Value(), &st))
	st.Version--
	b, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "t-1", b)
	require.NoError(t, err)
	e.cutStreamTail(wire.StreamLog)
	var short []string
	for k := range tasks {
		task := fmt.Sprintf("t-%d", k)
		if n := len(e.logVersions(2, task)); n < versions {
			short = append(short, task)
		}
	}
	require.NotEmpty(t, short, "the cut lost copies")

	v := e.run("verify", "-grace", "0", "-json")
	require.Equal(t, 1, v.code, "verify exits 1 on a loss; stderr:\n%s", v.stderr)
	found := findings(t, v)
	require.Equal(t, []string{"t-0", "t-1"}, found["projection"], "the lost bucket value, the lost write")
	require.ElementsMatch(t, short, found["log"], "each task whose newest copy was lost")

	// Repair with its fold step switched off: the log comes back, the
	// projection does not, and verify still fails.
	e.run("repair", "-grace", "0", "-kinds", "log", "-json").ok(t)
	v = e.run("verify", "-grace", "0", "-json")
	require.Equal(t, 1, v.code)
	require.Equal(t, []string{"t-0", "t-1"}, findings(t, v)["projection"])
	require.Empty(t, findings(t, v)["log"])

	r := e.run("repair", "-grace", "0", "-json")
	require.Equal(t, 0, r.code, "stderr:\n%s\nstdout:\n%s", r.stderr, r.stdout)
	require.EqualValues(t, versions, e.projected("t-0"), "folded again from PostgreSQL")
	require.EqualValues(t, versions, e.projected("t-1"), "folded on from PostgreSQL")
	for k := range tasks {
		task := fmt.Sprintf("t-%d", k)
		require.Equal(t, []int64{1, 2, 3}, e.logVersions(2, task), "task %s: in version order, once each", task)
	}
	e.run("verify", "-grace", "0").ok(t)
}

// LEDGER_IN loses the writes that removed its decided messages: the server
// comes back with the stream's files as they were before the acks (a power
// loss within its sync interval), and the messages sit below the partition
// consumer's ack floor, where no consumer delivers them. ledgerctl verify
// names the consumer; repair leaves it alone, says what to do, and exits 1.
func TestVerifyFindsAConsumerAheadOfItsMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.run("streams", "apply").ok(t)
	l := e.acquire(1, "worker-a.1")
	for v := int64(1); v <= 30; v++ {
		e.publish(event{partition: 1, task: "t", holder: l.Holder, generation: l.Generation, version: v, typ: "step", payload: `{}`})
	}
	msgs := filepath.Join(t.TempDir(), "msgs")
	e.ns.Shutdown()
	dirs, err := filepath.Glob(filepath.Join(e.ns.StoreDir(), "jetstream", "*", "streams", wire.StreamIn, "msgs"))
	require.NoError(t, err)
	require.Len(t, dirs, 1)
	require.NoError(t, os.CopyFS(msgs, os.DirFS(dirs[0])), "the files before the acks")
	e.ns.Restart(t)

	// The partition's consumer keeps its state on disk, as the ingest's
	// did before they kept theirs in the server's memory (a restarted
	// server now has none of those, and the ingest makes them again from
	// the stream's first message): it takes and acks the 30 messages.
	cons, err := e.js.CreateOrUpdateConsumer(ctx, wire.StreamIn, jetstream.ConsumerConfig{Durable: "ingest-1-7",
		FilterSubject: "ledger.in.*.*.1.*", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	batch, err := cons.Fetch(30, jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	taken := 0
	for m := range batch.Messages() {
		require.NoError(t, m.DoubleAck(ctx))
		taken++
	}
	require.Equal(t, 30, taken)
	require.Eventually(t, func() bool {
		s, err := e.js.Stream(ctx, wire.StreamIn)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 20*time.Second, 20*time.Millisecond, "every message taken and removed")
	e.run("verify", "-grace", "0", "-kinds", "consumer").ok(t)

	e.ns.Shutdown()
	require.NoError(t, os.RemoveAll(dirs[0]))
	require.NoError(t, os.CopyFS(dirs[0], os.DirFS(msgs)))
	e.ns.Restart(t)
	v := e.run("verify", "-grace", "0", "-kinds", "consumer", "-json")
	require.Equal(t, 1, v.code, "stdout:\n%s\nstderr:\n%s", v.stdout, v.stderr)
	lines := v.jsonLines(t)
	require.Len(t, lines, 1)
	require.Equal(t, wire.StreamIn, lines[0]["stream"])
	require.Regexp(t, `^ingest-1-\d+$`, lines[0]["consumer"])
	require.Equal(t, "message_below_ack_floor", lines[0]["problem"])

	r := e.run("repair", "-grace", "0", "-kinds", "consumer", "-json")
	require.Equal(t, 1, r.code, "a consumer is left to the operator")
	rows := r.jsonLines(t)
	require.Len(t, rows, 1)
	require.Equal(t, "left alone", rows[0]["outcome"])
	require.Contains(t, rows[0]["action"], "restart the ingest")
}
