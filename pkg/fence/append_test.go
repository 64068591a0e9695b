package fence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// The seed's story: A holds generation g, pauses past its lease; B takes over
// with g+1 and writes; A wakes and writes with g. A is refused, B is kept.
func TestStaleHoldersLateWriteIsRejectedAfterTakeover(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()

	a, err := s.Acquire(ctx, 3, "worker-a.1", longTTL)
	require.NoError(t, err)
	r := appendOne(t, s, ev(a, "report-7", 1, "running"))
	require.Equal(t, wire.VerdictCommitted, r.Verdict)

	expire(t, db, 3) // A pauses past its lease
	b, err := s.Acquire(ctx, 3, "worker-a.2", longTTL)
	require.NoError(t, err)
	require.Equal(t, a.Generation+1, b.Generation)

	rb := appendOne(t, s, ev(b, "report-7", 2, "completed"))
	require.Equal(t, wire.VerdictCommitted, rb.Verdict)

	late := ev(a, "report-7", 3, "completed")
	ra := appendOne(t, s, late)
	require.Equal(t, wire.VerdictStale, ra.Verdict)
	require.Equal(t, wire.ReasonSuperseded, ra.Reason)
	require.Equal(t, b.Generation, ra.CurrentGeneration)
	require.Equal(t, "worker-a.2", ra.CurrentHolder)

	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.rejections
		WHERE event_id = $1 AND verdict = 'stale' AND reason = 'superseded' AND current_generation = $2`,
		late.ID, b.Generation))
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE event_id = $1`, late.ID))
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events e
		JOIN ledger.lease_grants g ON g.partition = e.partition AND g.generation = $1
		WHERE e.generation < $1 AND e.seq > $2`, b.Generation, rb.Seq),
		"no event of A's is committed after B's grant")

	var holder string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT holder FROM ledger.events WHERE task_id = 'report-7' ORDER BY version DESC LIMIT 1`).Scan(&holder))
	require.Equal(t, "worker-a.2", holder, "the task keeps B's result")
}

func TestSameHolderAfterExpiryWithoutTakeoverIsLeaseExpired(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	a, err := s.Acquire(context.Background(), 0, "worker-a.1", longTTL)
	require.NoError(t, err)
	expire(t, db, 0)
	e := ev(a, "t1", 1, "running")
	r := appendOne(t, s, e)
	require.Equal(t, wire.VerdictStale, r.Verdict)
	require.Equal(t, wire.ReasonLeaseExpired, r.Reason)
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE event_id = $1 AND reason = 'lease_expired'`, e.ID))
}

func TestStaleReasons(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, fence.Config{})
	ctx := context.Background()
	a, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
	require.NoError(t, err)

	never := ev(fence.Lease{Partition: 2, Holder: "worker-a.1", Generation: 1}, "t-never", 1, "x")
	notHolder := ev(fence.Lease{Partition: 1, Holder: "worker-z.1", Generation: a.Generation}, "t-z", 1, "x")
	future := ev(fence.Lease{Partition: 1, Holder: "worker-a.1", Generation: a.Generation + 5}, "t-f", 1, "x")
	res, err := s.Append(ctx, []fence.Event{never, notHolder, future})
	require.NoError(t, err)
	require.Equal(t, wire.ReasonNoLease, res[0].Reason)
	require.Equal(t, wire.ReasonNotHolder, res[1].Reason)
	require.Equal(t, wire.ReasonNotHolder, res[2].Reason, "a generation from the future is not the holder's")
	for _, r := range res {
		require.Equal(t, wire.VerdictStale, r.Verdict)
	}
}

func TestDuplicatesConflictsAndOrdering(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 5, "worker-a.1", longTTL)
	require.NoError(t, err)
	v1 := ev(l, "task-d", 1, "running")
	first := appendOne(t, s, v1)
	require.Equal(t, wire.VerdictCommitted, first.Verdict)

	sameContentNewID := v1
	sameContentNewID.ID = newID()
	reordered := v1
	reordered.ID = newID()
	reordered.Payload = []byte(`{ "by" : "worker-a.1", "v" : 1 }`) // equal as JSON
	otherContent := v1
	otherContent.ID = newID()
	otherContent.Payload = []byte(`{"v":1,"by":"someone-else"}`)
	otherType := v1
	otherType.ID = newID()
	otherType.Type = "completed"
	reusedID := ev(l, "task-d", 2, "completed")
	reusedID.ID = v1.ID
	ahead := ev(l, "task-d", 5, "completed")
	aheadFinal := ev(l, "task-d", 6, "completed")
	aheadFinal.Final = true
	wrongPartition := ev(fence.Lease{Partition: 6, Holder: "worker-a.1", Generation: 1}, "task-d", 2, "completed")

	for _, tc := range []struct {
		name    string
		event   fence.Event
		verdict wire.Verdict
		reason  string
	}{
		{"same event id twice", v1, wire.VerdictDuplicate, wire.ReasonSameEventID},
		{"same task, version and content under a new id", sameContentNewID, wire.VerdictDuplicate, wire.ReasonSameContent},
		{"same content, other key order and spacing", reordered, wire.VerdictDuplicate, wire.ReasonSameContent},
		{"same version, other payload", otherContent, wire.VerdictConflict, wire.ReasonVersionTaken},
		{"same version, other type", otherType, wire.VerdictConflict, wire.ReasonVersionTaken},
		{"event id reused for other content", reusedID, wire.VerdictConflict, wire.ReasonEventIDReused},
		{"version ahead of head", ahead, fence.NotYet, ""},
		{"version ahead of head after its window", aheadFinal, wire.VerdictGap, wire.ReasonGapTimeout},
		{"task on another partition", wrongPartition, wire.VerdictInvalid, wire.ReasonWrongPartition},
	} {
		r := appendOne(t, s, tc.event)
		require.Equal(t, tc.verdict, r.Verdict, tc.name)
		require.Equal(t, tc.reason, r.Reason, tc.name)
		if tc.verdict == wire.VerdictDuplicate {
			require.Equal(t, first.Seq, r.Seq, "%s: a duplicate reports the original seq", tc.name)
			require.Equal(t, v1.ID, r.Committed.EventID, tc.name)
		}
	}
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.events`), "nothing but the first copy is written")
	require.Equal(t, 4, countRows(t, db, `SELECT count(*) FROM ledger.rejections`), "conflicts and the gap are recorded")
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, ahead.ID),
		"a not-yet event is not a rejection")
}

