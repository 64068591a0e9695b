package fence

import (
	"fmt"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of Config.
const (
	// PartitionsDefault is the default partition count: 16.
	PartitionsDefault = wire.PartitionsDefault
	// TTLDefault is the default lease TTL: 3000 ms.
	TTLDefault = wire.TTLDefaultMillis * time.Millisecond
	// MaxPayloadDefault is the default largest payload: 256 KiB.
	MaxPayloadDefault = wire.MaxPayloadDefault
	// MaxPayloadDepth is the deepest nesting of a payload's arrays and objects
	// that is accepted; PostgreSQL's parser is recursive, and a deeper
	// document would fail the whole batch instead of one event.
	MaxPayloadDepth = 512
	// MaxAheadDefault is how far ahead of its task's head a version may be
	// and still wait for the versions between: 4096, four times the Go SDK's
	// in-flight limit per lease. A version further ahead is judged gap
	// (too_far_ahead) at once.
	MaxAheadDefault = 4096
)

// TTL bounds a request may ask for.
const (
	TTLMin = wire.TTLMinMillis * time.Millisecond
	TTLMax = wire.TTLMaxMillis * time.Millisecond
)

// Config configures a Store. The zero value is usable after WithDefaults.
type Config struct {
	// Partitions is the partition count N; partitions are 0..N-1. Default 16.
	Partitions int
	// TTL is the lease TTL used when a call passes none. Default 3000 ms.
	TTL time.Duration
	// MaxPayload is the largest payload in bytes. Default 256 KiB.
	MaxPayload int
	// HeadCacheSize is how many task heads the store remembers between
	// batches; default 100,000. -1 disables the cache.
	HeadCacheSize int
	// MaxAhead is how far ahead of its head a version may wait; default
	// 4096.
	MaxAhead int
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Partitions == 0 {
		c.Partitions = PartitionsDefault
	}
	if c.TTL == 0 {
		c.TTL = TTLDefault
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = MaxPayloadDefault
	}
	if c.HeadCacheSize == 0 {
		c.HeadCacheSize = HeadCacheSizeDefault
	}
	if c.MaxAhead == 0 {
		c.MaxAhead = MaxAheadDefault
	}
	return c
}

func (c Config) validate() error {
	if c.Partitions < 1 || c.Partitions > 1<<20 {
		return fmt.Errorf("fence: partitions must be 1..%d, got %d", 1<<20, c.Partitions)
	}
	if c.TTL < TTLMin || c.TTL > TTLMax {
		return fmt.Errorf("fence: TTL must be %v..%v, got %v", TTLMin, TTLMax, c.TTL)
	}
	if c.MaxPayload < 1 {
		return fmt.Errorf("fence: max payload must be positive, got %d", c.MaxPayload)
	}
	if c.MaxAhead < 1 {
		return fmt.Errorf("fence: max ahead must be at least 1, got %d", c.MaxAhead)
	}
	return nil
}
