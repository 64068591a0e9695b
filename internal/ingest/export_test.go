package ingest

import (
	"context"

	"github.com/nats-io/nats.go"
)

// WithCrashAfterPublish returns cfg with a test hook that runs after a
// batch's log and dead-letter copies are stored and before any ack. When the
// hook returns false the batch is abandoned there, as if the process died.
func WithCrashAfterPublish(cfg Config, hook func() bool) Config {
	return WithTestHooks(cfg, TestHooks{AfterPublish: hook})
}

// TestHooks are the test seams of the service; each field switches one
// behaviour on or off.
type TestHooks struct {
	AfterPublish   func() bool
	BeforeAppend   func(ctx context.Context)
	NoEarlierCheck bool
	NoKeepAlive    bool
	// DropCopy, when it returns true, keeps a copy from being sent: its
	// publish ack never comes, as if the publish was lost.
	DropCopy func(m *nats.Msg) bool
	// NoWitness switches off the generation witness.
	NoWitness bool
	// NoTimelineWitness lets the primary guard take a newer timeline
	// before the witness records it: it learns it at the next beat.
	NoTimelineWitness bool
	// NoTimelineFollow leaves a running ingest to learn another's newer
	// timeline at its next beat only.
	NoTimelineFollow bool
	// NoMemoryCheck switches off the check that the database holds every
	// acknowledged commit.
	NoMemoryCheck bool
	// NoBatchDecode, NoBatchGapCheck and BatchAckOnReceive switch off the
	// batch message's decoding, its place in the gap check and its ack
	// after every event is durable.
	NoBatchDecode, NoBatchGapCheck, BatchAckOnReceive bool
	// StaleAcks settles a message taken before a reconnect to NATS like
	// any other.
	StaleAcks bool
	// NoLogExpectations publishes log copies without the sequence of the
	// copy before them.
	NoLogExpectations bool
	// OneRound publishes all of a batch's copies at once, a task's later
	// versions beside its first.
	OneRound bool
	// NoLookupBatches refuses a batch of verdict lookups as an ingest
	// older than the batch form does: invalid, unknown field "lookups".
	NoLookupBatches bool
	// NoRevive leaves a partition's consumer that vanished from the server
	// gone: its events in that inbox wait for ever.
	NoRevive bool
	// DropDirectGet keeps the memory check's request for LEDGER_LOG's
	// newest copies from being sent, as if it was lost with its server.
	DropDirectGet bool
	// LoseAppendAnswer, when it returns true, turns an append that
	// committed into a failure, as a connection cut before its answer
	// does: the ingest appends the batch again.
	LoseAppendAnswer func() bool
}

// WithTestHooks returns cfg with the given test seams.
func WithTestHooks(cfg Config, h TestHooks) Config {
	cfg.hooks = &hooks{afterPublish: h.AfterPublish, beforeAppend: h.BeforeAppend,
		noEarlierCheck: h.NoEarlierCheck, noKeepAlive: h.NoKeepAlive, dropCopy: h.DropCopy, noWitness: h.NoWitness, noTimelineWitness: h.NoTimelineWitness, noTimelineFollow: h.NoTimelineFollow,
		noMemoryCheck: h.NoMemoryCheck, noBatchDecode: h.NoBatchDecode, noBatchGapCheck: h.NoBatchGapCheck,
		batchAckOnReceive: h.BatchAckOnReceive, staleAcks: h.StaleAcks,
		noLogExpectations: h.NoLogExpectations, oneRound: h.OneRound,
		noLookupBatches: h.NoLookupBatches, noRevive: h.NoRevive, dropDirectGet: h.DropDirectGet,
		loseAppendAnswer: h.LoseAppendAnswer}
	return cfg
}

// Waiting is how many events wait in s's memory for an earlier version.
func Waiting(s *Service) int {
	s.parked.mu.Lock()
	defer s.parked.mu.Unlock()
	n := 0
	for _, k := range s.parked.by {
		n += k
	}
	return n
}
