package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

func TestLeaseServiceFollowsTheContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})

	a, er, _ := e.lease("acquire", map[string]any{"partition": 3, "holder": "worker-a.1"})
	require.Nil(t, er)
	require.Equal(t, wire.LeaseReply{Partition: 3, Holder: "worker-a.1", Generation: 1, ExpiresAt: a.ExpiresAt, TTLMillis: 3000}, a,
		"a never-leased partition gets generation 1 and the default TTL")
	exp, err := time.Parse(time.RFC3339Nano, a.ExpiresAt)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(3*time.Second), exp, 2*time.Second)

	_, er, h := e.lease("acquire", map[string]any{"partition": 3, "holder": "worker-b.1", "ttl_ms": 5000})
	require.NotNil(t, er)
	require.Equal(t, "held", er.Error)
	require.Equal(t, "worker-a.1", er.Holder)
	require.EqualValues(t, 1, er.Generation)
	require.NotEmpty(t, er.ExpiresAt)
	require.NotEmpty(t, h.Get(micro.ErrorHeader), "micro service error headers are set")
	require.Equal(t, "409", h.Get(micro.ErrorCodeHeader))

	again, er, _ := e.lease("acquire", map[string]any{"partition": 3, "holder": "worker-a.1", "ttl_ms": 60000})
	require.Nil(t, er)
	require.EqualValues(t, 2, again.Generation, "the same holder re-acquiring fences its earlier incarnation")
	require.EqualValues(t, 60000, again.TTLMillis)

	renewed, er, _ := e.lease("renew", map[string]any{"partition": 3, "holder": "worker-a.1", "generation": 2})
	require.Nil(t, er)
	require.EqualValues(t, 2, renewed.Generation)
	require.EqualValues(t, 60000, renewed.TTLMillis, "a renewal keeps the lease's TTL")

	_, er, _ = e.lease("renew", map[string]any{"partition": 3, "holder": "worker-a.1", "generation": 1})
	require.Equal(t, "lost", er.Error)
	require.EqualValues(t, 2, er.Generation)

	got, er, _ := e.lease("get", map[string]any{"partition": 3})
	require.Nil(t, er)
	require.Equal(t, 16, got.Partitions, "a get tells the partition count")
	require.NotNil(t, got.Valid)
	require.True(t, *got.Valid)

	b, _ := json.Marshal(map[string]any{"partition": 3, "holder": "worker-a.1", "generation": 2})
	resp, err := e.nc.Request(e.subj.Lease(wire.LeaseRelease, "worker-a.1"), b, 5*time.Second)
	require.NoError(t, err)
	var rel wire.ReleaseReply
	require.NoError(t, json.Unmarshal(resp.Data, &rel))
	require.Equal(t, wire.ReleaseReply{Partition: 3, Released: true}, rel)

	got, _, _ = e.lease("get", map[string]any{"partition": 3})
	require.False(t, *got.Valid)
	require.EqualValues(t, 2, got.Generation, "a released lease keeps its generation")
	next := e.acquire(3, "worker-b.1", 1000)
	require.EqualValues(t, 3, next.Generation)

	_, er, _ = e.lease("get", map[string]any{"partition": 9})
	require.Equal(t, "no_lease", er.Error)
	require.Equal(t, 16, er.Partitions, "a get tells the partition count, even of a partition never leased")

	for name, req := range map[string]map[string]any{
		"ttl below 100 ms":       {"partition": 1, "holder": "w.1", "ttl_ms": 99},
		"ttl above 300000 ms":    {"partition": 1, "holder": "w.1", "ttl_ms": 300001},
		"partition out of range": {"partition": 16, "holder": "w.1"},
		"no partition":           {"holder": "w.1"},
		"unknown field":          {"partition": 1, "holder": "w.1", "gen": 4},
	} {
		_, er, h := e.lease("acquire", req)
		require.NotNil(t, er, name)
		require.Equal(t, "invalid", er.Error, name)
		require.NotEmpty(t, er.Message, name)
		require.Equal(t, "400", h.Get(micro.ErrorCodeHeader), name)
	}
	resp, err = e.nc.Request(e.subj.Lease(wire.LeaseAcquire, "w.1"), []byte("not json"), 5*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(resp.Data), `"error":"invalid"`)

	// The holder is the subject's: one in the body must be the same.
	resp, err = e.nc.Request(e.subj.Lease(wire.LeaseAcquire, "w.1"), []byte(`{"partition":1,"holder":"v.1"}`), 5*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(resp.Data), `"error":"invalid"`)
	require.Contains(t, string(resp.Data), "not the subject's")
}

func TestTaskHeadOverNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(7, "worker-a.1", 60000)
	for v := int64(1); v <= 3; v++ {
		ev := event{id: newID(), partition: 7, task: "report-7", holder: "worker-a.1", generation: l.Generation, version: v, typ: "x", payload: `{}`}
		e.publish(ev)
		receiptFor(t, rc, ev.id)
	}
	head := func(task string) wire.TaskHeadReply {
		b, _ := json.Marshal(wire.TaskHeadRequest{Task: task})
		resp, err := e.nc.Request(e.subj.TaskHead(), b, 5*time.Second)
		require.NoError(t, err)
		var r wire.TaskHeadReply
		require.NoError(t, json.Unmarshal(resp.Data, &r))
		return r
	}
	h := head("report-7")
	require.Equal(t, "report-7", h.Task)
	require.NotNil(t, h.Partition)
	require.Equal(t, 7, *h.Partition)
	require.EqualValues(t, 3, h.Version)
	require.Positive(t, h.Seq)
	require.NotNil(t, h.Type)
	require.Equal(t, "x", *h.Type, "the last event's type tells a finished task from a running one")

	unknown := head("nobody")
	require.Nil(t, unknown.Partition, "partition is null for an unknown task")
	require.Nil(t, unknown.Type, "type is null for an unknown task")
	require.Zero(t, unknown.Version)
}

// The heads of many tasks come in one request, in the order asked.
func TestTaskHeadsOfManyTasksOverNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(7, "worker-a.1", 60000)
	x := event{id: newID(), partition: 7, task: "known", holder: "worker-a.1", generation: l.Generation, version: 1, typ: "started", payload: `{}`}
	e.publish(x)
	receiptFor(t, rc, x.id)
	b, _ := json.Marshal(wire.TaskHeadRequest{Tasks: []string{"fresh", "known"}})
	resp, err := e.nc.Request(e.subj.TaskHead(), b, 5*time.Second)
	require.NoError(t, err)
	var r wire.TaskHeadsReply
	require.NoError(t, json.Unmarshal(resp.Data, &r), string(resp.Data))
	require.Len(t, r.Heads, 2)
	require.Equal(t, "fresh", r.Heads[0].Task)
	require.Zero(t, r.Heads[0].Version)
	require.Nil(t, r.Heads[0].Partition)
	require.Equal(t, "known", r.Heads[1].Task)
	require.EqualValues(t, 1, r.Heads[1].Version)
	require.Equal(t, "started", *r.Heads[1].Type)
}

// An acquire retried with its request id over NATS gets the same grant.
func TestAcquireRetriedWithItsRequestIDOverNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	req := map[string]any{"partition": 2, "holder": "worker-a.1", "ttl_ms": 60000, "request_id": "01JD0000000000000000000009"}
	first, er, _ := e.lease("acquire", req)
	require.Nil(t, er)
	again, er, _ := e.lease("acquire", req)
	require.Nil(t, er)
	require.Equal(t, first, again)
	delete(req, "request_id")
	next, er, _ := e.lease("acquire", req)
	require.Nil(t, er)
	require.Equal(t, first.Generation+1, next.Generation)
}

