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
	// NoWaitingCap switches off MaxWaitingPerPrincipal.
	NoWaitingCap bool
	// BlockingRoute makes route wait for room in its lane as long as it
	// takes, as it did before lanes could be stuck.
	BlockingRoute bool
}

// WithTestHooks returns cfg with the given test seams.
func WithTestHooks(cfg Config, h TestHooks) Config {
	cfg.hooks = &hooks{afterPublish: h.AfterPublish, beforeAppend: h.BeforeAppend,
		noEarlierCheck: h.NoEarlierCheck, noKeepAlive: h.NoKeepAlive, dropCopy: h.DropCopy,
		noWaitingCap: h.NoWaitingCap, blockingRoute: h.BlockingRoute}
	return cfg
}
