package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/flowness/ledger/pkg/canonjson"
	"github.com/flowness/ledger/pkg/wire"
)

// Recorded is the final verdict the ledger recorded for one event id.
type Recorded struct {
	EventID string
	// Verdict is committed, stale, conflict or gap: the verdicts that leave
	// a row behind.
	Verdict wire.Verdict
	// Reason qualifies a rejection (wire.Reason*); empty for committed.
	Reason string
	// Seq is the committed row's position in the log; 0 for a rejection.
	Seq int64
}

// Verdict returns the final verdict recorded for event eventID of task, and
// false if none is: the event has not been judged yet (it may still wait in
// LEDGER_IN), or its verdict leaves no row under its id (invalid, or a
// duplicate of identical content committed under another id). A committed
// row answers before any rejection of the same id: the event is in the log
// whatever an earlier copy of it was told. Only rows of task count, so an
// id reused under another task never answers for this one.
func (s *Store) Verdict(ctx context.Context, task, eventID string) (Recorded, bool, error) {
	rec := Recorded{EventID: eventID}
	switch {
	case !wire.ValidID(task):
		return rec, false, leaseErr(ErrInvalid, nil, "task id %.40q is not 1..128 of [A-Za-z0-9_-]", task)
	case !wire.ValidEventID(eventID):
		return rec, false, leaseErr(ErrInvalid, nil, "event id %.40q is not a ULID", eventID)
	}
	var verdict string
	err := s.pool.QueryRow(ctx, sqlEventVerdict, eventID, task, string(wire.VerdictInvalid), wire.ReasonBeforeHorizon).
		Scan(&verdict, &rec.Reason, &rec.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("fence: look up the verdict of event %s of task %s: %w", eventID, task, err)
	}
	rec.Verdict = wire.Verdict(verdict)
	return rec, true, nil
}

// Content is an event's content as its publisher sent it: what VerdictFor
// compares with what the ledger stored under the id.
type Content struct {
	Version int64
	Type    string
	// Payload is the body as published; empty means null.
	Payload []byte
}

// VerdictFor is Verdict for the event with content c, as its publisher
// sent it. A committed id answers committed only when the ledger stored
// that content (same version and type, payloads equal as JSON values);
// other content gets the verdict the ledger gives any copy of it,
// conflict/event_id_reused, and an id whose row is archived, where content
// can no longer be compared, conflict/archived. So a lookup never answers
// committed for content the ledger did not store. A nil c is Verdict.
func (s *Store) VerdictFor(ctx context.Context, task, eventID string, c *Content) (Recorded, bool, error) {
	rec, found, err := s.Verdict(ctx, task, eventID)
	if err != nil || !found || c == nil || rec.Verdict != wire.VerdictCommitted {
		return rec, found, err
	}
	var (
		version int64
		typ     string
		payload []byte
	)
	err = s.pool.QueryRow(ctx, sqlEventContent, rec.Seq).Scan(&version, &typ, &payload)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Recorded{EventID: eventID, Verdict: wire.VerdictConflict, Reason: wire.ReasonArchived}, true, nil
	case err != nil:
		return rec, false, fmt.Errorf("fence: read the content of event %s of task %s: %w", eventID, task, err)
	}
	if version != c.Version || typ != c.Type || !samePayload(c.Payload, payload) {
		return Recorded{EventID: eventID, Verdict: wire.VerdictConflict, Reason: wire.ReasonEventIDReused}, true, nil
	}
	return rec, true, nil
}

// samePayload reports whether a payload as published equals a stored one
// as jsonb compares them; a payload that is not JSON equals none.
func samePayload(sent, stored []byte) bool {
	if len(sent) == 0 {
		sent = jsonNull
	}
	eq, err := canonjson.Equal(sent, stored)
	return err == nil && eq
}

// Lookup is one verdict lookup of a batch (VerdictsFor): event EventID of
// Task, with its content as sent, or nil to answer for the id alone.
type Lookup struct {
	Task, EventID string
	Content       *Content
}

// Looked is the answer to one Lookup: the task's head and the verdict
// recorded for the event, if Found.
type Looked struct {
	Head     Head
	Recorded Recorded
	Found    bool
}

// MaxLookups is the most lookups one VerdictsFor call may ask for.
const MaxLookups = MaxTaskHeads