func TestLeaseServiceIsDiscoverable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	resp, err := e.nc.Request("$SRV.INFO.ledger", nil, 5*time.Second)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(resp.Data, &info))
	require.Equal(t, "ledger", info.Name)
	subjects := map[string]bool{}
	for _, ep := range info.Endpoints {
		subjects[ep.Subject] = true
	}
	for _, s := range []string{"ledger.lease.acquire.*.*", "ledger.lease.renew.*.*", "ledger.lease.release.*.*", "ledger.lease.get", "ledger.task.head"} {
		require.True(t, subjects[s], "endpoint %s", s)
	}
}

// request sends body to subject and returns the raw reply.
func (e *env) request(subject string, body []byte) *nats.Msg {
	e.t.Helper()
	resp, err := e.nc.Request(subject, body, 10*time.Second)
	require.NoError(e.t, err, "no reply from %s", subject)
	return resp
}

// errorReply decodes an error reply, failing the test on a success reply.
func errorReply(t *testing.T, resp *nats.Msg) wire.ErrorReply {
	t.Helper()
	require.NotEmpty(t, resp.Header.Get(micro.ErrorCodeHeader), "not an error reply: %.200s", resp.Data)
	var er wire.ErrorReply
	require.NoError(t, json.Unmarshal(resp.Data, &er), "%.200s", resp.Data)
	return er
}

func TestLeaseServiceRefusesHostileBodiesAndKeepsServing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	big := strings.Repeat("h", 512<<10) // under NATS's 1 MiB payload limit, so it reaches the service
	hostile := []string{
		`{"partition":1,"partition":2,"holder":"w","generation":1}`,
		`{"partition":1,"holder":"w","hol\u0064er":"x","generation":1}`,
		`{"partition":99999999999999999999,"holder":"w","generation":1}`,
		`{"partition":1e400,"holder":"w","generation":1}`,
		`{"partition":"1","holder":"w","generation":1}`,
		`{"partition":1,"holder":["w"],"generation":1}`,
		`{"partition":` + strings.Repeat("[", 200000) + `}`,
		`{"partition":1,"holder":"` + big + `","generation":1}`,
		`{"task":"` + big + `"}`,
		`{"` + big + `":1}`,
		`{"partition":1,"` + strings.Repeat("f", 3<<10) + `":1}`, // under the 4 KiB limit
		`{"partition":1,"holder":"w","generation":1} {"task":"t"}`,
	}
	for _, subject := range []string{e.subj.Lease(wire.LeaseAcquire, "worker-a.1"), e.subj.Lease(wire.LeaseRenew, "worker-a.1"), e.subj.Lease(wire.LeaseRelease, "worker-a.1"),
		e.subj.LeaseGet(), e.subj.TaskHead()} {
		for _, body := range hostile {
			resp := e.request(subject, []byte(body))
			er := errorReply(t, resp)
			require.Equal(t, wire.ErrCodeInvalid, er.Error, "%s %.80s", subject, body)
			require.Equal(t, "400", resp.Header.Get(micro.ErrorCodeHeader))
			require.Less(t, len(resp.Data), 400, "%s %.80s: the reply carries the body back", subject, body)
		}
	}
	// Still serving.
	granted := e.acquire(2, "worker-a.1", 60000)
	require.EqualValues(t, 1, granted.Generation)
}

