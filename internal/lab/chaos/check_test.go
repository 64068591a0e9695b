package chaos

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// story builds small histories by hand: partition 0, writers w-a and w-b,
// tasks t1 and t2. Times are milliseconds from an arbitrary origin.
type story struct {
	h     *History
	w     map[string]*WriterLog
	sent  map[string]Record
	seq   int64
	clock time.Time
}

func newStory() *story {
	s := &story{h: &History{Projections: map[string][]byte{}}, w: map[string]*WriterLog{}, sent: map[string]Record{},
		clock: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	for _, holder := range []string{"w-a", "w-b"} {
		p := 0
		wl := &WriterLog{Name: holder, Holder: holder, Partition: 0, Tasks: []string{"t1", "t2"},
			Records: []Record{{Kind: KindStart, T: s.at(0), Holder: holder, Partition: &p, Tasks: []string{"t1", "t2"}}}}
		s.w[holder] = wl
		s.h.Writers = append(s.h.Writers, wl)
	}
	return s
}

func (s *story) at(ms int64) int64 {
	return s.clock.Add(time.Duration(ms) * time.Millisecond).UnixNano()
}

func (s *story) log(holder string, r Record) {
	s.w[holder].Records = append(s.w[holder].Records, r)
}

// grant: holder's grant of gen was acknowledged at ms, and recorded.
func (s *story) grant(holder string, gen, ms int64) {
	s.log(holder, Record{Kind: KindGrant, T: s.at(ms), Sent: s.at(ms - 1), Gen: gen})
	s.h.Grants = append(s.h.Grants, GrantRow{Partition: 0, Generation: gen, Holder: holder, GrantedAt: time.Unix(0, s.at(ms-1))})
}

// send: holder published id at ms; acked one millisecond later unless
// acked is false.
func (s *story) send(holder, id, task string, version, gen, ms int64, acked bool) {
	r := Record{Kind: KindPub, T: s.at(ms), ID: id, Task: task, Version: version, Gen: gen, Type: "running", Try: 1}
	s.log(holder, r)
	r.Holder = holder
	s.sent[id] = r
	if acked {
		s.log(holder, Record{Kind: KindAck, T: s.at(ms + 1), ID: id, Seq: uint64(ms)})
	} else {
		s.log(holder, Record{Kind: KindNack, T: s.at(ms + 1000), ID: id, Err: "timeout"})
	}
}

// commit records id as committed (next seq) and stores its log copy.
func (s *story) commit(id string) {
	r := s.sent[id]
	s.seq++
	payload, _ := json.Marshal(map[string]any{"id": id, "v": r.Version})
	e := EventRow{Seq: s.seq, EventID: id, Partition: 0, Task: r.Task, Version: r.Version, Type: r.Type,
		Payload: payload, Holder: r.Holder, Generation: r.Gen, CommittedAt: time.Unix(0, r.T+int64(2*time.Millisecond))}
	s.h.Events = append(s.h.Events, e)
	s.copyOf(id)
}

// copyOf stores (again) the LEDGER_LOG copy of committed id.
func (s *story) copyOf(id string) {
	for _, e := range s.h.Events {
		if e.EventID == id {
			s.h.Log = append(s.h.Log, Copy{StreamSeq: uint64(len(s.h.Log) + 1), Subject: "ledger.log.0." + e.Task,
				EventID: id, Task: e.Task, Partition: 0, Version: e.Version, Seq: e.Seq, Type: e.Type,
				Holder: e.Holder, Generation: e.Generation})
		}
	}
}

// reject records a rejection row and its dead letter.
func (s *story) reject(id, verdict, reason string) {
	r := s.sent[id]
	s.h.Rejections = append(s.h.Rejections, RejectionRow{EventID: id, Task: r.Task, Version: r.Version, Holder: r.Holder,
		Generation: r.Gen, Verdict: verdict, Reason: reason, RejectedAt: time.Unix(0, r.T)})
	s.letter(id, verdict, reason)
}

func (s *story) letter(id, verdict, reason string) {
	r := s.sent[id]
	s.h.DLQ = append(s.h.DLQ, Letter{StreamSeq: uint64(len(s.h.DLQ) + 1), Subject: "ledger.dlq.0." + r.Task, EventID: id,
		Task: r.Task, Version: r.Version, Holder: r.Holder, Generation: r.Gen, Verdict: verdict, Reason: reason})
}

// project stores every task's fold as its bucket value.
func (s *story) project(t *testing.T) {
	byTask := map[string][]EventRow{}
	for _, e := range s.h.Events {
		byTask[e.Task] = append(byTask[e.Task], e)
	}
	for task, evs := range byTask {
		st, err := Fold(task, evs)
		require.NoError(t, err)
		b, err := json.Marshal(st)
		require.NoError(t, err)
		s.h.Projections[task] = b
	}
}

// takeover is the clean story: w-a writes t1 v1..v2 under generation 1 and
// is paused; w-b takes over (generation 2) and writes v3; w-a wakes and
// sends v3 as a zombie, which the fence refuses; one copy is stored twice
// and one dead letter is stored twice (both allowed).
func takeover(t *testing.T) *story {
	s := newStory()
	s.grant("w-a", 1, 100)
	s.send("w-a", "e1", "t1", 1, 1, 110, true)
	s.send("w-a", "e2", "t1", 2, 1, 120, true)
	s.grant("w-b", 2, 2000)
	s.send("w-b", "e3", "t1", 3, 2, 2010, true)
	s.send("w-a", "e4", "t1", 3, 1, 2500, true)
	s.commit("e1")
	s.commit("e2")
	s.copyOf("e2")
	s.commit("e3")
	s.reject("e4", "stale", "superseded")
	s.letter("e4", "stale", "superseded")
	s.project(t)
	return s
}

func counts(r *Report) map[ViolationKind]int {
	out := map[ViolationKind]int{}
	for k, n := range r.Counts {
		if n > 0 {
			out[k] = n
		}
	}
	return out
}

func TestCheckerPassesACleanTakeover(t *testing.T) {
	t.Parallel()
	r := Check(takeover(t).h)
	assert.Empty(t, counts(r), "%+v", r.Violations)
	assert.Equal(t, 4, r.Events)
	assert.Equal(t, 4, r.Acked)
	assert.Equal(t, 3, r.Commits)
	assert.Equal(t, 1, r.Rejections["stale"])
	assert.Equal(t, 2, r.Grants)
	assert.Equal(t, 1, r.StaleSends, "the zombie's send after w-b's grant")
}

func TestCheckerFindsEachViolation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// mutate turns the clean story into a broken one.
		mutate func(t *testing.T, s *story)
		want   map[ViolationKind]int
		// detail is in the first violation's detail.
		detail string
	}{
		{"an acked event without a verdict is lost", func(t *testing.T, s *story) {
			s.send("w-b", "e5", "t2", 1, 2, 2100, true)
		}, map[ViolationKind]int{Lost: 1}, "no row, rejection or dead letter"},

		{"a zombie's send after the takeover that commits is a stale commit", func(t *testing.T, s *story) {
			s.send("w-a", "e5", "t2", 1, 1, 2510, true)
			s.commit("e5")
			s.project(t)
		}, map[ViolationKind]int{StaleCommit: 1}, "generation 2's grant was acknowledged"},

		{"a hole in a task's versions is not dense", func(t *testing.T, s *story) {
			s.send("w-b", "e5", "t2", 1, 2, 2100, true)
			s.send("w-b", "e6", "t2", 2, 2, 2110, true)
			s.send("w-b", "e7", "t2", 3, 2, 2120, true)
			s.commit("e5")
			s.commit("e7")
			s.reject("e6", "conflict", "version_taken")
			s.project(t)
			// The log then lacks version 2 too: a hole is out of order.
		}, map[ViolationKind]int{NotDense: 1, LogOutOfOrder: 1}, "committed versions are 1,3, not 1..2"},

		{"a committed event that is also dead-lettered has two verdicts", func(t *testing.T, s *story) {
			s.letter("e3", "conflict", "version_taken")
		}, map[ViolationKind]int{MultiVerdict: 1}, "verdicts committed, conflict/version_taken"},

		{"two different rejections of one event are two verdicts", func(t *testing.T, s *story) {
			s.h.Rejections = append(s.h.Rejections, RejectionRow{EventID: "e4", Task: "t1", Version: 3, Holder: "w-a",
				Generation: 1, Verdict: "stale", Reason: "lease_expired"})
		}, map[ViolationKind]int{MultiVerdict: 1}, "stale/superseded, stale/lease_expired"},

		{"a gap after an acked predecessor of the same writer is a fault turned into a verdict", func(t *testing.T, s *story) {
			s.send("w-b", "e5", "t1", 4, 2, 2100, true)
			s.send("w-b", "e6", "t1", 5, 2, 2110, true)
			s.commit("e5")
			s.reject("e6", "gap", "gap_timeout")
			s.project(t)
		}, map[ViolationKind]int{FaultGap: 1}, "version 5 judged gap though w-b had version 4 acked"},

		{"a projection that is not the fold of the log differs", func(t *testing.T, s *story) {
			s.h.Projections["t1"] = []byte(strings.Replace(string(s.h.Projections["t1"]), `"status":"running"`, `"status":"completed"`, 1))
		}, map[ViolationKind]int{ProjectionDiffers: 1}, "status completed, want running"},

		{"a projection behind the log differs", func(t *testing.T, s *story) {
			st, err := Fold("t1", s.h.Events[:2])
			require.NoError(t, err)
			s.h.Projections["t1"], _ = json.Marshal(st)
		}, map[ViolationKind]int{ProjectionDiffers: 1}, "version 2, want 3"},

		{"a projection that still waits for a version differs", func(t *testing.T, s *story) {
			s.h.Projections["t1"] = []byte(strings.Replace(string(s.h.Projections["t1"]), `"gap":null`,
				`"gap":{"next_version":4,"buffered":1}`, 1))
		}, map[ViolationKind]int{ProjectionDiffers: 1}, "want null"},

		{"a committed task without a projection differs", func(t *testing.T, s *story) {
			delete(s.h.Projections, "t1")
		}, map[ViolationKind]int{ProjectionDiffers: 1}, "no value in the bucket"},

		{"a version stored before its predecessor is out of order", func(t *testing.T, s *story) {
			s.h.Log[0], s.h.Log[1] = s.h.Log[1], s.h.Log[0]
		}, map[ViolationKind]int{LogOutOfOrder: 1}, "version 2 stored at stream seq 2 before version 1"},

		{"a committed version missing from the log is out of order", func(t *testing.T, s *story) {
			s.h.Log = s.h.Log[:len(s.h.Log)-1]
		}, map[ViolationKind]int{LogOutOfOrder: 1}, "LEDGER_LOG ends at version 2; ledger.events at 3"},

		{"a copy that is not its row is out of order", func(t *testing.T, s *story) {
			s.h.Log[2].Seq = 99 // the second copy of e2
		}, map[ViolationKind]int{LogOutOfOrder: 1}, "seq 99"},

		{"a rejection of an event no writer sent is unknown", func(t *testing.T, s *story) {
			s.h.Rejections = append(s.h.Rejections, RejectionRow{EventID: "ghost", Task: "t2", Version: 1, Verdict: "stale", Reason: "no_lease"})
		}, map[ViolationKind]int{Unknown: 1}, "no writer sent it"},

		{"a dead letter that does not read is unknown", func(t *testing.T, s *story) {
			s.h.DLQ[0].Err = "header Ledger-Verdict: \"maybe\" is not a verdict"
		}, map[ViolationKind]int{Unknown: 1}, "does not read"},

		{"a grant recorded for another holder is a generation given twice", func(t *testing.T, s *story) {
			s.h.Grants[1].Holder = "w-c"
		}, map[ViolationKind]int{GenerationTwice: 1}, "generation 2 was granted to w-b and w-c"},

		{"one generation acknowledged to two writers is given twice", func(t *testing.T, s *story) {
			s.log("w-a", Record{Kind: KindGrant, T: s.at(3000), Sent: s.at(2999), Gen: 2})
		}, map[ViolationKind]int{GenerationTwice: 1}, "generation 2 was granted to w-b and w-a"},

		{"a grant nobody recorded outside a forgetful window is unknown", func(t *testing.T, s *story) {
			s.h.Grants = s.h.Grants[:1]
		}, map[ViolationKind]int{Unknown: 1}, `records ""`},

		{"a committed receipt whose row is gone is receipted_missing", func(t *testing.T, s *story) {
			s.log("w-b", Record{Kind: KindReceipt, T: s.at(2020), ID: "e3", Task: "t1", Version: 3, Gen: 2,
				Verdict: "committed", Seq: 3})
			s.h.Events = s.h.Events[:2]
			s.h.Log = s.h.Log[:3]
			s.project(t)
		}, map[ViolationKind]int{Lost: 1, ReceiptedMissing: 1}, "no row, rejection or dead letter"},

		{"a committed receipt whose row has another seq is receipted_missing", func(t *testing.T, s *story) {
			s.log("w-b", Record{Kind: KindReceipt, T: s.at(2020), ID: "e3", Task: "t1", Version: 3, Gen: 2,
				Verdict: "committed", Seq: 7})
		}, map[ViolationKind]int{ReceiptedMissing: 1}, "holds it at seq 3"},

		{"what an old primary committed and granted is a superseded commit", func(t *testing.T, s *story) {
			s.h.SupersededEvents = []EventRow{{Seq: 9, EventID: "e4", Task: "t1", Version: 3, Generation: 1}}
			s.h.SupersededGrants = []GrantRow{{Partition: 0, Generation: 2, Holder: "w-a"}}
		}, map[ViolationKind]int{SupersededCommit: 2}, "committed on a superseded primary"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := takeover(t)
			tc.mutate(t, s)
			r := Check(s.h)
			assert.Equal(t, tc.want, counts(r), "%+v", r.Violations)
			require.NotEmpty(t, r.Violations)
			assert.Contains(t, r.Violations[0].Detail, tc.detail)
		})
	}
}