func TestBatchCommitsDenseVersionsInOrder(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)

	// Out of order inside one batch, with an in-batch duplicate and a hole.
	v3, v1, v2 := ev(l, "t", 3, "c"), ev(l, "t", 1, "a"), ev(l, "t", 2, "b")
	dupOfV1 := v1
	dupOfV1.ID = newID()
	v5 := ev(l, "t", 5, "e")
	res, err := s.Append(ctx, []fence.Event{v3, v1, dupOfV1, v2, v5})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict)
	require.Equal(t, wire.VerdictCommitted, res[1].Verdict)
	require.Equal(t, wire.VerdictDuplicate, res[2].Verdict)
	require.Equal(t, res[1].Seq, res[2].Seq)
	require.Equal(t, wire.VerdictCommitted, res[3].Verdict)
	require.Equal(t, fence.NotYet, res[4].Verdict)
	require.Less(t, res[1].Seq, res[3].Seq)
	require.Less(t, res[3].Seq, res[0].Seq, "seq follows version within a task")

	h, err := s.TaskHead(ctx, "t")
	require.NoError(t, err)
	require.EqualValues(t, 3, h.Version)
	require.Equal(t, 0, h.Partition)
	require.Equal(t, res[0].Seq, h.Seq)
	require.Equal(t, 3, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE task_id = 't'`))

	unknown, err := s.TaskHead(ctx, "nobody")
	require.NoError(t, err)
	require.False(t, unknown.Known)
	require.Zero(t, unknown.Version)
}

func TestInvalidEventsAreRefusedOneByOne(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{MaxPayload: 4096})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)

	good := ev(l, "good", 1, "ok")
	with := func(f func(*fence.Event)) fence.Event { e := ev(l, "bad", 1, "x"); f(&e); return e }
	cases := []struct {
		name   string
		event  fence.Event
		reason string
	}{
		{"empty id", with(func(e *fence.Event) { e.ID = "" }), wire.ReasonMissingEventID},
		{"id not a ULID", with(func(e *fence.Event) { e.ID = "not-a-ulid" }), wire.ReasonBadEventID},
		{"partition out of range", with(func(e *fence.Event) { e.Partition = 16 }), wire.ReasonBadPartition},
		{"task with a dot", with(func(e *fence.Event) { e.Task = "a.b" }), wire.ReasonBadTask},
		{"task too long", with(func(e *fence.Event) { e.Task = strings.Repeat("t", 129) }), wire.ReasonBadTask},
		{"holder empty", with(func(e *fence.Event) { e.Holder = "" }), wire.ReasonBadHolder},
		{"type with space", with(func(e *fence.Event) { e.Type = "a b" }), wire.ReasonBadType},
		{"version 0", with(func(e *fence.Event) { e.Version = 0 }), wire.ReasonBadVersion},
		{"generation 0", with(func(e *fence.Event) { e.Generation = 0 }), wire.ReasonBadGeneration},
		{"not JSON", with(func(e *fence.Event) { e.Payload = []byte(`{nope`) }), wire.ReasonBadPayload},
		{"NUL escape jsonb refuses", with(func(e *fence.Event) { e.Payload = []byte(`{"a":"\u0000"}`) }), wire.ReasonBadPayload},
		{"lone surrogate", with(func(e *fence.Event) { e.Payload = []byte(`"\ud800"`) }), wire.ReasonBadPayload},
		{"invalid UTF-8", with(func(e *fence.Event) { e.Payload = []byte("\"\xff\"") }), wire.ReasonBadPayload},
		{"too deep", with(func(e *fence.Event) {
			e.Payload = []byte(strings.Repeat("[", 600) + strings.Repeat("]", 600))
		}), wire.ReasonBadPayload},
		{"too large", with(func(e *fence.Event) { e.Payload = []byte(`"` + strings.Repeat("x", 5000) + `"`) }), wire.ReasonPayloadTooLarge},
	}
	batch := []fence.Event{good}
	for _, c := range cases {
		batch = append(batch, c.event)
	}
	res, err := s.Append(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict, "a good event in the same batch still commits")
	for i, c := range cases {
		require.Equal(t, wire.VerdictInvalid, res[i+1].Verdict, c.name)
		require.Equal(t, c.reason, res[i+1].Reason, c.name)
		require.NotEmpty(t, res[i+1].Detail, c.name)
	}
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.events`))

	// Valid escapes are fine, and an empty payload is stored as JSON null.
	okPair := ev(l, "pair", 1, "x")
	okPair.Payload = []byte(`{"emoji":"\ud83d\ude00","nl":"\n"}`)
	empty := ev(l, "empty", 1, "x")
	empty.Payload = nil
	res, err = s.Append(ctx, []fence.Event{okPair, empty})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict)
	require.Equal(t, wire.VerdictCommitted, res[1].Verdict)
	require.Equal(t, "null", string(res[1].Committed.Payload))
}