// A database error reaches the requester as "unavailable" with a generic
// message; what the database said (its host, user, database name, tables,
// SQLSTATE) goes to the log only.
func TestLeaseErrorRepliesNeverEchoDatabaseErrors(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	proxy := faultproxy.Start(t, "127.0.0.1:5432")
	store, err := fence.New(db.PoolVia(t, proxy.Addr()), fence.Config{})
	require.NoError(t, err)
	ns := natstest.Start(t)
	var logs ledgertest.Buffer
	svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: ns.Conn(t), Store: store,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	e := &env{t: t, db: db, store: store, ns: ns, nc: ns.Conn(t)}
	e.acquire(1, "worker-a.1", 60000)

	requests := map[string]string{
		e.subj.Lease(wire.LeaseAcquire, "worker-a.1"): `{"partition":2,"holder":"worker-a.1"}`,
		e.subj.Lease(wire.LeaseRenew, "worker-a.1"):   `{"partition":1,"holder":"worker-a.1","generation":1}`,
		e.subj.Lease(wire.LeaseRelease, "worker-a.1"): `{"partition":1,"holder":"worker-a.1","generation":1}`,
		e.subj.LeaseGet(): `{"partition":1}`,
		e.subj.TaskHead(): `{"task":"job","event_id":"01JD0000000000000000000001"}`,
	}
	leaks := func(what string, secrets ...string) {
		t.Helper()
		for subject, body := range requests {
			resp := e.request(subject, []byte(body))
			er := errorReply(t, resp)
			require.Equal(t, wire.ErrCodeUnavailable, er.Error, "%s (%s): %s", subject, what, er.Message)
			require.Equal(t, "503", resp.Header.Get(micro.ErrorCodeHeader))
			for _, s := range secrets {
				require.NotContains(t, string(resp.Data), s, "%s (%s) echoes the database's error", subject, what)
				require.NotContains(t, resp.Header.Get(micro.ErrorHeader), s, "%s (%s) echoes the database's error", subject, what)
			}
		}
	}

	// The database cannot be reached: the error names the address, the
	// user and the database.
	proxy.Cut()
	leaks("database down", proxy.Addr(), db.Name, "user=", "dial", "refused")
	proxy.Restore()
	require.Contains(t, logs.String(), proxy.Addr(), "the detail is logged")

	// The database refuses the statements themselves (a schema an operator
	// broke): the error names the table and its SQLSTATE.
	_, err = db.Pool.Exec(context.Background(), `ALTER SCHEMA ledger RENAME TO ledger_moved`)
	require.NoError(t, err)
	leaks("schema missing", "ledger.", "42P01", "SQLSTATE", "does not exist")
	require.Contains(t, logs.String(), "42P01", "the detail is logged")

	_, err = db.Pool.Exec(context.Background(), `ALTER SCHEMA ledger_moved RENAME TO ledger`)
	require.NoError(t, err)
	got, er, _ := e.lease("get", map[string]any{"partition": 1})
	require.Nil(t, er, "the service answers again once the database does")
	require.EqualValues(t, 1, got.Generation)
}

// A worker whose receipt was lost asks the task head for its event's
// verdict: the recorded one, or null while there is none.
func TestTaskHeadWithEventIDTellsItsRecordedVerdict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	old := e.acquire(4, "worker-a.1", 60000)
	cur := e.acquire(4, "worker-a.1", 60000) // fences old
	committed := event{id: newID(), partition: 4, task: "job", holder: "worker-a.1", generation: cur.Generation, version: 1, typ: "x", payload: `{}`}
	stale := event{id: newID(), partition: 4, task: "job", holder: "worker-a.1", generation: old.Generation, version: 2, typ: "x", payload: `{}`}
	ahead := event{id: newID(), partition: 4, task: "job", holder: "worker-a.1", generation: cur.Generation, version: 9, typ: "x", payload: `{}`}
	for _, ev := range []event{committed, stale} {
		e.publish(ev)
		receiptFor(t, rc, ev.id)
	}
	e.publish(ahead) // waits for versions 2..8 inside its gap window

	head := func(body string) (wire.TaskHeadEventReply, map[string]json.RawMessage) {
		resp := e.request(e.subj.TaskHead(), []byte(body))
		require.Empty(t, resp.Header.Get(micro.ErrorCodeHeader), "%s", resp.Data)
		var r wire.TaskHeadEventReply
		require.NoError(t, json.Unmarshal(resp.Data, &r))
		var raw map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(resp.Data, &raw))
		return r, raw
	}
	r, _ := head(`{"task":"job","event_id":"` + committed.id + `"}`)
	require.Equal(t, &wire.EventVerdict{EventID: committed.id, Verdict: wire.VerdictCommitted,
		Seq: receiptFor(t, rc, committed.id).Seq}, r.Event)
	require.EqualValues(t, 1, r.Version, "the head is there too")

	r, _ = head(`{"task":"job","event_id":"` + stale.id + `"}`)
	require.Equal(t, &wire.EventVerdict{EventID: stale.id, Verdict: wire.VerdictStale, Reason: wire.ReasonSuperseded}, r.Event)

	for _, id := range []string{ahead.id, newID()} {
		r, raw := head(`{"task":"job","event_id":"` + id + `"}`)
		require.Nil(t, r.Event)
		require.JSONEq(t, `null`, string(raw["event"]), "no verdict yet is an explicit null")
	}
	_, raw := head(`{"task":"job"}`)
	require.NotContains(t, raw, "event", "a plain head request gets the plain reply")
}