func TestCheckerAcceptsWhatTheLedgerMayDo(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(t *testing.T, s *story)
	}{
		{"an unacked event may have no verdict", func(t *testing.T, s *story) {
			s.send("w-b", "e5", "t2", 1, 2, 2100, false)
		}},
		{"a zombie's send before the takeover was acknowledged may commit", func(t *testing.T, s *story) {
			s.send("w-a", "e5", "t2", 1, 1, 1999, true)
			s.commit("e5")
			s.project(t)
		}},
		{"a grant given while the database could forget may be missing from lease_grants", func(t *testing.T, s *story) {
			s.h.Grants = s.h.Grants[:1]
			s.h.Forgetful = [][2]int64{{s.at(1500), s.at(2500)}}
		}},
		{"a gap whose predecessor was never acked is the writer's doing", func(t *testing.T, s *story) {
			s.send("w-b", "e5", "t1", 4, 2, 2100, false)
			s.send("w-b", "e6", "t1", 5, 2, 2110, true)
			s.reject("e6", "gap", "gap_timeout")
		}},
		{"a gap whose predecessor another writer sent is not this writer's fault", func(t *testing.T, s *story) {
			s.send("w-a", "e5", "t1", 4, 1, 2100, true)
			s.reject("e5", "stale", "superseded")
			s.send("w-b", "e6", "t1", 5, 2, 2110, true)
			s.reject("e6", "gap", "gap_timeout")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := takeover(t)
			tc.mutate(t, s)
			r := Check(s.h)
			assert.Empty(t, counts(r), "%+v", r.Violations)
		})
	}
}

