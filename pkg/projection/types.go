package projection

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Errors that callers branch on with errors.Is. They are returned wrapped,
// with the task and version in the message.
var (
	// ErrConflict reports a version that arrived with a type or payload that
	// differs from the copy already applied or buffered. The copy seen first
	// wins; the conflicting one is never applied.
	ErrConflict = errors.New("projection: conflicting content for version")

	// ErrNotLoaded reports an Offer for a task that is not resident. The owner
	// loads the stored state with Load (State{Task: id} when there is none)
	// and offers again. The engine does not assume "new task" on its own,
	// because a task evicted at version 40 would otherwise restart at 0.
	ErrNotLoaded = errors.New("projection: task not loaded")

	// ErrInvalidEvent reports an event that cannot be ordered: empty task id,
	// version below 1, or a payload that is not valid JSON.
	ErrInvalidEvent = errors.New("projection: invalid event")

	// ErrInvalidState reports a State given to Load that cannot be resumed
	// from: empty task id, negative version, or data that is not valid JSON.
	ErrInvalidState = errors.New("projection: invalid state")

	// ErrReduce reports that the Reducer failed on the next version. The
	// version is not applied and the task waits there: it is re-fetched
	// after the gap timeout and tried again, never skipped.
	ErrReduce = errors.New("projection: reducer failed")

	// ErrInvalidConfig reports a Config that New cannot use.
	ErrInvalidConfig = errors.New("projection: invalid config")
)

// Event is one committed event of a task, as read from LEDGER_LOG or
// re-fetched from the events table.
type Event struct {
	// Task is the task id (the KV key).
	Task string
	// Partition is the partition the task is pinned to; the state takes it
	// from each applied event.
	Partition int
	// Version is the event's position in its task, 1, 2, 3...
	Version int64
	// Seq is the event's global position in the committed log.
	Seq int64
	// Type is the event type; it becomes the task's status.
	Type string
	// Payload is the event's JSON payload; empty means null. The engine may
	// keep it (buffered, or as the task's data), so the caller must not modify
	// it after offering it.
	Payload json.RawMessage
	// Snapshot marks an event of a snapshot task (docs/contract.md §14):
	// a complete state. It is applied as soon as its version is above the
	// task's, whatever versions it skips; an older one is never applied.
	Snapshot bool
}

// GapInfo describes a task that waits for a missing version. It is the "gap"
// member of the KV value.
type GapInfo struct {
	// NextVersion is the version the task waits for: its version + 1.
	NextVersion int64 `json:"next_version"`
	// Buffered is how many later versions are held until it arrives.
	Buffered int `json:"buffered"`
	// Since is when the engine began waiting at NextVersion, by its own
	// clock; event timestamps play no part.
	Since time.Time `json:"since"`
}

// State is a task's projection, marshalled as the KV value of bucket
// ledger_tasks (docs/contract.md §6):
//
//	{"task","partition","version","status","data","seq","updated_at","gap"}
//
// Version 0 with status "" and null data is a task with nothing applied yet.
type State struct {
	// Task is the task id.
	Task string `json:"task"`
	// Partition is the task's partition.
	Partition int `json:"partition"`
	// Version is the last applied version; 0 if none.
	Version int64 `json:"version"`
	// Status is the type of the last applied event (by the default reducer).
	Status string `json:"status"`
	// Data is the payloads merged in version order (by the default reducer).
	// Nil marshals as null. Treat it as immutable: the engine shares it.
	Data json.RawMessage `json:"data"`
	// Seq is the Seq of the last applied event.
	Seq int64 `json:"seq"`
	// UpdatedAt is the engine's clock when this state last changed.
	UpdatedAt time.Time `json:"updated_at"`
	// Gap is nil unless a later version waits for an earlier one.
	Gap *GapInfo `json:"gap"`
	// DataTooLarge is 0 (and left out of the JSON) unless the value was
	// stored without its data because the data did not fit in a bucket
	// value: then Data is null and DataTooLarge is the data's size in bytes,
	// while Version, Status and Seq stay exact (docs/contract.md §6). The Engine never
	// sets it and never loads such a State: it always holds the true data.
	DataTooLarge int `json:"data_too_large,omitempty"`
	// Kind is "snapshot" for a snapshot task, whose Data is its newest
	// snapshot (docs/contract.md §14); empty (and left out of the JSON)
	// for a task applied event by event.
	Kind string `json:"kind,omitempty"`
}

// WithoutData returns st as stored when its data does not fit in a bucket
// value: Data null and DataTooLarge the size of the data.
func (st State) WithoutData() State {
	st.DataTooLarge, st.Data = len(st.Data), nil
	return st
}

// Outcome says what Offer did with an event.
type Outcome string

