package fence_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// archiveRig is a ledger with partitions of 100 rows, partitions 0..3
// leased, and an archive directory.
type archiveRig struct {
	db     *dbtest.DB
	s      *fence.Store
	leases []fence.Lease
	dir    string
	filled map[string]int64 // the heads of fill's tasks
}

const archivePartitionRows = 100

func newArchiveRig(t *testing.T) *archiveRig {
	db := dbtest.New(t)
	r := &archiveRig{db: db, s: smallPartitions(t, db, fence.Config{}, archivePartitionRows), dir: t.TempDir(),
		filled: map[string]int64{}}
	for p := range 4 {
		l, err := r.s.Acquire(context.Background(), p, fmt.Sprintf("writer.%d", p), 5*time.Minute)
		require.NoError(t, err)
		r.leases = append(r.leases, l)
	}
	return r
}

// sent is an event the test appended and saw committed, with its seq.
type sent struct {
	e   fence.Event
	seq int64
}

// row is a committed row as the hot log or the archive holds it.
type row struct {
	seq     int64
	id      string
	task    string
	version int64
	payload string
}

func (r *archiveRig) hotRows(t *testing.T) []row {
	rows, err := r.db.Pool.Query(context.Background(),
		`SELECT seq, event_id, task_id, version, payload::text FROM ledger.events ORDER BY seq`)
	require.NoError(t, err)
	var out []row
	for rows.Next() {
		var x row
		require.NoError(t, rows.Scan(&x.seq, &x.id, &x.task, &x.version, &x.payload))
		out = append(out, x)
	}
	require.NoError(t, rows.Err())
	return out
}

func (r *archiveRig) archivedRows(t *testing.T) ([]row, fence.Manifest) {
	var out []row
	m, err := fence.ReplayArchive(r.dir, func(c fence.Committed) error {
		out = append(out, row{seq: c.Seq, id: c.EventID, task: c.Task, version: c.Version, payload: string(c.Payload)})
		return nil
	})
	require.NoError(t, err)
	return out, m
}

func (r *archiveRig) horizon(t *testing.T) int64 {
	return int64(countRows(t, r.db, `SELECT below_seq FROM ledger.horizon`))
}

func (r *archiveRig) drawn(t *testing.T) int64 {
	return int64(countRows(t, r.db, `SELECT coalesce(max(seq), 0) FROM ledger.events`))
}

// writers append, until stop, batches of 1..8 events to tasks of their own
// (four per writer, on the writer's partition), each task version after
// version, and record what committed.
func (r *archiveRig) writers(t *testing.T, n int, stop *atomic.Bool) (wait func() []sent) {
	var wg sync.WaitGroup
	out := make([][]sent, n)
	errs := make([]error, n)
	for w := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			l := r.leases[w%len(r.leases)]
			next := map[string]int64{}
			for !stop.Load() {
				batch := make([]fence.Event, 1+rng.IntN(8))
				for i := range batch {
					task := fmt.Sprintf("w%d-t%d", w, rng.IntN(4))
					next[task]++
					batch[i] = ev(l, task, next[task], "step")
				}
				res, err := r.s.Append(context.Background(), batch)
				if err != nil {
					errs[w] = err
					return
				}
				refused := map[string]int64{} // per task, the version before its first refused event
				for i, x := range res {
					e := batch[i]
					if x.Verdict == wire.VerdictCommitted {
						out[w] = append(out[w], sent{e, x.Seq})
						continue
					}
					if err := r.refusedForTheFloor(e, x, refused); err != nil {
						errs[w] = err
						return
					}
				}
				for task, v := range refused {
					next[task] = v // the next batch sends the refused versions again, under new ids
				}
			}
		})
	}
	return func() []sent {
		wg.Wait()
		var all []sent
		for w := range n {
			require.NoError(t, errs[w], "writer %d", w)
			all = append(all, out[w]...)
		}
		return all
	}
}