func TestViolationsArePrintedWithTheirHistory(t *testing.T) {
	t.Parallel()
	s := takeover(t)
	s.send("w-a", "e5", "t2", 1, 1, 2510, true)
	s.commit("e5")
	s.project(t)
	r := Check(s.h)
	var b strings.Builder
	PrintViolations(&b, s.h, r, 3)
	out := b.String()
	assert.Contains(t, out, "stale_commits=1")
	assert.Contains(t, out, "event e5")
	assert.Contains(t, out, "w-a pub t2 v1 gen 1 try 1", "the writer's send")
	assert.Contains(t, out, "ledger.events seq 4 t2 v1", "the committed row")
	assert.Contains(t, out, "w-b grant of generation 2 acknowledged", "the grant it came after")

	line := SummaryLine(90*time.Second, r, []FaultCount{{FaultSigstop, 3}, {FaultPGRestart, 1}}, 0)
	assert.Equal(t, fmt.Sprintf("chaos: 1m30s events=5 commits=4 rejections={stale:1 gap:0 conflict:0 invalid:0} grants=2 "+
		"stale_sends=2 receipt_p50=0s receipt_p99=0s faults={sigstop:3 pg_restart:1} exits=0 violations=%d", r.Total()), line)
	assert.Equal(t, fmt.Sprintf("chaos check: events=5 commits=4 rejections={stale:1 gap:0 conflict:0 invalid:0} grants=2 "+
		"stale_sends=2 receipt_p50=0s receipt_p99=0s violations=%d", r.Total()), CheckLine(r))
}

