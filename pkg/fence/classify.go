package fence

// The pure part of Append: deciding each event's outcome from what the
// database said (leases, heads, stored rows, recorded verdicts). No I/O
// happens here; classify_test.go tests it from tables alone.

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"strings"

	"github.com/flowness/ledger/pkg/canonjson"
	"github.com/flowness/ledger/pkg/wire"
)

// leaseState is a partition's lease as the append read it.
type leaseState struct {
	holder string
	gen    int64
	valid  bool
	// observe is the partition's fence mode (modes.go): read with the
	// lease, under its lock.
	observe bool
}

// taskHead is a task's partition and last committed version, and the seq
// of its version 1 (0 where unknown: a head this process cached).
type taskHead struct {
	partition int
	version   int64
	firstSeq  int64
	owner     string // the principal that wrote version 1; "" where unknown
	// snapshot is the task's kind (wire.KindSnapshot), pinned by its
	// first commit.
	snapshot bool
}

// stored is a committed row that shares a key with a batch event. A row
// found by event id in ledger.event_ids whose row was archived is not hot:
// only its seq is known.
type stored struct {
	c           Committed
	samePayload bool
	hot         bool
}

// horizon is what was archived, as ledger.horizon says: every event below
// belowSeq, and the ids minted before idFloor (the first 10 characters of
// a ULID, upper case; "" while nothing is archived).
type horizon struct {
	belowSeq int64
	idFloor  string
}

// beforeFloor reports whether event id was minted before the id floor:
// the ledger no longer holds such an id once its row is archived, so it
// must be looked up, and refused unless the hot log holds it.
func (z horizon) beforeFloor(id string) bool {
	return z.idFloor != "" && len(id) >= len(z.idFloor) && strings.ToUpper(id[:len(z.idFloor)]) < z.idFloor
}

// archivedHistory reports whether versions of a task whose version 1 has
// seq firstSeq are archived. A head this process cached knows no firstSeq;
// such a head is read again before a decision depends on it.
func (z horizon) archivedHistory(h taskHead) bool {
	return z.belowSeq > 1 && h.firstSeq < z.belowSeq
}

// existing holds, per position in batch.order, the rows found by event id
// and by (task, version), and whether the event was looked up at all.
type existing struct {
	byID, byTV *stored
	looked     bool
}

// plan is what an append will write.
type plan struct {
	commits []int       // events to insert, in order
	follows map[int]int // event → the planned commit it duplicates
	rejects []int       // events that get a new rejections row
	// from is, per task with commits, the head version the batch planned
	// its first commit from: the insert moves the head only from there.
	from map[string]int64
	// unchecked is set when an event that does not commit was decided
	// without a lookup of its id.
	unchecked bool
}

// state is what classify decides from.
type state struct {
	leases   map[int]leaseState
	heads    map[string]taskHead
	existing []existing
	recorded map[string]recorded
	horizon  horizon
}

// recorded is the verdict ledger.rejections holds for an event id.
type recorded struct {
	verdict wire.Verdict
	reason  string
}

