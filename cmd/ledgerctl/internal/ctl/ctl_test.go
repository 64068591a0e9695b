package ctl_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/ctl"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

func TestMigrateCreatesSchemaOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmpty(t)

	r := run(t, "-database-url", url, "migrate", "-check")
	require.Equal(t, 1, r.code, "an empty database is not current; stderr: %s", r.stderr)

	r = run(t, "-database-url", url, "migrate").ok(t)
	assert.Contains(t, r.stdout, "applied migrations")
	r = run(t, "migrate", "-database-url", url).ok(t)
	assert.Contains(t, r.stdout, "already current", "running it twice is fine")
	r = run(t, "migrate", "-check", "-json", "-database-url", url).ok(t)
	assert.Equal(t, true, r.jsonLines(t)[0]["current"])

	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var tables int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_class WHERE relnamespace = 'ledger'::regnamespace AND relkind IN ('r', 'p') AND NOT relispartition`).Scan(&tables))
	assert.Equal(t, 16, tables, "events (partitioned), heads, event_ids, horizon, event_partitions, partitioning, leases, lease_grants, rejections, ingest_claims, ingest_members, partition_controls, lease_actions, fence_modes, partition_ranges, quota_buckets")
}

func TestStreamsApplyCreatesTheStreams(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	js := ns.JetStream(t)

	r := run(t, "-nats-url", ns.URL(), "streams", "apply", "-replicas", "1").ok(t)
	for _, name := range []string{wire.StreamIn, wire.StreamLog, wire.StreamDLQ} {
		assert.Contains(t, r.stdout, name)
		s, err := js.Stream(context.Background(), name)
		require.NoError(t, err, name)
		assert.Equal(t, 1, s.CachedInfo().Config.Replicas)
	}
	run(t, "-nats-url", ns.URL(), "streams", "apply").ok(t) // idempotent

	// Another prefix moves the subjects, not the stream names.
	r = run(t, "-nats-url", ns.URL(), "-prefix", "acme", "streams", "apply", "-json").ok(t)
	lines := r.jsonLines(t)
	require.Len(t, lines, 7, "three streams and four buckets")
	assert.Equal(t, wire.StreamIn, lines[0]["stream"])
	assert.Equal(t, []any{"acme.in.>"}, lines[0]["subjects"])
	assert.Equal(t, "KV_"+wire.BucketTasks, lines[3]["stream"])

	// A bucket's size, as the projector's flag gives it.
	r = run(t, "-nats-url", ns.URL(), "streams", "apply", "-tasks-max-bytes", "1048576", "-json").ok(t)
	assert.EqualValues(t, 1<<20, r.jsonLines(t)[3]["max_bytes"])
	kv, err := js.KeyValue(context.Background(), wire.BucketTasks)
	require.NoError(t, err)
	st, err := kv.Status(context.Background())
	require.NoError(t, err)
	assert.EqualValues(t, 1<<20, st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.MaxBytes)
	r = run(t, "-nats-url", ns.URL(), "streams", "list", "-json").ok(t)
	require.Len(t, r.jsonLines(t), 7)
}

// streams apply -principals gives each principal an inbox of its own in
// place of LEDGER_IN. It refuses while LEDGER_IN holds an event (that event
// waits for its verdict) and deletes it once empty; applied again without
// the list, LEDGER_IN does not come back, and the inboxes are listed.
func TestStreamsApplyGivesPrincipalsInboxesOfTheirOwn(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	js := ns.JetStream(t)
	ctx := context.Background()
	run(t, "-nats-url", ns.URL(), "streams", "apply").ok(t)
	_, err := js.Publish(ctx, "ledger.in.reports.a.1.report-1", nil)
	require.NoError(t, err)
	r := run(t, "-nats-url", ns.URL(), "streams", "apply", "-principals", "reports,billing")
	require.NotEqual(t, 0, r.code)
	assert.Contains(t, r.stderr, "LEDGER_IN holds 1 events without a verdict")
	in, err := js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	require.NoError(t, in.Purge(ctx))

	run(t, "-nats-url", ns.URL(), "streams", "apply", "-principals", "reports,billing", "-inbox-max-bytes", "1048576").ok(t)
	run(t, "-nats-url", ns.URL(), "streams", "apply").ok(t)
	_, err = js.Stream(ctx, wire.StreamIn)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	lines := run(t, "-nats-url", ns.URL(), "streams", "list", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 8, "two inboxes, the log, the dead letters and four buckets")
	assert.Equal(t, "LEDGER_IN_billing", lines[0]["stream"])
	assert.Equal(t, "LEDGER_IN_reports", lines[1]["stream"])
	assert.EqualValues(t, 1<<20, lines[1]["max_bytes"])
	ack, err := js.Publish(ctx, "ledger.in.reports.a.1.report-1", nil)
	require.NoError(t, err)
	assert.Equal(t, "LEDGER_IN_reports", ack.Stream)
}

// An inbox is made with the partition subjects the ingest gives it, since
// in an authenticated deployment the ingest may not update it: from
// -partitions, else from the inboxes (or LEDGER_IN) that exist.
// Switch: leave out streams.PartitionsOf; billing's inbox gets the
// catch-all subject.
func TestStreamsApplyGivesInboxesThePartitionSubjects(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	js := ns.JetStream(t)
	ctx := context.Background()
	subjects := func(principal string) []string {
		st, err := js.Stream(ctx, wire.InboxStream(principal))
		require.NoError(t, err)
		return st.CachedInfo().Config.Subjects
	}
	run(t, "-nats-url", ns.URL(), "streams", "apply", "-principals", "reports", "-partitions", "2").ok(t)
	require.ElementsMatch(t, []string{"ledger.in.reports.*.0.*", "ledger.in.reports.*.0", "ledger.in.reports.*.1.*",
		"ledger.in.reports.*.1"}, subjects("reports"))
	run(t, "-nats-url", ns.URL(), "streams", "apply", "-principals", "reports,billing").ok(t)
	require.ElementsMatch(t, []string{"ledger.in.billing.*.0.*", "ledger.in.billing.*.0", "ledger.in.billing.*.1.*",
		"ledger.in.billing.*.1"}, subjects("billing"))
	require.Len(t, subjects("reports"), 4, "kept")
}

func TestLeasesListHolderGenerationAndTimeLeft(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = store.Acquire(ctx, 3, "worker-a.1", time.Minute)
	require.NoError(t, err)
	_, err = store.Acquire(ctx, 5, "worker-b.1", time.Second)
	require.NoError(t, err)
	ledgertest.ExpireLease(t, db.Pool, 5)

	r := run(t, "-database-url", db.URL, "leases", "-json").ok(t)
	lines := r.jsonLines(t)
	require.Len(t, lines, 2)
	valid, expired := lines[0], lines[1]
	assert.Equal(t, float64(3), valid["partition"])
	assert.Equal(t, "worker-a.1", valid["holder"])
	assert.Equal(t, float64(1), valid["generation"])
	assert.Equal(t, true, valid["valid"])
	assert.Greater(t, valid["time_left_ms"], float64(0))
	assert.LessOrEqual(t, valid["time_left_ms"], float64(60000))
	assert.Equal(t, float64(60000), valid["ttl_ms"])
	assert.Equal(t, false, expired["valid"])
	assert.LessOrEqual(t, expired["time_left_ms"], float64(0))

	r = run(t, "-database-url", db.URL, "leases").ok(t)
	assert.Contains(t, r.stdout, "TIME LEFT")
	assert.Contains(t, r.stdout, "worker-a.1")
	assert.Contains(t, r.stdout, "expired")

	r = run(t, "-database-url", db.URL, "leases", "-partition", "3", "-json").ok(t)
	assert.Len(t, r.jsonLines(t), 1)
}

func TestTaskShowsEventsRejectionsAndProjection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	l := e.acquire(2, "worker-a.1")
	ev := func(version int64, holder, typ, payload string) fence.Event {
		return fence.Event{ID: newID(), Partition: 2, Task: "report-7", Version: version, Type: typ,
			Payload: []byte(payload), Holder: holder, Generation: l.Generation}
	}
	res, err := e.store.Append(ctx, []fence.Event{
		ev(1, "worker-a.1", "started", `{"step": 1}`),
		ev(2, "worker-a.1", "running", `{"step":2,"pct":50}`),
		ev(3, "worker-a.9", "running", `{"step":3}`), // not the holder: stale
	})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictStale, res[2].Verdict)

	r := e.run("task", "report-7").ok(t)
	assert.Contains(t, r.stdout, "head version 2")
	assert.Contains(t, r.stdout, "owned by principal worker-a")
	assert.Contains(t, r.stdout, `{"step":1}`)
	assert.Contains(t, r.stdout, "running")
	assert.Contains(t, r.stdout, "not_holder")
	assert.Contains(t, r.stdout, "no projection yet")

	kv, err := e.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.BucketTasks})
	require.NoError(t, err)
	r = e.run("task", "report-7").ok(t)
	assert.Contains(t, r.stdout, "no projection yet", "the bucket exists, the key does not")
	_, err = kv.Put(ctx, "report-7", []byte(`{"task":"report-7","partition":2,"version":2,"status":"running","data":{"step":2,"pct":50},"seq":2,"gap":null}`))
	require.NoError(t, err)

	r = e.run("task", "report-7").ok(t)
	assert.Contains(t, r.stdout, "revision 1")
	assert.Contains(t, r.stdout, `"status": "running"`)

	r = e.run("task", "report-7", "-json").ok(t) // flags after the id work too
	lines := r.jsonLines(t)
	require.Len(t, lines, 4)
	kinds := []any{lines[0]["kind"], lines[1]["kind"], lines[2]["kind"], lines[3]["kind"]}
	assert.Equal(t, []any{"event", "event", "rejection", "projection"}, kinds)
	assert.Equal(t, float64(2), lines[1]["version"])
	assert.Equal(t, "not_holder", lines[2]["reason"])
	assert.Equal(t, "running", lines[3]["value"].(map[string]any)["status"])

	r = e.run("task", "unknown-task").ok(t)
	assert.Contains(t, r.stdout, "no committed events")
}

// staleDeadLetter produces, through the real ingest, the dead letter of a
// write by a holder whose expired lease was taken over.
func staleDeadLetter(t *testing.T, e *env, partition int, task string) {
	t.Helper()
	old := e.acquire(partition, "worker-a.1")
	e.expire(partition)
	next := e.acquire(partition, "worker-b.1")
	require.Equal(t, old.Generation+1, next.Generation)
	e.publish(event{partition: partition, task: task, holder: "worker-a.1", generation: old.Generation,
		version: 1, typ: "started", payload: `{"late":true}`})
	e.waitMsgs(wire.StreamDLQ, 1)
}

func TestDLQListShowsAStaleWritersDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	staleDeadLetter(t, e, 1, "job-1")

	r := e.run("dlq", "list").ok(t)
	assert.Contains(t, r.stdout, "ledger.dlq.1.job-1")
	assert.Contains(t, r.stdout, "stale")
	assert.Contains(t, r.stdout, "superseded")
	assert.Contains(t, r.stdout, "worker-b.1/2", "the current holder and generation")

	r = e.run("dlq", "list", "-json").ok(t)
	lines := r.jsonLines(t)
	require.Len(t, lines, 1)
	d := lines[0]
	assert.Equal(t, "stale", d["verdict"])
	assert.Equal(t, "superseded", d["reason"])
	assert.Equal(t, "job-1", d["task"])
	assert.Equal(t, float64(1), d["partition"])
	assert.Equal(t, float64(1), d["generation"])
	assert.Equal(t, float64(2), d["current_generation"])
	assert.Equal(t, map[string]any{"late": true}, d["payload"])
	assert.NotEmpty(t, d["rejected_at"])
	assert.True(t, wire.ValidEventID(d["event_id"].(string)))

	for _, c := range []struct {
		filter []string
		want   int
	}{
		{[]string{"-verdict", "stale"}, 1},
		{[]string{"-verdict", "gap,conflict"}, 0},
		{[]string{"-reason", "superseded"}, 1},
		{[]string{"-task", "job-1"}, 1},
		{[]string{"-task", "job-2"}, 0},
		{[]string{"-partition", "1"}, 1},
		{[]string{"-partition", "0"}, 0},
		{[]string{"-limit", "1"}, 1},
	} {
		r := e.run(append([]string{"dlq", "list", "-json"}, c.filter...)...).ok(t)
		assert.Len(t, r.jsonLines(t), c.want, "filter %v", c.filter)
	}

	// Listing consumed nothing.
	r = e.run("dlq", "list", "-json").ok(t)
	assert.Len(t, r.jsonLines(t), 1)
}

func TestDLQReplayOfAGapAfterItsPredecessorsArrived(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{GapWindow: 200 * time.Millisecond})
	l := e.acquire(4, "worker-a.1")
	ev := func(v int64) event {
		return event{partition: 4, task: "gappy", holder: "worker-a.1", generation: l.Generation, version: v,
			typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	e.publish(ev(3))
	e.waitMsgs(wire.StreamDLQ, 1)
	lines := e.run("dlq", "list", "-json", "-verdict", "gap").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	seq := fmt.Sprint(lines[0]["stream_seq"])
	eventID := fmt.Sprint(lines[0]["event_id"])
	assert.Equal(t, "gap_timeout", lines[0]["reason"])
	require.Len(t, e.run("dlq", "list", "-json", "-id", eventID).ok(t).jsonLines(t), 1, "-id selects by event id")
	require.Empty(t, e.run("dlq", "list", "-json", "-id", "01JD0000000000000000000001").ok(t).jsonLines(t))

	// Within LEDGER_IN's duplicate window the same Nats-Msg-Id is dropped:
	// that is reported, and is a failure.
	r := e.run("dlq", "replay", "-seq", seq, "-wait", "0")
	require.Equal(t, 1, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "deduplicated")
	assert.Contains(t, r.stderr, "duplicate window (2m0s)")
	assert.Contains(t, r.stderr, "-new-id")

	r = e.run("dlq", "replay", "-seq", seq, "-new-id", "-dry-run").ok(t)
	assert.Contains(t, r.stdout, "dry_run")
	assert.Contains(t, r.stdout, "ledger.in.worker-a.1.4.gappy")

	e.publish(ev(1), ev(2))
	e.waitCommitted("gappy", 2)

	// By event id this time: a precise choice, so no -all.
	r = e.run("dlq", "replay", "-id", eventID, "-new-id", "-json").ok(t)
	got := r.jsonLines(t)
	require.Len(t, got, 1)
	assert.Equal(t, "submitted", got[0]["result"])
	assert.Equal(t, "committed", got[0]["verdict"], "the fresh verdict, from the receipt")
	assert.NotEqual(t, got[0]["event_id"], got[0]["new_event_id"])
	e.waitCommitted("gappy", 3)

	var payload string
	require.NoError(t, e.db.Pool.QueryRow(context.Background(),
		`SELECT payload::text FROM ledger.events WHERE task_id = 'gappy' AND version = 3`).Scan(&payload))
	assert.JSONEq(t, `{"v":3}`, payload, "the body is kept")
}

func TestDLQReplayOfAStaleWriteIsStaleAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	staleDeadLetter(t, e, 6, "job-6")

	r := e.run("dlq", "replay", "-verdict", "stale", "-all", "-new-id").ok(t)
	assert.Contains(t, r.stdout, "stale/superseded", "the generation is kept, so the verdict is the same")
	e.waitMsgs(wire.StreamDLQ, 2)
}

func TestDLQReplayRefusesWhatItCannotReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	m := e.msg(event{partition: 0, task: "x", holder: "worker-a.1", generation: 1, version: 1, typ: "t"})
	m.Subject = "ledger.in.worker-a.1.0." + strings.Repeat("x", 129) // not a task id: the subject is unusable
	e.publishMsg(m)
	e.waitMsgs(wire.StreamDLQ, 1)

	lines := e.run("dlq", "list", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "ledger.dlq.invalid", lines[0]["subject"])
	assert.Equal(t, "bad_subject", lines[0]["reason"])

	r := e.run("dlq", "replay", "-seq", "1")
	require.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "cannot be replayed")
	assert.Contains(t, r.stderr, "unusable")

	r = e.run("dlq", "replay", "-seq", "99")
	require.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "not found")

	// A letter whose body was cut to fit the stream would replay a
	// different event: it is refused, and says so.
	big := e.msg(event{partition: 0, task: "big", holder: "worker-a.1", generation: 1, version: 1, typ: "bad type!"})
	big.Data = make([]byte, 1<<20-400) // fits LEDGER_IN, not with the dead letter's headers
	e.publishMsg(big)
	e.waitMsgs(wire.StreamDLQ, 2)
	r = e.run("dlq", "replay", "-seq", "2")
	require.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "body was cut")
}

func TestTailPrintsCommittedEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	l := e.acquire(7, "worker-a.1")
	for v := int64(1); v <= 2; v++ {
		e.publish(event{partition: 7, task: "tailed", holder: "worker-a.1", generation: l.Generation, version: v,
			typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)})
	}

	r := e.run("tail", "-n", "2", "-json").ok(t)
	lines := r.jsonLines(t)
	require.Len(t, lines, 2)
	for i, line := range lines {
		assert.Equal(t, "tailed", line["task"])
		assert.Equal(t, float64(i+1), line["version"])
		assert.Equal(t, float64(7), line["partition"])
		assert.Equal(t, "worker-a.1", line["holder"])
		assert.Equal(t, map[string]any{"v": float64(i + 1)}, line["payload"])
	}

	r = e.run("tail", "-n", "1", "-since-seq", "2", "-task", "tailed").ok(t)
	out := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, out, 2, r.stdout)
	assert.Contains(t, out[0], "PAYLOAD")
	assert.Contains(t, out[1], "worker-a.1/1")
	assert.Contains(t, out[1], `{"v":2}`)
}

func TestTailStopsWhenInterrupted(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	run(t, "-nats-url", ns.URL(), "streams", "apply").ok(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb ledgertest.Buffer
	done := make(chan int)
	go func() { done <- ctl.Run(ctx, []string{"-nats-url", ns.URL(), "tail", "-new"}, &out, &errb) }()
	// Interrupt once it follows the log (it has printed its header).
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "PAYLOAD") }, 10*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errb.String())
	case <-time.After(10 * time.Second):
		t.Fatal("tail did not stop when interrupted")
	}
}

func TestBadArgumentsAndUnreachableServices(t *testing.T) {
	t.Parallel()
	closedNATS := "nats://127.0.0.1:1"
	closedDB := "postgres://root@127.0.0.1:1/nowhere?sslmode=disable"
	for _, c := range []struct {
		name   string
		args   []string
		code   int
		stderr string
		stdout string
	}{
		{"no command", nil, 2, "Usage: ledgerctl", ""},
		{"unknown command", []string{"bogus"}, 2, `unknown command "bogus"`, ""},
		{"task without id", []string{"task"}, 2, "missing the task id", ""},
		{"task with a bad id", []string{"task", "a.b"}, 2, "is not 1..128", ""},
		{"task with two ids", []string{"task", "a", "b"}, 2, "one task id", ""},
		{"unknown flag", []string{"leases", "-bogus"}, 2, "flag provided but not defined", ""},
		{"dlq without subcommand", []string{"dlq"}, 2, "Usage: ledgerctl dlq", ""},
		{"replay without a choice", []string{"dlq", "replay"}, 2, "choose the dead letters", ""},
		{"replay by filter without -all", []string{"dlq", "replay", "-verdict", "gap"}, 2, "add -all", ""},
		{"replay by seq and filter", []string{"dlq", "replay", "-seq", "1", "-all"}, 2, "not both", ""},
		{"replay with a bad seq", []string{"dlq", "replay", "-seq", "x"}, 2, "stream sequences", ""},
		{"list by an unknown verdict", []string{"dlq", "list", "-verdict", "committed"}, 2, "dead letters have verdict", ""},
		{"tail from two places", []string{"tail", "-new", "-since-seq", "3"}, 2, "not both", ""},
		{"bad prefix", []string{"-prefix", "a.b", "leases"}, 2, "-prefix", ""},
		{"no database", []string{"-database-url", "", "leases"}, 2, "no database", ""},
		{"help", []string{"-h"}, 0, "", "Commands:"},
		{"help of a command", []string{"help", "task"}, 0, "", "Usage: ledgerctl task"},
		{"version", []string{"version"}, 0, "", "ledgerctl "},
		{"unreachable NATS", []string{"-nats-url", closedNATS, "streams", "apply"}, 1, "NATS at nats://127.0.0.1:1 is not reachable", ""},
		{"unreachable NATS for dlq", []string{"dlq", "list", "-nats-url", closedNATS}, 1, "NATS", ""},
		{"unreachable database", []string{"-database-url", closedDB, "leases"}, 1, "database", ""},
		{"unreachable database for task", []string{"-database-url", closedDB, "task", "x"}, 1, "not reachable", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, c.args...)
			assert.Equal(t, c.code, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, c.stderr)
			assert.Contains(t, r.stdout, c.stdout)
			if c.code == 1 {
				assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
			}
		})
	}
}

func TestUsageListsOnlyThePresentCommands(t *testing.T) {
	t.Parallel()
	r := run(t, "help").ok(t)
	for _, c := range []string{"migrate", "streams apply", "leases", "task <id>", "dlq list|replay", "tail", "version", "demo", "rebuild"} {
		assert.Contains(t, r.stdout, "  "+c)
	}
}
