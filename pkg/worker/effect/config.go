package effect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Errors callers branch on.
var (
	// ErrInvalidConfig is returned by New for a configuration it cannot run.
	ErrInvalidConfig = errors.New("effect: invalid configuration")
	// ErrStarted is returned by Start on a runner already started.
	ErrStarted = errors.New("effect: runner already started")
)

// Defaults of Config.
const (
	// AckWaitDefault is how long the server waits for a delivery's ack (the
	// runner reports progress meanwhile) before delivering it again: 30 s.
	AckWaitDefault = 30 * time.Second
	// PinnedTTLDefault is how long an active runner that pulls nothing keeps
	// its pin before a standby is pinned: 10 s.
	PinnedTTLDefault = 10 * time.Second
	// RetryDelayDefault is the delay before a failed effect is delivered
	// again: 1 s.
	RetryDelayDefault = time.Second
	// MaxAckPendingDefault bounds the effects delivered and not yet acked: 256.
	MaxAckPendingDefault = 256
)

// Config configures a Runner.
type Config struct {
	// Name names the runner's durable consumer (effects-<Name>); every
	// process of one runner uses the same Name. 1..64 of [A-Za-z0-9_-].
	// Required.
	Name string
	// Types are the event types that are intents of this runner's effects;
	// other events are passed over. Required.
	Types []string
	// Partitions limits the runner to these partitions' logs; empty means
	// every partition. Changing it on a running consumer changes its
	// filter for every process of the runner.
	Partitions []int
	// Prefix is the subject prefix; default "ledger".
	Prefix string
	// AckWait defaults to AckWaitDefault.
	AckWait time.Duration
	// PinnedTTL defaults to PinnedTTLDefault; at least 2 s. It bounds the time effects
	// wait after the active runner dies before a standby takes over.
	PinnedTTL time.Duration
	// RetryDelay defaults to RetryDelayDefault.
	RetryDelay time.Duration
	// MaxAckPending defaults to MaxAckPendingDefault.
	MaxAckPending int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// BeforeAck, if set, is called after a handler returned nil and before
	// the ack. An error leaves the delivery unacked, as a crash at that
	// point would, so the effect is delivered again after AckWait. It is
	// for fault injection in tests; leave it nil in production.
	BeforeAck func(ctx context.Context, e Effect) error
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = wire.PrefixDefault
	}
	if c.AckWait == 0 {
		c.AckWait = AckWaitDefault
	}
	if c.PinnedTTL == 0 {
		c.PinnedTTL = PinnedTTLDefault
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = RetryDelayDefault
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = MaxAckPendingDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case !wire.ValidID(c.Name) || len(c.Name) > 64:
		return fmt.Errorf("%w: name %q is not 1..64 of [A-Za-z0-9_-]", ErrInvalidConfig, c.Name)
	case len(c.Types) == 0:
		return fmt.Errorf("%w: no event types", ErrInvalidConfig)
	case c.AckWait < 300*time.Millisecond:
		return fmt.Errorf("%w: ack wait %s is below 300ms", ErrInvalidConfig, c.AckWait)
	case c.PinnedTTL < 2*time.Second:
		// An idle runner pulls again every PinnedTTL/2 to keep its pin,
		// and a pull expires after 1 s at the least.
		return fmt.Errorf("%w: pinned TTL %s is below 2s", ErrInvalidConfig, c.PinnedTTL)
	case c.RetryDelay < 0 || c.MaxAckPending < 1:
		return fmt.Errorf("%w: negative retry delay or max ack pending below 1", ErrInvalidConfig)
	}
	for _, p := range c.Partitions {
		if p < 0 {
			return fmt.Errorf("%w: partition %d", ErrInvalidConfig, p)
		}
	}
	for _, t := range c.Types {
		if t == "" || len(t) > 64 {
			return fmt.Errorf("%w: event type %q", ErrInvalidConfig, t)
		}
	}
	return nil
}