// The receipt percentiles are taken from each event's first publish to its
// first receipt.
func TestReceiptPercentilesAreFromFirstPublishToFirstReceipt(t *testing.T) {
	t.Parallel()
	s := takeover(t)
	for i, ms := range []int64{10, 20, 30, 40, 500} {
		id := fmt.Sprintf("r%d", i)
		s.send("w-b", id, "t1", int64(10+i), 2, 3000, true)
		s.log("w-b", Record{Kind: KindReceipt, T: s.at(3000 + ms), ID: id})
		s.log("w-b", Record{Kind: KindReceipt, T: s.at(9000), ID: id}) // a second receipt does not count
	}
	r := Check(s.h)
	require.Equal(t, 30*time.Millisecond, r.ReceiptP50)
	require.Equal(t, 500*time.Millisecond, r.ReceiptP99)
}

// effectStory is a history whose downstream was read: intents e1 and e2
// committed, and the downstream's applied effects as given.
func effectStory(effects ...EffectRow) *History {
	h := &History{Projections: map[string][]byte{}, EffectsRead: true, Effects: effects}
	for i, id := range []string{"e1", "e2"} {
		h.Events = append(h.Events, EventRow{Seq: int64(i + 1), EventID: id, Task: "t1", Version: int64(i + 1),
			Type: effectType, Holder: "w-a", Generation: 1})
	}
	return h
}