// classify decides every valid event in the contract's order of checks. It
// does no I/O; later events see the batch's earlier planned commits.
func (s *Store) classify(b *batch, st state, res []Result) (plan, error) {
	heads, leases, ex := maps.Clone(st.heads), st.leases, st.existing
	type key struct {
		task    string
		version int64
	}
	p := plan{follows: map[int]int{}, from: map[string]int64{}}
	plannedID := map[string]int{}
	plannedTV := map[key]int{}
	rejectedID := map[string]int{} // event id → the first event of the batch given a new rejection

	for k, i := range b.order {
		e := &b.events[i]
		r := &res[i]
		h, known := heads[e.Task]
		l, leased := leases[e.Partition]
		*r = Result{CurrentGeneration: l.gen, CurrentHolder: l.holder, FenceMode: modeOf(l)}
		stale := ""
		if !s.hooks.unfenced {
			stale = staleReason(leased, l, e)
		}
		if stale != "" && observing(leased, l) {
			// The shadow fence: what enforce would answer is told, and the
			// event is decided on as if the fence held.
			r.WouldReject, stale = string(wire.VerdictStale)+"/"+stale, ""
		}
		x := ex[k]
		hotID := x.byID != nil && x.byID.hot
		jID, inID := plannedID[e.ID]
		jTV, inTV := plannedTV[key{e.Task, e.Version}]
		rec, hasRec := st.recorded[e.ID]
		jRej, inRej := rejectedID[e.ID]

		switch {
		// Finality: an id that is not committed but has a verdict keeps it.
		// A committed id is answered below as before (committed wins).
		case x.byID == nil && !inID && hasRec:
			r.Verdict, r.Reason, r.Repeat = rec.verdict, rec.reason, true
		case x.byID == nil && !inID && inRej:
			r.Verdict, r.Reason, r.Repeat = res[jRej].Verdict, res[jRej].Reason, true
		case known && h.partition != e.Partition:
			r.Verdict, r.Reason = wire.VerdictInvalid, wire.ReasonWrongPartition
			r.Detail = fmt.Sprintf("task %s is pinned to partition %d", e.Task, h.partition)
		case known && !s.cfg.SharedTasks && h.owner != "" && h.owner != wire.Principal(e.Holder):
			// Ownership: a task is its first writer's. Recorded, so that
			// the verdict lookup answers it; the owner never changes, so
			// every copy would get it again anyway.
			r.Verdict, r.Reason = wire.VerdictInvalid, wire.ReasonNotOwner
			r.Detail = fmt.Sprintf("task %s belongs to principal %s", e.Task, h.owner)
			p.rejects = append(p.rejects, i)
		case known && h.snapshot != e.Snapshot:
			// A task's kind is pinned by its first commit, like its
			// partition and owner. Recorded, as not_owner is.
			r.Verdict, r.Reason = wire.VerdictInvalid, wire.ReasonWrongKind
			r.Detail = fmt.Sprintf("task %s is a %s task; the event says %s", e.Task, kindName(h.snapshot), kindName(e.Snapshot))
			p.rejects = append(p.rejects, i)
		case hotID && sameStored(x.byID, e):
			r.Verdict, r.Reason, r.Seq, r.Committed = wire.VerdictDuplicate, wire.ReasonSameEventID, x.byID.c.Seq, withKind(x.byID.c, e)
		case x.byTV != nil && x.byTV.c.Type == e.Type && x.byTV.samePayload:
			r.Verdict, r.Reason, r.Seq, r.Committed = wire.VerdictDuplicate, wire.ReasonSameContent, x.byTV.c.Seq, withKind(x.byTV.c, e)
		case inID && sameEvent(b, jID, i):
			r.Reason, p.follows[i] = wire.ReasonSameEventID, jID
		case inTV && sameContent(b, jTV, i):
			r.Reason, p.follows[i] = wire.ReasonSameContent, jTV
		case x.byID == nil && !inID && !s.hooks.noIDFloor && st.horizon.beforeFloor(e.ID):
			// Not in the hot log, and minted before the floor: it may have
			// been committed and archived, with its id. It must not commit
			// a second time, and which it was cannot be told here.
			r.Verdict, r.Reason = wire.VerdictInvalid, wire.ReasonBeforeHorizon
			r.Detail = fmt.Sprintf("event id %s was minted before the archive horizon's id floor (%s)", e.ID, st.horizon.idFloor)
		case stale != "":
			r.Verdict, r.Reason = wire.VerdictStale, stale
			p.rejects = append(p.rejects, i)
		case x.byID != nil && !hotID:
			// The id is committed, in archived history: its content cannot
			// be compared, and nothing is written.
			r.Verdict, r.Reason = wire.VerdictConflict, wire.ReasonArchived
			r.Detail = fmt.Sprintf("event id %s is committed at seq %d, which is archived", e.ID, x.byID.c.Seq)
			p.rejects = append(p.rejects, i)
		case x.byID != nil || inID:
			r.Verdict, r.Reason = wire.VerdictConflict, wire.ReasonEventIDReused
			p.rejects = append(p.rejects, i)
		case x.byTV != nil || inTV:
			r.Verdict, r.Reason = wire.VerdictConflict, wire.ReasonVersionTaken
			p.rejects = append(p.rejects, i)
		case e.Version <= h.version && x.looked && h.firstSeq > 0 && st.horizon.archivedHistory(h):
			// The head says the version is committed, and the hot log does
			// not hold it: it is archived.
			r.Verdict, r.Reason = wire.VerdictConflict, wire.ReasonArchived
			r.Detail = fmt.Sprintf("version %d of task %s is committed in archived history (below seq %d)", e.Version, e.Task, st.horizon.belowSeq)
			p.rejects = append(p.rejects, i)
		case e.Snapshot && e.Version <= h.version && !b.fullLookup:
			// A snapshot task's version at or below its head that is not
			// stored was skipped, or the head came from the cache: decide
			// from heads read from the database.
			p.unchecked = true
		case e.Snapshot && e.Version <= h.version:
			// Skipped: a later snapshot is committed, and a snapshot task
			// never goes back.
			r.Verdict, r.Reason = wire.VerdictConflict, wire.ReasonOvertaken
			r.Detail = fmt.Sprintf("snapshot task %s is at version %d, past version %d", e.Task, h.version, e.Version)
			p.rejects = append(p.rejects, i)
		case e.Snapshot:
			// A snapshot rises above the head: it never waits for the
			// versions it skips.
			s.planCommit(&p, heads, h, e, i)
			plannedID[e.ID] = i
			plannedTV[key{e.Task, e.Version}] = i
			continue
		case e.Version > h.version+int64(s.cfg.MaxAhead):
			r.Verdict, r.Reason = wire.VerdictGap, wire.ReasonTooFarAhead
			p.rejects = append(p.rejects, i)
		case e.Version > h.version+1 && e.Final:
			r.Verdict, r.Reason = wire.VerdictGap, cmp.Or(e.GapReason, wire.ReasonGapTimeout)
			p.rejects = append(p.rejects, i)
		case e.Version > h.version+1:
			r.Verdict = NotYet
		case e.Version <= h.version && !b.fullLookup:
			// The head says the version is committed but its row was not
			// found, and the head came from the cache, which does not know
			// whether the task's history is archived: decide again from
			// heads read from the database.
			p.unchecked = true
		case e.Version <= h.version:
			// The head says the version is committed but its row was not
			// found: the reads straddled another writer's commit.
			return p, errRetryBatch
		default:
			s.planCommit(&p, heads, h, e, i)
			plannedID[e.ID] = i
			plannedTV[key{e.Task, e.Version}] = i
			continue
		}
		r.WouldReject = "" // only a commit can be one enforce would have refused
		if len(p.rejects) > 0 && p.rejects[len(p.rejects)-1] == i {
			if _, ok := rejectedID[e.ID]; !ok {
				rejectedID[e.ID] = i
			}
		}
		if !x.looked {
			p.unchecked = true
		}
	}
	return p, nil
}

