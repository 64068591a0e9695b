package deploytest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// beforePrincipalRules is the schema version before the database checked
// the rejections the ingest records (migration 00017).
const beforePrincipalRules = 16

// False rejections a stolen ingest DATABASE_URL could record against the
// state stageIngestHistory leaves (report-7 at version 2, owned by
// reports, on partition 1 held by reports.b at generation 3). Each would
// stand for ever: the verdict lookup answers it, and a later copy of the
// event gets it again.
var rejectionAttacks = []fenceAttack{
	{
		name: "records the current holder's next event as stale",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason, current_generation)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 3, 'reports.b', 3, 'stale', 'superseded', 3)`,
		code: "LF007",
	},
	{
		name: "records the current holder's event as not the holder's",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason, current_generation)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 3, 'reports.b', 3, 'stale', 'not_holder', 3)`,
		code: "LF007",
	},
	{
		name: "records the next version as a gap",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 3, 'reports.b', 3, 'gap', 'gap_timeout')`,
		code: "LF007",
	},
	{
		name: "records the owner's event as not its owner's",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 3, 'reports.b', 3, 'invalid', 'not_owner')`,
		code: "LF007",
	},
	{
		name: "records a version never committed as taken",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 3, 'reports.b', 3, 'conflict', 'version_taken')`,
		code: "LF007",
	},
	{
		name: "records an id never committed as reused",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 3, 'reports.b', 3, 'conflict', 'event_id_reused')`,
		code: "LF007",
	},
	{
		name: "records a verdict the fence never records",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 3, 'reports.b', 3, 'invalid', 'bad_payload')`,
		code: "LF007",
	},
	{
		name: "dates a rejection back",
		sql: `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason, current_generation, rejected_at)
			VALUES ('01JD00000000000000000000R1', 1, 'report-7', 1, 'reports.a', 1, 'stale', 'superseded', 3, '2020-01-01')`,
		code: sqlInsufficientPrivilege,
	},
	{
		name: "puts a rejection before an event id's first one",
		sql: `INSERT INTO ledger.rejections (id, event_id, partition, task_id, version, holder, generation, verdict, reason, current_generation)
			OVERRIDING SYSTEM VALUE
			VALUES (0, '01JD00000000000000000000R1', 1, 'report-7', 1, 'reports.a', 1, 'stale', 'superseded', 3)`,
		code: sqlInsufficientPrivilege,
	},
}

// The ingest's database role records only the rejections the fence gives:
// run as a LOGIN user in ledger_ingest, each false rejection is refused
// and leaves no row. The negative control undoes migration 00017 on a
// second database: every one is then recorded.
func TestIngestRoleCannotRecordAFalseRejection(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		checked bool
	}{{"with the rejections checked", true}, {"without it", false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			pool := openPool(t, loginUser(t, db, roleIngest))
			stageIngestHistory(t, pool)
			if !c.checked {
				migrateDown(t, db.Pool, beforePrincipalRules)
			}
			for _, a := range rejectionAttacks {
				a.harm = `SELECT EXISTS (SELECT FROM ledger.rejections WHERE event_id = '01JD00000000000000000000R1')`
				err, harmed := runAttack(t, pool, a)
				if !c.checked {
					require.NoErrorf(t, err, "%s: the attack runs without the check", a.name)
					require.Truef(t, harmed, "%s: the false rejection is recorded without the check", a.name)
					continue
				}
				require.Falsef(t, harmed, "%s: the false rejection was recorded", a.name)
				var pgErr *pgconn.PgError
				require.Truef(t, errors.As(err, &pgErr), "%s: want SQLSTATE %s, got %v", a.name, a.code, err)
				require.Equalf(t, a.code, pgErr.Code, "%s: %s", a.name, pgErr.Message)
			}
		})
	}
}

// Every kind of rejection the append records passes the database's check
// when the real fence.Store writes it as the ingest's user.
func TestIngestUserRecordsEveryRejectionTheFenceGives(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	store, err := fence.New(openPool(t, loginUser(t, db, roleIngest)), fence.Config{MaxAhead: 100})
	require.NoError(t, err)

	a, err := store.Acquire(ctx, 3, "reports.a", time.Minute)
	require.NoError(t, err)
	v1 := fence.Event{ID: "01JD0000000000000000000001", Partition: 3, Task: "report-7", Version: 1, Type: "running",
		Payload: []byte(`{"by":"a"}`), Holder: "reports.a", Generation: a.Generation}
	appendOne := func(e fence.Event) fence.Result {
		t.Helper()
		res, err := store.Append(ctx, []fence.Event{e})
		require.NoError(t, err, e.ID)
		return res[0]
	}
	require.Equal(t, wire.VerdictCommitted, appendOne(v1).Verdict)
	require.NoError(t, store.Release(ctx, 3, "reports.a", a.Generation))
	b, err := store.TakeOver(ctx, 3, "reports.b", a.Generation, time.Minute)
	require.NoError(t, err)
	short, err := store.Acquire(ctx, 6, "reports.c", fence.TTLMin)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := store.Get(ctx, 6)
		return err == nil && !l.Valid
	}, 10*time.Second, 10*time.Millisecond)

	with := func(id string, f func(e *fence.Event)) fence.Event {
		e := v1
		e.ID, e.Version, e.Holder, e.Generation = id, 2, "reports.b", b.Generation
		f(&e)
		return e
	}
	cases := []struct {
		event           fence.Event
		verdict, reason string
	}{
		{with("01JD0000000000000000000011", func(e *fence.Event) { e.Holder, e.Generation = "reports.a", a.Generation }),
			"stale", wire.ReasonSuperseded},
		{with("01JD0000000000000000000012", func(e *fence.Event) { e.Holder = "reports.x" }), "stale", wire.ReasonNotHolder},
		{with("01JD0000000000000000000013", func(e *fence.Event) { e.Partition, e.Task = 5, "report-5" }), "stale", wire.ReasonNoLease},
		{with("01JD0000000000000000000014", func(e *fence.Event) {
			e.Partition, e.Task, e.Version, e.Holder, e.Generation = 6, "report-6", 1, "reports.c", short.Generation
		}), "stale", wire.ReasonLeaseExpired},
		{with(v1.ID, func(e *fence.Event) { e.Payload = []byte(`{"by":"b"}`) }), "conflict", wire.ReasonEventIDReused},
		{with("01JD0000000000000000000015", func(e *fence.Event) { e.Version, e.Payload = 1, []byte(`{"by":"b"}`) }),
			"conflict", wire.ReasonVersionTaken},
		{with("01JD0000000000000000000016", func(e *fence.Event) { e.Version = 1000 }), "gap", wire.ReasonTooFarAhead},
		{with("01JD0000000000000000000017", func(e *fence.Event) { e.Version, e.Final = 3, true }), "gap", wire.ReasonGapTimeout},
		{with("01JD0000000000000000000018", func(e *fence.Event) {
			e.Version, e.Final, e.GapReason = 4, true, wire.ReasonTooManyWaiting
		}), "gap", wire.ReasonTooManyWaiting},
		{with("01JD0000000000000000000019", func(e *fence.Event) { e.Holder = "billing.x" }), "invalid", wire.ReasonNotOwner},
	}
	for _, c := range cases {
		r := appendOne(c.event)
		require.Equalf(t, c.verdict+"/"+c.reason, string(r.Verdict)+"/"+r.Reason, "event %s", c.event.ID)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger.rejections`).Scan(&n))
	require.Equal(t, len(cases), n, "each rejection is recorded")
}
