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