// planCommit plans event i, of head h, as a commit, and moves the
// batch's view of its task's head onto it.
func (s *Store) planCommit(p *plan, heads map[string]taskHead, h taskHead, e *Event, i int) {
	p.commits = append(p.commits, i)
	if _, ok := p.from[e.Task]; !ok {
		p.from[e.Task] = h.version
	}
	heads[e.Task] = taskHead{partition: e.Partition, version: e.Version, firstSeq: h.firstSeq,
		owner: cmp.Or(h.owner, wire.Principal(e.Holder)), snapshot: e.Snapshot}
}

// withKind is a stored row's log copy, of the kind of the event that
// duplicates it: the kind check came first, so it is the task's.
func withKind(c Committed, e *Event) *Committed {
	c.Snapshot = e.Snapshot
	return &c
}

// kindName is a task kind's name in the contract.
func kindName(snapshot bool) string {
	if snapshot {
		return wire.KindSnapshot
	}
	return wire.KindEvents
}

// undoable reports whether a rejection the plan records could be
// contradicted by another append that commits the same event before this
// one commits: such a batch must decide under FOR UPDATE lease locks
// (doc.go, Finality). Under the shared locks (FOR KEY SHARE) no grant,
// revoke, mode change or renewal of an expired lease can happen, and heads,
// owners, kinds and committed ids only ever move one way, so most verdicts
// stand whatever another append does:
//
//   - stale/superseded and stale/not_holder: the event commits only under
//     a lease row of its own holder and generation, and the row's holder
//     and generation move only by a grant, which waits for the lock.
//   - invalid/not_owner and invalid/wrong_kind: a task's owner and kind
//     never change once it has a version.
//   - conflict: the event's id or (task, version) is committed with other
//     content, and a committed row stays; a snapshot head only rises.
//
// What remains may be undone: a gap (another append can commit the
// versions before it), no_lease (a first grant inserts the row, which no
// lock held) and lease_expired (a renewal may still extend the lease the
// reading found expired: renewals do not wait for shared locks). So a
// flood of another principal's events on a partition is recorded stale
// beside its holder's commits, never in front of them.
func (p plan) undoable(res []Result, all bool) bool {
	if all {
		return len(p.rejects) > 0
	}
	for _, i := range p.rejects {
		switch r := res[i]; r.Verdict {
		case wire.VerdictGap:
			return true
		case wire.VerdictStale:
			if r.Reason != wire.ReasonSuperseded && r.Reason != wire.ReasonNotHolder {
				return true
			}
		}
	}
	return false
}

// staleReason is the fence as classification sees it; the insert checks the
// same predicate again against the locked lease row.
func staleReason(leased bool, l leaseState, e *Event) string {
	switch {
	case !leased:
		return wire.ReasonNoLease
	case e.Generation < l.gen:
		return wire.ReasonSuperseded
	case e.Holder != l.holder || e.Generation != l.gen:
		return wire.ReasonNotHolder
	case !l.valid:
		return wire.ReasonLeaseExpired
	}
	return ""
}

func sameStored(st *stored, e *Event) bool {
	return st.c.Task == e.Task && st.c.Version == e.Version && st.c.Type == e.Type &&
		st.c.Partition == e.Partition && st.samePayload
}

func sameEvent(b *batch, j, i int) bool {
	return b.events[j].Task == b.events[i].Task && b.events[j].Version == b.events[i].Version &&
		b.events[j].Partition == b.events[i].Partition && sameContent(b, j, i)
}

func sameContent(b *batch, j, i int) bool {
	return b.events[j].Type == b.events[i].Type && bytes.Equal(b.canonical(j), b.canonical(i))
}

// canonical returns the canonical form of event i's payload (package
// canonjson), whose bytes are equal exactly when the payloads are equal as
// jsonb values; the work is linear in the payload, whatever its numbers.
func (b *batch) canonical(i int) []byte {
	if c, ok := b.canon[i]; ok {
		return c
	}
	c, err := canonjson.Append(nil, []byte(b.payloads[i]))
	if err != nil {
		// Unreachable: normalizePayload let only valid JSON through. Were it
		// reached, the payload would equal no other.
		c = append([]byte{0}, b.payloads[i]...)
	}
	if b.canon == nil {
		b.canon = map[int][]byte{}
	}
	b.canon[i] = c
	return c
}