// refusedForTheFloor says whether an event the writers saw refused was
// refused as it may be while the archive runs right behind them: an id
// minted before a horizon the archive raised while the event was on its way
// (invalid/before_horizon; the floor is the newest commit time archived, and
// a writer descheduled for longer than the last hundred commits took mints
// below it), or a later version of a task after such a refusal in the same
// batch (not yet committable). It records, per task, the version to send again from.
func (r *archiveRig) refusedForTheFloor(e fence.Event, x fence.Result, refused map[string]int64) error {
	if _, after := refused[e.Task]; after && (x.Verdict == fence.NotYet || x.Verdict == wire.VerdictGap) {
		return nil // a version after the refused one
	}
	if x.Verdict == wire.VerdictInvalid && x.Reason == wire.ReasonBeforeHorizon {
		var floor string
		if err := r.db.Pool.QueryRow(context.Background(), `SELECT id_floor FROM ledger.horizon`).Scan(&floor); err != nil {
			return err
		}
		if floor != "" && strings.ToUpper(e.ID[:len(floor)]) < floor {
			if _, after := refused[e.Task]; !after {
				refused[e.Task] = e.Version - 1
			}
			return nil
		}
	}
	return fmt.Errorf("event %s v%d: %s/%s %s", e.Task, e.Version, x.Verdict, x.Reason, x.Detail)
}

// checkArchive compares what the writers saw committed with the hot log
// and the archive: every event exactly once, in the archive exactly when
// its seq is below the horizon, with its task, version and payload, and
// every task's versions dense from 1 to its head.
func (r *archiveRig) checkArchive(t *testing.T, committed []sent) (archived, hot []row) {
	below := r.horizon(t)
	hot = r.hotRows(t)
	archived, m := r.archivedRows(t)
	require.NotEmpty(t, archived, "the archive moved nothing")
	require.NotEmpty(t, hot)

	var inFiles int64
	for _, f := range m.Files {
		inFiles += f.Rows
	}
	require.EqualValues(t, len(archived), inFiles, "the manifest counts the rows of its files")
	require.Equal(t, below, m.Horizon.BelowSeq, "the manifest states the horizon")

	got := map[string]row{}
	for _, x := range archived {
		require.Less(t, x.seq, below, "archived row %d is above the horizon", x.seq)
		_, twice := got[x.id]
		require.False(t, twice, "event %s is in the archive twice", x.id)
		got[x.id] = x
	}
	for _, x := range hot {
		require.GreaterOrEqual(t, x.seq, below, "hot row %d is below the horizon", x.seq)
		_, twice := got[x.id]
		require.False(t, twice, "event %s is both archived and hot, or hot twice", x.id)
		got[x.id] = x
	}
	require.Len(t, got, len(committed), "the hot log and the archive hold exactly the committed events")
	wantArchived := 0
	for _, c := range committed {
		x, ok := got[c.e.ID]
		require.True(t, ok, "committed event %s (seq %d) is neither hot nor archived", c.e.ID, c.seq)
		require.Equal(t, c.seq, x.seq)
		require.Equal(t, c.e.Task, x.task)
		require.Equal(t, c.e.Version, x.version)
		require.JSONEq(t, string(c.e.Payload), x.payload)
		if c.seq < below {
			wantArchived++
		}
	}
	require.Len(t, archived, wantArchived, "the archive holds exactly the rows below the horizon")

	byTask := map[string][]int64{}
	for _, x := range got {
		byTask[x.task] = append(byTask[x.task], x.version)
	}
	for task, vs := range byTask {
		slices.Sort(vs)
		for i, v := range vs {
			require.EqualValues(t, i+1, v, "task %s: versions dense", task)
		}
		h, err := r.s.TaskHead(context.Background(), task)
		require.NoError(t, err)
		require.EqualValues(t, len(vs), h.Version, "task %s: the head", task)
	}
	requireHeadsAgree(t, r.s, slices.Collect(maps.Keys(byTask)), wantArchived > 0)
	return archived, hot
}

