package ingest_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

func TestLeaseServiceFollowsTheContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})

	a, er, _ := e.lease("acquire", map[string]any{"partition": 3, "holder": "worker-a"})
	require.Nil(t, er)
	require.Equal(t, wire.LeaseReply{Partition: 3, Holder: "worker-a", Generation: 1, ExpiresAt: a.ExpiresAt, TTLMillis: 3000}, a,
		"a never-leased partition gets generation 1 and the default TTL")
	exp, err := time.Parse(time.RFC3339Nano, a.ExpiresAt)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(3*time.Second), exp, 2*time.Second)

	_, er, h := e.lease("acquire", map[string]any{"partition": 3, "holder": "worker-b", "ttl_ms": 5000})
	require.NotNil(t, er)
	require.Equal(t, "held", er.Error)
	require.Equal(t, "worker-a", er.Holder)
	require.EqualValues(t, 1, er.Generation)
	require.NotEmpty(t, er.ExpiresAt)
	require.NotEmpty(t, h.Get(micro.ErrorHeader), "micro service error headers are set")
	require.Equal(t, "409", h.Get(micro.ErrorCodeHeader))

	again, er, _ := e.lease("acquire", map[string]any{"partition": 3, "holder": "worker-a", "ttl_ms": 60000})
	require.Nil(t, er)
	require.EqualValues(t, 2, again.Generation, "the same holder re-acquiring fences its earlier incarnation")
	require.EqualValues(t, 60000, again.TTLMillis)

	renewed, er, _ := e.lease("renew", map[string]any{"partition": 3, "holder": "worker-a", "generation": 2})
	require.Nil(t, er)
	require.EqualValues(t, 2, renewed.Generation)
	require.EqualValues(t, 60000, renewed.TTLMillis, "a renewal keeps the lease's TTL")

	_, er, _ = e.lease("renew", map[string]any{"partition": 3, "holder": "worker-a", "generation": 1})
	require.Equal(t, "lost", er.Error)
	require.EqualValues(t, 2, er.Generation)

	got, er, _ := e.lease("get", map[string]any{"partition": 3})
	require.Nil(t, er)
	require.NotNil(t, got.Valid)
	require.True(t, *got.Valid)

	b, _ := json.Marshal(map[string]any{"partition": 3, "holder": "worker-a", "generation": 2})
	resp, err := e.nc.Request(e.subj.LeaseRelease(), b, 5*time.Second)
	require.NoError(t, err)
	var rel wire.ReleaseReply
	require.NoError(t, json.Unmarshal(resp.Data, &rel))
	require.Equal(t, wire.ReleaseReply{Partition: 3, Released: true}, rel)

	got, _, _ = e.lease("get", map[string]any{"partition": 3})
	require.False(t, *got.Valid)
	require.EqualValues(t, 2, got.Generation, "a released lease keeps its generation")
	next := e.acquire(3, "worker-b", 1000)
	require.EqualValues(t, 3, next.Generation)

	_, er, _ = e.lease("get", map[string]any{"partition": 9})
	require.Equal(t, "no_lease", er.Error)

	for name, req := range map[string]any{
		"ttl below 100 ms":       map[string]any{"partition": 1, "holder": "w", "ttl_ms": 99},
		"ttl above 300000 ms":    map[string]any{"partition": 1, "holder": "w", "ttl_ms": 300001},
		"partition out of range": map[string]any{"partition": 16, "holder": "w"},
		"no partition":           map[string]any{"holder": "w"},
		"bad holder":             map[string]any{"partition": 1, "holder": "a b"},
		"unknown field":          map[string]any{"partition": 1, "holder": "w", "gen": 4},
	} {
		_, er, h := e.lease("acquire", req)
		require.NotNil(t, er, name)
		require.Equal(t, "invalid", er.Error, name)
		require.NotEmpty(t, er.Message, name)
		require.Equal(t, "400", h.Get(micro.ErrorCodeHeader), name)
	}
	resp, err = e.nc.Request(e.subj.LeaseAcquire(), []byte("not json"), 5*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(resp.Data), `"error":"invalid"`)
}

func TestTaskHeadOverNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a")
	l := e.acquire(7, "worker-a", 60000)
	for v := int64(1); v <= 3; v++ {
		ev := event{id: newID(), partition: 7, task: "report-7", holder: "worker-a", generation: l.Generation, version: v, typ: "x", payload: `{}`}
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

	unknown := head("nobody")
	require.Nil(t, unknown.Partition, "partition is null for an unknown task")
	require.Zero(t, unknown.Version)
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
	for _, s := range []string{"ledger.lease.acquire", "ledger.lease.renew", "ledger.lease.release", "ledger.lease.get", "ledger.task.head"} {
		require.True(t, subjects[s], "endpoint %s", s)
	}
}