// VerdictsFor answers lookups, in order, each as TaskHead and VerdictFor
// answer it alone, in one round trip to the database: after a loss a
// worker has thousands of events to look up, and one statement for all
// costs the database about what one lookup does.
func (s *Store) VerdictsFor(ctx context.Context, lookups []Lookup) ([]Looked, error) {
	if len(lookups) > MaxLookups {
		return nil, leaseErr(ErrInvalid, nil, "%d lookups asked for at once; at most %d", len(lookups), MaxLookups)
	}
	out := make([]Looked, len(lookups))
	tasks, ids := make([]string, len(lookups)), make([]string, len(lookups))
	for i, l := range lookups {
		switch {
		case !wire.ValidID(l.Task):
			return nil, leaseErr(ErrInvalid, nil, "task id %.40q is not 1..128 of [A-Za-z0-9_-]", l.Task)
		case !wire.ValidEventID(l.EventID):
			return nil, leaseErr(ErrInvalid, nil, "event id %.40q is not a ULID", l.EventID)
		}
		tasks[i], ids[i] = l.Task, l.EventID
		out[i] = Looked{Head: Head{Task: l.Task}, Recorded: Recorded{EventID: l.EventID}}
	}
	if len(lookups) == 0 {
		return out, nil
	}
	pb := &pgx.Batch{}
	pb.Queue(sqlTaskHeads, tasks)
	pb.Queue(sqlEventVerdicts, ids, tasks, string(wire.VerdictInvalid), wire.ReasonBeforeHorizon)
	br := s.pool.SendBatch(ctx, pb)
	defer br.Close()
	if err := scanHeads(br, out); err != nil {
		return nil, err
	}
	if err := scanVerdicts(br, lookups, out); err != nil {
		return nil, err
	}
	return out, br.Close()
}

// scanHeads reads sqlTaskHeads' rows into out's heads.
func scanHeads(br pgx.BatchResults, out []Looked) error {
	rows, _ := br.Query()
	var ord int64
	var h Head
	_, err := pgx.ForEachRow(rows, []any{&ord, &h.Partition, &h.Version, &h.Seq, &h.Type, &h.Owner, &h.Kind}, func() error {
		if ord < 1 || ord > int64(len(out)) {
			return fmt.Errorf("a head for position %d of %d", ord, len(out))
		}
		h.Task, h.Known = out[ord-1].Head.Task, true
		out[ord-1].Head = h
		return nil
	})
	if err != nil {
		return fmt.Errorf("fence: heads of %d lookups: %w", len(out), err)
	}
	return nil
}

// scanVerdicts reads sqlEventVerdicts' rows into out and judges each
// committed one's content as VerdictFor does.
func scanVerdicts(br pgx.BatchResults, lookups []Lookup, out []Looked) error {
	rows, _ := br.Query()
	var (
		ord          int64
		verdict      string
		rec          Recorded
		version      *int64
		typ, payload *string
	)
	_, err := pgx.ForEachRow(rows, []any{&ord, &verdict, &rec.Reason, &rec.Seq, &version, &typ, &payload}, func() error {
		if ord < 1 || ord > int64(len(out)) {
			return fmt.Errorf("a verdict for position %d of %d", ord, len(out))
		}
		rec.EventID, rec.Verdict = lookups[ord-1].EventID, wire.Verdict(verdict)
		out[ord-1].Recorded, out[ord-1].Found = judged(rec, lookups[ord-1].Content, version, typ, payload), true
		return nil
	})
	if err != nil {
		return fmt.Errorf("fence: verdicts of %d lookups: %w", len(out), err)
	}
	return nil
}

// judged is rec as a lookup with content c answers it: VerdictFor's rule
// on the committed row's content (nil: the row is archived).
func judged(rec Recorded, c *Content, version *int64, typ, payload *string) Recorded {
	switch {
	case c == nil || rec.Verdict != wire.VerdictCommitted:
		return rec
	case version == nil || typ == nil || payload == nil:
		return Recorded{EventID: rec.EventID, Verdict: wire.VerdictConflict, Reason: wire.ReasonArchived}
	case *version != c.Version || *typ != c.Type || !samePayload(c.Payload, []byte(*payload)):
		return Recorded{EventID: rec.EventID, Verdict: wire.VerdictConflict, Reason: wire.ReasonEventIDReused}
	}
	return rec
}