// A lease request published without a reply subject changes nothing.
func TestLeaseRequestWithoutAReplyDoesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	b, _ := json.Marshal(map[string]any{"partition": 5})
	require.NoError(t, e.nc.Publish(e.subj.Lease(wire.LeaseAcquire, "worker-a.1"), b))
	require.NoError(t, e.nc.Flush())
	got := e.acquire(6, "worker-b.1", 60000) // a request after it was served in order
	require.EqualValues(t, 1, got.Generation)
	_, er, _ := e.lease("get", map[string]any{"partition": 5})
	require.NotNil(t, er)
	require.Equal(t, "no_lease", er.Error, "the acquire without a reply was not carried out")
}

// A database that forgot grants (an asynchronous failover, a restore from
// backup) would hand a generation it already granted to another holder.
// The witness outside PostgreSQL keeps the next grant above every
// generation the ledger ever acknowledged.
func TestGenerationIsNeverGrantedTwiceAfterTheDatabaseForgets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		off  bool
		want int64
	}{{"witnessed", false, 4}, {"without the witness", true, 2}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, ingest.WithTestHooks(ingest.Config{}, ingest.TestHooks{NoWitness: c.off}))
			for g := int64(1); g <= 3; g++ {
				l := e.acquire(4, fmt.Sprintf("worker-a.%d", g), 60000)
				require.Equal(t, g, l.Generation)
				e.expire(4)
			}
			// The database goes back to before generations 2 and 3.
			_, err := e.db.Pool.Exec(context.Background(),
				`UPDATE ledger.leases SET generation = 1, holder = 'worker-a.1', expires_at = clock_timestamp() - interval '1 second' WHERE partition = 4`)
			require.NoError(t, err)
			_, err = e.db.Pool.Exec(context.Background(), `DELETE FROM ledger.lease_grants WHERE partition = 4 AND generation > 1`)
			require.NoError(t, err)

			l := e.acquire(4, "worker-b.1", 60000)
			require.Equal(t, c.want, l.Generation)
		})
	}
}

// Each lease error says what is wrong with the request, in words a client
// author can act on.
func TestLeaseErrorsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	l := e.acquire(2, "worker-a.1", 60000)
	require.EqualValues(t, 1, l.Generation)

	for name, c := range map[string]struct {
		op   string
		req  map[string]any
		code string
		want string
	}{
		"a request_id on a renew is refused as out of place, not as malformed": {"renew",
			map[string]any{"holder": "worker-a.1", "partition": 2, "generation": 1, "request_id": "01JD0000000000000000000001"},
			"invalid", "request_id is allowed only on an acquire, not on a renew"},
		"a malformed request_id on an acquire": {"acquire",
			map[string]any{"holder": "worker-a.1", "partition": 2, "request_id": "has space"}, "invalid", `request_id "has space" is not 1..64 of [A-Za-z0-9_-]`},
		"a ttl below the range is out of range, not a non-integer": {"acquire",
			map[string]any{"holder": "worker-a.1", "partition": 2, "ttl_ms": 50}, "invalid", `ttl_ms "50" is out of range [100, 300000]`},
		"a generation never granted": {"renew", map[string]any{"holder": "worker-a.1", "partition": 2, "generation": 6},
			"lost", "generation 6 of partition 2 was never granted; the current generation is 1"},
	} {
		_, er, _ := e.lease(c.op, c.req)
		require.NotNil(t, er, name)
		require.Equal(t, c.code, er.Error, name)
		require.Contains(t, er.Message, c.want, name)
	}
}