func TestEffectViolations(t *testing.T) {
	t.Parallel()
	logRow := func(seq int64, id string) EffectRow {
		return EffectRow{Seq: seq, EventID: id, Path: pathLog, Holder: "w-a", Generation: 1}
	}
	direct := func(seq int64, id, holder string, gen int64) EffectRow {
		return EffectRow{Seq: seq, EventID: id, Path: pathDirect, Holder: holder, Generation: gen}
	}
	for _, c := range []struct {
		name    string
		effects []EffectRow
		want    map[ViolationKind]int
	}{
		{"every intent applied, direct effects in generation order",
			[]EffectRow{logRow(1, "e1"), direct(2, "e1", "w-a", 1), direct(3, "x", "w-b", 2), logRow(4, "e2")}, nil},
		{"committed intent without an applied effect",
			[]EffectRow{logRow(1, "e1"), direct(2, "e2", "w-a", 1)}, map[ViolationKind]int{IntentWithoutEffect: 1}},
		{"direct effect of a superseded holder applied",
			[]EffectRow{logRow(1, "e1"), logRow(2, "e2"), direct(3, "x", "w-b", 2), direct(4, "y", "w-a", 1)},
			map[ViolationKind]int{SupersededEffect: 1}},
		{"a log-path effect of an older generation is no violation",
			[]EffectRow{direct(1, "x", "w-b", 2), logRow(2, "e1"), logRow(3, "e2")}, nil},
	} {
		r := Check(effectStory(c.effects...))
		got := map[ViolationKind]int{}
		for _, k := range []ViolationKind{SupersededEffect, IntentWithoutEffect} {
			if r.Counts[k] > 0 {
				got[k] = r.Counts[k]
			}
		}
		want := c.want
		if want == nil {
			want = map[ViolationKind]int{}
		}
		assert.Equal(t, want, got, c.name)
		assert.Equal(t, 2, r.Intents, c.name)
		assert.True(t, r.EffectsChecked, c.name)
	}
}