func TestAppendGivesNoVerdictWithoutDatabase(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)
	db.Pool.Close()
	res, err := s.Append(ctx, []fence.Event{ev(l, "t", 1, "x")})
	require.Error(t, err, "no verdict without a database")
	require.Nil(t, res)
}

// A lease that runs out between an append's reads and its insert: the fence
// in the insert refuses the partition's rows, ledger.fence_check aborts the
// transaction (whose COMMIT went out in the same round trip), and the batch
// runs again. Nothing of the first attempt is committed: the other
// partition's event is committed by the second attempt, not found there as
// a duplicate of a partial first commit.
func TestLeaseExpiringBeforeTheInsertCommitsNothingOfTheAttempt(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	// Long enough that the first attempt reads the lease as valid, even on
	// a loaded machine.
	const ttl = 3 * time.Second
	acquired := time.Now()
	short, err := s.Acquire(ctx, 0, "worker-a.1", ttl)
	require.NoError(t, err)
	long, err := s.Acquire(ctx, 1, "worker-b.1", longTTL)
	require.NoError(t, err)

	attempts := 0
	hooked := fence.BeforeWrite(s, func() {
		attempts++
		if attempts == 1 {
			// The lease was valid when locked and read; let it run out.
			time.Sleep(time.Until(acquired.Add(ttl + 200*time.Millisecond)))
		}
	})
	events := []fence.Event{ev(short, "a", 1, "running"), ev(short, "a", 2, "done"), ev(long, "b", 1, "running")}
	res, err := hooked.Append(ctx, events)
	require.NoError(t, err)

	require.Equal(t, 2, attempts, "the first write must be refused and the batch run again")
	for _, r := range res[:2] {
		require.Equal(t, wire.VerdictStale, r.Verdict)
		require.Equal(t, wire.ReasonLeaseExpired, r.Reason)
	}
	require.Equal(t, wire.VerdictCommitted, res[2].Verdict, "a partial first commit would make this a duplicate")
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE partition = 0`))
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE partition = 1`))
	require.Equal(t, 2, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE partition = 0 AND reason = 'lease_expired'`))
}

func TestFenceCheckRaisesItsOwnSQLState(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, fence.Config{})
	ctx := context.Background()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT ledger.fence_check(3, 3)`).Scan(&ok))
	require.False(t, ok)
	err := db.Pool.QueryRow(ctx, `SELECT ledger.fence_check(3, 2)`).Scan(&ok)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "LF001", pgErr.Code)
	require.Contains(t, pgErr.Message, "2 of 3 events passed the fence")
}