// A principal's leases are capped by configuration: with a cap of two, a
// third partition is refused to any of its instances while another
// principal is served, a partition it holds may be acquired again, and a
// TTL above the cap is refused on acquire and renewal alike.
func TestLeaseServiceCapsAPrincipalsLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{MaxLeasesPerPrincipal: 2, MaxLeaseTTL: 10 * time.Second})

	for p, holder := range []string{"billing.x", "billing.y"} {
		_, er, _ := e.lease("acquire", map[string]any{"partition": p, "holder": holder})
		require.Nil(t, er)
	}
	_, er, h := e.lease("acquire", map[string]any{"partition": 2, "holder": "billing.z"})
	require.NotNil(t, er, "a third lease of billing's")
	require.Equal(t, "invalid", er.Error)
	require.Contains(t, er.Message, "principal billing holds 2 leases")
	require.Equal(t, "400", h.Get(micro.ErrorCodeHeader))
	_, er, _ = e.lease("acquire", map[string]any{"partition": 1, "holder": "billing.y"})
	require.Nil(t, er, "a partition billing holds, acquired again, is no new lease")
	_, er, _ = e.lease("acquire", map[string]any{"partition": 2, "holder": "reports.a"})
	require.Nil(t, er, "another principal is served")

	_, er, _ = e.lease("acquire", map[string]any{"partition": 3, "holder": "reports.a", "ttl_ms": 60000})
	require.NotNil(t, er)
	require.Contains(t, er.Message, "ttl_ms 60000 is above 10000")
	_, er, _ = e.lease("renew", map[string]any{"partition": 2, "holder": "reports.a", "generation": 1, "ttl_ms": 60000})
	require.NotNil(t, er)
	require.Contains(t, er.Message, "ttl_ms 60000 is above 10000")
	_, er, _ = e.lease("renew", map[string]any{"partition": 2, "holder": "reports.a", "generation": 1, "ttl_ms": 10000})
	require.Nil(t, er)
}

// An acquire of a partition outside the principal's ranges is refused with
// forbidden (403), the message naming the principal's ranges; within them
// it is granted as always.
func TestLeaseServiceRefusesAPartitionOutsideThePrincipalsRanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	ctx := context.Background()
	require.NoError(t, fence.SetPartitionRanges(ctx, e.db.Pool, "billing", []fence.Range{{Lo: 0, Hi: 7}}, "ops", "split"))
	require.NoError(t, fence.SetPartitionRanges(ctx, e.db.Pool, "reports", []fence.Range{{Lo: 8, Hi: 15}}, "ops", "split"))

	e.acquire(3, "billing.x", 60000)
	e.acquire(9, "reports.a", 60000)
	for _, c := range []struct {
		holder    string
		partition int
	}{{"reports.a", 3}, {"reports.a", 4}, {"billing.x", 9}} {
		_, er, h := e.lease("acquire", map[string]any{"partition": c.partition, "holder": c.holder})
		require.NotNilf(t, er, "%s acquires %d", c.holder, c.partition)
		require.Equal(t, wire.ErrCodeForbidden, er.Error)
		require.Equal(t, "403", h.Get(micro.ErrorCodeHeader))
		require.Contains(t, er.Message, fmt.Sprintf("partition %d is not within principal %s's partitions", c.partition, wire.Principal(c.holder)))
	}
	require.Zero(t, e.count(`SELECT count(*) FROM ledger.lease_grants WHERE (holder LIKE 'reports.%' AND partition < 8)
		OR (holder LIKE 'billing.%' AND partition >= 8)`))
}