// requireHeadsAgree checks that TaskHeads, many tasks at once, says of each
// task what TaskHead says of it alone, archived versions included; and,
// when someArchived, that some task has archived versions.
func requireHeadsAgree(t *testing.T, s *fence.Store, tasks []string, someArchived bool) {
	t.Helper()
	ctx := context.Background()
	archived := false
	for chunk := range slices.Chunk(tasks, fence.MaxTaskHeads) {
		heads, err := s.TaskHeads(ctx, chunk)
		require.NoError(t, err)
		require.Len(t, heads, len(chunk))
		for i, task := range chunk {
			one, err := s.TaskHead(ctx, task)
			require.NoError(t, err)
			require.Equal(t, one, heads[i], "task %s: TaskHeads and TaskHead agree", task)
			archived = archived || one.Archived > 0
		}
	}
	if someArchived {
		require.True(t, archived, "some task has archived versions")
	}
}

// The archive runs online: four writers keep committing while it moves
// partitions out, twice; afterwards the hot log and the files hold every
// committed event exactly once, the files exactly the rows below the
// horizon, and every task's versions are dense. Then every archived event
// is sent again, as it was and under a new id, and its id is reused for a
// new task: nothing commits a second time.
func TestArchiveWhileCommitting(t *testing.T) {
	t.Parallel()
	r := newArchiveRig(t)
	ctx := context.Background()
	var stop atomic.Bool
	wait := r.writers(t, 4, &stop)

	var reports []fence.ArchiveReport
	for _, at := range []int64{450, 900} {
		require.Eventually(t, func() bool { return r.drawn(t) >= at }, 60*time.Second, 5*time.Millisecond)
		rep, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: at - 100})
		require.NoError(t, err)
		require.NotEmpty(t, rep.Files, "archive at %d moved nothing", at)
		reports = append(reports, rep)
	}
	require.Eventually(t, func() bool { return r.drawn(t) >= 1100 }, 60*time.Second, 5*time.Millisecond)
	stop.Store(true)
	committed := wait()
	t.Logf("%d events committed; archived %d rows, then %d (horizon %d)", len(committed),
		reports[0].Rows, reports[1].Rows, reports[1].Horizon.BelowSeq)

	archived, hot := r.checkArchive(t, committed)
	require.Equal(t, countRows(t, r.db, `SELECT count(*) FROM ledger.event_partitions WHERE archived_at IS NOT NULL`),
		len(reports[0].Files)+len(reports[1].Files), "ledger.event_partitions records every archived partition")

	// Again, after the fact: as it was, under a new id, and its id reused.
	bySeq := map[int64]sent{}
	for _, c := range committed {
		bySeq[c.seq] = c
	}
	outcomes := map[string]int{}
	for i, x := range archived {
		c := bySeq[x.seq]
		fresh := c.e
		fresh.ID = newID()
		reused := ev(r.leases[i%4], fmt.Sprintf("new-%d", i), 1, "step")
		reused.ID = c.e.ID
		res, err := r.s.Append(ctx, []fence.Event{c.e, fresh, reused})
		require.NoError(t, err)
		for k, what := range []string{"as it was", "under a new id", "its id for a new task"} {
			require.Contains(t, []wire.Verdict{wire.VerdictConflict, wire.VerdictInvalid}, res[k].Verdict,
				"archived event seq %d sent again %s: %s/%s", x.seq, what, res[k].Verdict, res[k].Reason)
			require.Contains(t, []string{wire.ReasonArchived, wire.ReasonBeforeHorizon}, res[k].Reason)
			outcomes[what+": "+string(res[k].Verdict)+"/"+res[k].Reason]++
		}
		require.Equal(t, wire.ReasonArchived, res[1].Reason, "a version below the head is archived")
	}
	t.Logf("archived events sent again: %v", outcomes)
	require.Len(t, r.hotRows(t), len(hot), "nothing was committed again")
	r.checkArchive(t, committed)
}

