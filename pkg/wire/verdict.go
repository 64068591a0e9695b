package wire

// Verdict is the final outcome of one inbound message (docs/contract.md §3).
type Verdict string

// The verdicts, in the order in which they are checked.
const (
	VerdictInvalid   Verdict = "invalid"
	VerdictDuplicate Verdict = "duplicate"
	VerdictStale     Verdict = "stale"
	VerdictConflict  Verdict = "conflict"
	VerdictGap       Verdict = "gap"
	VerdictCommitted Verdict = "committed"
)

// Final reports whether v is one of the contract's verdicts.
func (v Verdict) Final() bool {
	switch v {
	case VerdictInvalid, VerdictDuplicate, VerdictStale, VerdictConflict, VerdictGap, VerdictCommitted:
		return true
	}
	return false
}

// Reasons that accompany a verdict. Stale reasons and wrong_partition are
// named by the contract; the rest are this implementation's, documented in
// docs/contract.md.
const (
	// Stale: the fence failed.
	ReasonSuperseded   = "superseded"    // generation < current
	ReasonNotHolder    = "not_holder"    // holder (or a generation from the future) does not match
	ReasonLeaseExpired = "lease_expired" // holder and generation match but the lease expired
	ReasonNoLease      = "no_lease"      // the partition was never leased

	// Conflict.
	ReasonVersionTaken  = "version_taken"   // (task, version) is committed with other content
	ReasonEventIDReused = "event_id_reused" // the event id is committed with other content
	ReasonArchived      = "archived"        // the event id or (task, version) is committed in archived history
	ReasonOvertaken     = "overtaken"       // a snapshot task's head is past this version, which was never committed

	// Duplicate.
	ReasonSameEventID = "same_event_id" // the event id is already committed
	ReasonSameContent = "same_content"  // (task, version) is committed with identical content

	// Gap.
	ReasonGapTimeout     = "gap_timeout"      // the missing versions did not arrive within the window
	ReasonTooFarAhead    = "too_far_ahead"    // the version is so far ahead of the head that it is judged at once
	ReasonTooManyWaiting = "too_many_waiting" // the holder already has the most events allowed waiting for earlier versions

	// Invalid.
	ReasonWrongPartition  = "wrong_partition"
	ReasonNotOwner        = "not_owner"  // the task belongs to another principal
	ReasonWrongKind       = "wrong_kind" // the task is of another kind (events or snapshot) than the event says
	ReasonBadKind         = "bad_kind"   // Ledger-Kind is neither events nor snapshot
	ReasonBadSubject      = "bad_subject"
	ReasonBadPartition    = "bad_partition"
	ReasonBadTask         = "bad_task_id"
	ReasonMissingEventID  = "missing_event_id"
	ReasonBadEventID      = "bad_event_id"
	ReasonBadHolder       = "bad_holder"
	ReasonMissingGen      = "missing_generation"
	ReasonBadGeneration   = "bad_generation"
	ReasonMissingVersion  = "missing_version"
	ReasonBadVersion      = "bad_version"
	ReasonMissingType     = "missing_type"
	ReasonBadType         = "bad_type"
	ReasonBadPayload      = "bad_payload"
	ReasonPayloadTooLarge = "payload_too_large"
	ReasonRepeatedHeader  = "repeated_header"
	ReasonHeadersTooLarge = "headers_too_large"
	ReasonHolderMismatch  = "holder_mismatch" // Ledger-Holder differs from the subject's holder
	ReasonBeforeHorizon   = "before_horizon"  // the event id was minted before the archive horizon's id floor
)