// The outcomes of Offer.
const (
	// OutcomeApplied: the event was the next version and is applied, with any
	// buffered versions that directly follow it.
	OutcomeApplied Outcome = "applied"
	// OutcomeBuffered: a later version arrived early and waits for the
	// missing ones.
	OutcomeBuffered Outcome = "buffered"
	// OutcomeDuplicate: the version was already applied or buffered with the
	// same content; nothing changed.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeUnverified: the version is already applied but older than the
	// engine remembers (beyond Config.DedupWindow, or from before Load), so
	// it cannot tell a duplicate from a conflict. Nothing changed. It is
	// almost always a redelivery: the log holds one content per version.
	OutcomeUnverified Outcome = "unverified"
	// OutcomeConflict: the version is known with different content; the
	// error wraps ErrConflict. Nothing changed.
	OutcomeConflict Outcome = "conflict"
	// OutcomeDeferred: the event could not be buffered (a buffer cap was hit,
	// or the task is already catching up), so it was dropped and the task is
	// due for a catch-up re-fetch that covers it.
	OutcomeDeferred Outcome = "deferred"
	// OutcomeRejected: the event could not be used: its payload is not JSON
	// (the error wraps ErrInvalidEvent) or the Reducer failed (ErrReduce).
	// Nothing was applied; if the task still needs that version it is due
	// for a catch-up re-fetch, so the version is read again, not skipped.
	OutcomeRejected Outcome = "rejected"
)

// Result is what Offer did. It is meaningful even when Offer also returns an
// error: write State whenever Changed is set.
type Result struct {
	// Outcome classifies the offered event.
	Outcome Outcome
	// Applied is how many versions this call applied: the offered one and
	// the buffered ones it unblocked.
	Applied int
	// Changed reports that State differs from before the call (new version,
	// or new gap information), so the owner should write it to KV.
	Changed bool
	// State is the task's state after the call, gap included.
	State State
}

// Refetch asks the owner to read versions of a task from the events table
// and offer them, in version order, through Offer.
type Refetch struct {
	// Task is the task id.
	Task string
	// Partition is the task's partition, as far as the engine knows it.
	Partition int
	// FromVersion is the first missing version: the task's version + 1.
	FromVersion int64
	// ToVersion is the last missing version (the lowest buffered one - 1),
	// or 0 for a catch-up: every version from FromVersion on.
	ToVersion int64
	// CatchUp marks a read of everything after the task's version, asked for
	// when buffered events had to be dropped (see OutcomeDeferred).
	CatchUp bool
}

// Stats are gauges for metrics.
type Stats struct {
	// Tasks is the number of resident tasks.
	Tasks int
	// Waiting is the number of tasks with a gap or a pending catch-up.
	Waiting int
	// Buffered is the number of buffered events across tasks.
	Buffered int
	// BufferedBytes is the payload bytes of the buffered events.
	BufferedBytes int
}

// Reducer folds one event into a task's state. The engine calls it only
// with the next version (ev.Version == state.Version + 1), with a payload
// that is valid JSON. It decides Status and Data; the engine then sets Task,
// Partition, Version, Seq, UpdatedAt and Gap itself. It must not modify
// state.Data in place, because earlier States share it.
type Reducer interface {
	Reduce(state State, ev Event) (State, error)
}

// ReducerFunc adapts a function to Reducer.
type ReducerFunc func(state State, ev Event) (State, error)

// Reduce calls f.
func (f ReducerFunc) Reduce(state State, ev Event) (State, error) { return f(state, ev) }

// MergeReducer is the contract's reducer, the default: status is the type of
// the last applied event and data is the payloads merged in version order as
// RFC 7386 merge patches (an object patches the data; anything else, null
// included, replaces it).
type MergeReducer struct{}

// Reduce applies ev's payload to state.Data with MergePatch. state.Data must
// be valid JSON (the Engine's always is); the payload is checked.
func (r MergeReducer) Reduce(state State, ev Event) (State, error) {
	if len(ev.Payload) > 0 && !wire.ValidJSON(ev.Payload) {
		return state, ErrInvalidJSON
	}
	return r.reduce(state, ev, nil), nil
}

// reduce is Reduce for a payload known to be valid JSON. The Engine calls it
// directly: its fingerprint has validated the payload already, and the
// second check would cost a sixth of the apply path.
// The merger m, if not nil, is the Engine's own, which spares it the pool.
func (MergeReducer) reduce(state State, ev Event, m *merger) State {
	state.Status = ev.Type
	if m == nil {
		state.Data = mergePatch(trimSpace(state.Data), trimSpace(ev.Payload))
	} else {
		state.Data = m.merge(trimSpace(state.Data), trimSpace(ev.Payload))
	}
	return state
}