// A task whose every version is archived keeps them: version 1 sent again
// under a new id is conflict/archived, the next version commits as 4, and
// TaskHead says versions 1..3 are archived. The negative control reads
// heads from the hot log, as before ledger.heads, and commits version 1 a
// second time.
func TestArchivedVersionsStayTaken(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "heads", true: "heads_from_log_control"}[control], func(t *testing.T) {
			t.Parallel()
			r := newArchiveRig(t)
			ctx := context.Background()
			var archived fence.Event
			for v := int64(1); v <= 3; v++ {
				e := ev(r.leases[0], "old", v, "step")
				require.Equal(t, wire.VerdictCommitted, appendOne(t, r.s, e).Verdict)
				if v == 1 {
					archived = e
				}
			}
			fill(t, r, 250)
			_, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
			require.NoError(t, err)
			require.Zero(t, countRows(t, r.db, `SELECT count(*) FROM ledger.events WHERE task_id = 'old'`))
			h, err := r.s.TaskHead(ctx, "old")
			require.NoError(t, err)
			require.EqualValues(t, 3, h.Version)
			require.EqualValues(t, 3, h.Archived, "versions 1..3 are archived")
			// A lookup of an archived row, by id alone and with content,
			// answers in a batch as alone.
			content := &fence.Content{Version: 1, Type: "step", Payload: archived.Payload}
			lookedUpAsAlone(t, r.s, []fence.Lookup{{Task: "old", EventID: archived.ID},
				{Task: "old", EventID: archived.ID, Content: content}})

			s := r.s
			if control {
				s = fence.HeadsFromLog(s)
			}
			again := appendOne(t, s, ev(r.leases[0], "old", 1, "step"))
			if control {
				require.Equal(t, wire.VerdictCommitted, again.Verdict,
					"with heads read from the hot log version 1 did not commit again: the test could not fail")
				return
			}
			require.Equal(t, wire.VerdictConflict, again.Verdict)
			require.Equal(t, wire.ReasonArchived, again.Reason)
			require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(r.leases[0], "old", 4, "step")).Verdict)
			require.Equal(t, 1, countRows(t, r.db, `SELECT count(*) FROM ledger.events WHERE task_id = 'old'`))
		})
	}
}

// An archived event's id, minted before the id floor, sent again for a new
// task is refused (invalid/before_horizon): the ledger no longer holds the
// id and must not commit it a second time. The negative control does not
// check the floor, and commits it.
func TestArchivedIDNeverCommitsAgain(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "floor", true: "no_floor_control"}[control], func(t *testing.T) {
			t.Parallel()
			r := newArchiveRig(t)
			ctx := context.Background()
			first := ev(r.leases[0], "first", 1, "step")
			require.Equal(t, wire.VerdictCommitted, appendOne(t, r.s, first).Verdict)
			time.Sleep(2 * time.Millisecond) // later events are minted in a later millisecond
			fill(t, r, 250)
			_, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
			require.NoError(t, err)
			require.Zero(t, countRows(t, r.db, `SELECT count(*) FROM ledger.event_ids WHERE event_id = $1`, first.ID),
				"the id left ledger.event_ids")

			s := r.s
			if control {
				s = fence.WithoutIDFloor(s)
			}
			reused := ev(r.leases[1], "elsewhere", 1, "step")
			reused.ID = first.ID
			got := appendOne(t, s, reused)
			if control {
				require.Equal(t, wire.VerdictCommitted, got.Verdict,
					"without the id floor the archived id did not commit again: the test could not fail")
				return
			}
			require.Equal(t, wire.VerdictInvalid, got.Verdict)
			require.Equal(t, wire.ReasonBeforeHorizon, got.Reason)
			rec, found, err := r.s.Verdict(ctx, "elsewhere", first.ID)
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, wire.ReasonBeforeHorizon, rec.Reason, "the lookup answers what an append gets")
			looked := lookedUpAsAlone(t, r.s, []fence.Lookup{{Task: "elsewhere", EventID: first.ID}})
			require.Equal(t, wire.ReasonBeforeHorizon, looked[0].Recorded.Reason)
			require.Zero(t, countRows(t, r.db, `SELECT count(*) FROM ledger.events WHERE event_id = $1`, first.ID))
		})
	}
}

