package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// commitHead commits events as the ingest does, task head included.
func (e *env) commitHead(partition int, task string, types, payloads []string) []committed {
	e.t.Helper()
	out := e.commit(partition, task, types, payloads)
	last := out[len(out)-1]
	_, err := e.db.Pool.Exec(context.Background(), `
		INSERT INTO ledger.heads (task_id, partition, version, seq, type, first_seq)
		VALUES ($1, $2, $3, $4, $5, (SELECT min(seq) FROM ledger.events WHERE task_id = $1))
		ON CONFLICT (task_id) DO UPDATE SET version = excluded.version, seq = excluded.seq, type = excluded.type`,
		task, partition, last.version, last.seq, last.typ)
	require.NoError(e.t, err)
	return out
}

// loseSubject removes the messages of subject from stream, leaving no
// marker, as a server that lost its unsynced tail no longer has them.
func (e *env) loseSubject(stream, subject string) {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, stream)
	require.NoError(e.t, err)
	require.NoError(e.t, s.Purge(ctx, jetstream.WithPurgeSubject(subject)))
}

// reconciling is a projector configuration that compares every head at
// once: a grace of a millisecond, a page of two (so the sweep goes round).
func reconciling() projector.Config {
	return projector.Config{ReconcileEvery: 50 * time.Millisecond, ReconcilePage: 2, ReconcileGrace: time.Millisecond,
		Engine: projection.Config{GapTimeout: time.Hour}}
}

// JetStream lost what the projector had done: the bucket value of one
// finished task, the log copy of another task's last version and the value
// written from it. No event of either task comes again. The projector that
// starts afterwards finds both behind their heads in PostgreSQL and folds
// them again.
func TestProjectionsBehindTheirHeadAreFoldedFromPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	lostValue := e.commitHead(3, "lost-value", []string{"running", "done"}, []string{`{"a":1}`, `{"b":2}`})
	lostCopy := e.commitHead(5, "lost-copy", []string{"running", "done"}, []string{`{"x":1}`, `{"y":2}`})
	for _, task := range []string{"f1", "f2", "f3"} { // fillers, so the sweep takes several pages
		for _, c := range e.commitHead(7, task, []string{"done"}, []string{`{}`}) {
			e.publishLog(c)
		}
	}
	for _, c := range append(lostValue, lostCopy[0]) {
		e.publishLog(c)
	}
	first := e.start(projector.Config{ReconcileEvery: -1})
	e.waitState("lost-value", 10*time.Second, func(st projection.State) bool { return st.Version == 2 })
	e.waitState("lost-copy", 10*time.Second, func(st projection.State) bool { return st.Version == 1 })
	first.Stop()

	e.loseSubject("KV_"+wire.BucketTasks, "$KV."+wire.BucketTasks+".lost-value")
	_, err := e.bucket().Get(ctx, "lost-value")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the value is gone")

	reg := prometheus.NewRegistry()
	e.startWith(reconciling(), reg)
	status, data := fold(t, lostValue)
	st := e.waitState("lost-value", 15*time.Second, func(st projection.State) bool { return st.Version == 2 })
	require.Equal(t, status, st.Status)
	jsonEq(t, data, st.Data, "the lost value is folded again from PostgreSQL")
	status, data = fold(t, lostCopy)
	st = e.waitState("lost-copy", 15*time.Second, func(st projection.State) bool { return st.Version == 2 })
	require.Equal(t, status, st.Status)
	jsonEq(t, data, st.Data, "the version whose copy was lost is folded from PostgreSQL")
	require.GreaterOrEqual(t, metric(t, reg, "ledger_projector_reconciled_total"), 2.0)
}

// A head committed within the grace is left to its log copy: the
// reconciliation does not fold a projection that is merely lagging. Both
// heads are on one page; the older one is folded, the fresh one is not.
func TestAHeadWithinTheGraceIsLeftToItsCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.commitHead(2, "fresh", []string{"running"}, []string{`{}`})
	e.commitHead(2, "old", []string{"running"}, []string{`{}`})
	_, err := e.db.Pool.Exec(context.Background(),
		`UPDATE ledger.events SET committed_at = now() - interval '2 hours' WHERE task_id = 'old'`)
	require.NoError(t, err)
	cfg := reconciling()
	cfg.ReconcileGrace = time.Hour
	e.start(cfg)
	e.waitState("old", 15*time.Second, func(st projection.State) bool { return st.Version == 1 })
	_, ok := e.state("fresh")
	require.False(t, ok, "no projection is folded from PostgreSQL within the grace")
}

// The bucket loses a value the running projector wrote and still holds in
// memory: the projector reads the bucket, not its memory, and writes the
// task again.
func TestAValueLostUnderARunningProjectorIsWrittenAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	events := e.commitHead(6, "resident", []string{"running", "done"}, []string{`{"a":1}`, `{"b":2}`})
	for _, c := range events {
		e.publishLog(c)
	}
	e.start(reconciling())
	e.waitState("resident", 10*time.Second, func(st projection.State) bool { return st.Version == 2 })

	e.loseSubject("KV_"+wire.BucketTasks, "$KV."+wire.BucketTasks+".resident")
	status, data := fold(t, events)
	st := e.waitState("resident", 15*time.Second, func(st projection.State) bool { return st.Version == 2 })
	require.Equal(t, status, st.Status)
	jsonEq(t, data, st.Data, "the lost value is written again")
}