// fill commits n events to tasks f-0..f-9 on partition 1.
func fill(t *testing.T, r *archiveRig, n int) {
	next := r.filled
	for done := 0; done < n; {
		batch := make([]fence.Event, min(50, n-done))
		for i := range batch {
			task := fmt.Sprintf("f-%d", (done+i)%10)
			next[task]++
			batch[i] = ev(r.leases[1], task, next[task], "fill")
		}
		res, err := r.s.Append(context.Background(), batch)
		require.NoError(t, err)
		for _, x := range res {
			require.Equal(t, wire.VerdictCommitted, x.Verdict)
		}
		done += len(batch)
	}
}

// A transaction that drew a seq of a partition and has not committed when
// the archive begins: the archive's detach waits for it, and its row is
// archived, not lost. The negative control reads the partition before the
// detach has waited, and loses the row.
func TestArchiveWaitsForRowsStillBeingWritten(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "detach_waits", true: "copy_first_control"}[control], func(t *testing.T) {
			t.Parallel()
			r := newArchiveRig(t)
			ctx := context.Background()
			fill(t, r, 250)
			first, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
			require.NoError(t, err)
			tx, err := r.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck
			var late int64
			require.NoError(t, tx.QueryRow(ctx, `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
				VALUES ($1, 2, 'late', 1, 'step', '{}', 'writer.2', 1, clock_timestamp()) RETURNING seq`, newID()).Scan(&late))
			require.True(t, late > 200 && late < 301, "seq %d", late)
			fill(t, r, 100) // the partition of the late row fills up and closes
			before := countRows(t, r.db, `SELECT count(*) FROM ledger.events WHERE seq < 301`)

			s := r.s
			if control {
				s = fence.ArchiveSeams(s, false, false, true)
			}
			done := make(chan struct{})
			var archErr error
			go func() {
				defer close(done)
				_, archErr = s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 301})
			}()
			require.True(t, waitDoneOrBlocked(t, r.db, done), "the archive did not wait for the open transaction")
			require.NoError(t, tx.Commit(ctx))
			<-done
			require.NoError(t, archErr)

			archived, _ := r.archivedRows(t)
			var found bool
			for _, x := range archived {
				found = found || x.seq == late
			}
			if control {
				require.False(t, found, "reading before the detach still archived the late row: the test could not fail")
				return
			}
			require.True(t, found, "the row committed while the archive waited is not in the archive")
			require.Len(t, archived, int(first.Rows)+before+1, "every row below seq 301, the late row among them")
		})
	}
}

// The archive reads every file back before it drops a partition. A file
// that lost a row stops the archive before the drop, with the rows still
// in the detached table, and the next run finishes the job. The negative
// control does not read back: the partition is dropped and the row is
// gone, which the test's own reading of the archive sees.
func TestArchiveChecksItsFilesBeforeItDrops(t *testing.T) {
	t.Parallel()
	t.Run("read_back", func(t *testing.T) {
		t.Parallel()
		r := newArchiveRig(t)
		ctx := context.Background()
		fill(t, r, 250)
		_, err := fence.ArchiveSeams(r.s, true, false, false).Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
		require.Error(t, err)
		require.Contains(t, err.Error(), "holds 99 rows, the partition 100")
		require.Zero(t, countRows(t, r.db, `SELECT count(*) FROM ledger.event_partitions WHERE archived_at IS NOT NULL`))
		require.Equal(t, 100, countRows(t, r.db, `SELECT count(*) FROM ledger.events_0000000000000000001`),
			"the rows wait in the detached table")

		rep, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
		require.NoError(t, err, "the next run finishes the partition left behind")
		require.EqualValues(t, 200, rep.Rows)
		archived, _ := r.archivedRows(t)
		require.Len(t, archived, 200)
		for i, x := range archived {
			require.EqualValues(t, i+1, x.seq)
		}
	})
	t.Run("unchecked_control", func(t *testing.T) {
		t.Parallel()
		r := newArchiveRig(t)
		ctx := context.Background()
		fill(t, r, 250)
		_, err := fence.ArchiveSeams(r.s, true, true, false).Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
		require.NoError(t, err)
		archived, _ := r.archivedRows(t)
		require.Len(t, archived, 198, "two first rows lost, and nothing noticed: the test's reading sees it")
		require.EqualValues(t, 2, archived[0].seq)
	})
}

// A horizon the newest partition does not pass archives nothing, and a
// dry run changes nothing.
func TestArchiveLeavesTheOpenPartition(t *testing.T) {
	t.Parallel()
	r := newArchiveRig(t)
	ctx := context.Background()
	fill(t, r, 150)
	rep, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 1_000_000})
	require.NoError(t, err)
	require.Len(t, rep.Files, 1, "only the full partition; the one still drawing seqs stays")
	require.EqualValues(t, 101, rep.Horizon.BelowSeq)
	rep, err = r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, Before: time.Now().Add(time.Hour), DryRun: true})
	require.NoError(t, err)
	require.Empty(t, rep.Files)
	_, err = r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir})
	require.ErrorContains(t, err, "give a horizon")
	require.Equal(t, 50, countRows(t, r.db, `SELECT count(*) FROM ledger.events`))
}

// An append that read the horizon before an archive moved it plans an
// archived id as new: its insert must still refuse it. The append reads,
// stops before its write while the archive moves the horizon and drops the
// id's partition, then writes: the insert finds the id minted before the
// new floor (ledger.ids_check), the batch is decided again, and the event
// is refused. The negative control has no floor at all, and commits the id
// a second time.
func TestAppendRacingAnArchiveDoesNotCommitAnArchivedID(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "floor", true: "no_floor_control"}[control], func(t *testing.T) {
			t.Parallel()
			r := newArchiveRig(t)
			ctx := context.Background()
			first := ev(r.leases[0], "first", 1, "step")
			require.Equal(t, wire.VerdictCommitted, appendOne(t, r.s, first).Verdict)
			time.Sleep(2 * time.Millisecond)
			fill(t, r, 250)

			read, write := make(chan struct{}), make(chan struct{})
			var once sync.Once
			s := fence.BeforeWrite(r.s, func() {
				once.Do(func() {
					close(read)
					<-write
				})
			})
			if control {
				s = fence.WithoutIDFloor(s)
			}
			reused := ev(r.leases[1], "elsewhere", 1, "step")
			reused.ID = first.ID
			got := make(chan fence.Result, 1)
			go func() {
				res, err := s.Append(ctx, []fence.Event{reused})
				if err != nil {
					t.Error(err)
					close(got)
					return
				}
				got <- res[0]
			}()
			<-read
			_, err := r.s.Archive(ctx, fence.ArchiveOptions{Dir: r.dir, BeforeSeq: 201})
			idsLeft := countRows(t, r.db, `SELECT count(*) FROM ledger.event_ids WHERE event_id = $1`, first.ID)
			close(write)
			require.NoError(t, err)
			require.Zero(t, idsLeft, "the archive removed the id")
			res := <-got
			if control {
				require.Equal(t, wire.VerdictCommitted, res.Verdict,
					"without the floor the archived id did not commit again: the test could not fail")
				return
			}
			require.Equal(t, wire.VerdictInvalid, res.Verdict)
			require.Equal(t, wire.ReasonBeforeHorizon, res.Reason)
			require.Zero(t, countRows(t, r.db, `SELECT count(*) FROM ledger.events WHERE event_id = $1`, first.ID))
		})
	}
}
