package projection

import (
	"cmp"
	"fmt"
	"time"
)

// Defaults for Config.
const (
	// GapTimeoutDefault is how long a task waits at a missing version before
	// it is due for a re-fetch, and how long between repeated requests.
	GapTimeoutDefault = 5 * time.Second
	// MaxBufferedPerTaskDefault caps the events buffered for one task.
	MaxBufferedPerTaskDefault = 1024
	// MaxBufferedDefault caps the events buffered across all tasks.
	MaxBufferedDefault = 100_000
	// MaxBufferedBytesDefault caps the payload bytes buffered across all
	// tasks (64 MiB).
	MaxBufferedBytesDefault = 64 << 20
	// DedupWindowDefault is how many of its last applied versions a task
	// remembers well enough to tell a duplicate from a conflict.
	DedupWindowDefault = 64
	// MaxTasksDefault is how many tasks Trim keeps resident.
	MaxTasksDefault = 100_000
)

// Config configures an Engine. The zero value is usable: WithDefaults fills
// every zero field.
type Config struct {
	// GapTimeout is how long a task may wait at a missing version before
	// DueRefetches reports it, and the wait between two reports of the same
	// task. Default GapTimeoutDefault (5s).
	GapTimeout time.Duration

	// MaxBufferedPerTask caps the events buffered for one task. Default
	// MaxBufferedPerTaskDefault (1024).
	MaxBufferedPerTask int

	// MaxBuffered caps the events buffered across all tasks. Default
	// MaxBufferedDefault (100_000).
	MaxBuffered int

	// MaxBufferedBytes caps the payload bytes buffered across all tasks.
	// Default MaxBufferedBytesDefault (64 MiB).
	MaxBufferedBytes int

	// DedupWindow is how many of its last applied versions a task remembers
	// by content fingerprint (16 bytes each; up to twice as many are kept
	// between compactions). A repeat of an older version is
	// OutcomeUnverified. Default DedupWindowDefault (64).
	DedupWindow int

	// MaxTasks is how many resident tasks Trim keeps. Tasks that wait for a
	// gap or a catch-up are never evicted, so it is a soft cap. Default
	// MaxTasksDefault (100_000).
	MaxTasks int

	// Now is the engine's clock: gap timing, GapInfo.Since and
	// State.UpdatedAt. Default time.Now.
	Now func() time.Time

	// Reducer folds events into state. Default MergeReducer{}.
	Reducer Reducer
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.GapTimeout = cmp.Or(c.GapTimeout, GapTimeoutDefault)
	c.MaxBufferedPerTask = cmp.Or(c.MaxBufferedPerTask, MaxBufferedPerTaskDefault)
	c.MaxBuffered = cmp.Or(c.MaxBuffered, MaxBufferedDefault)
	c.MaxBufferedBytes = cmp.Or(c.MaxBufferedBytes, MaxBufferedBytesDefault)
	c.DedupWindow = cmp.Or(c.DedupWindow, DedupWindowDefault)
	c.MaxTasks = cmp.Or(c.MaxTasks, MaxTasksDefault)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Reducer == nil {
		c.Reducer = MergeReducer{}
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.GapTimeout < 0:
		return fmt.Errorf("%w: GapTimeout %v is negative", ErrInvalidConfig, c.GapTimeout)
	case c.MaxBufferedPerTask < 0:
		return fmt.Errorf("%w: MaxBufferedPerTask %d is negative", ErrInvalidConfig, c.MaxBufferedPerTask)
	case c.MaxBuffered < 0:
		return fmt.Errorf("%w: MaxBuffered %d is negative", ErrInvalidConfig, c.MaxBuffered)
	case c.MaxBufferedBytes < 0:
		return fmt.Errorf("%w: MaxBufferedBytes %d is negative", ErrInvalidConfig, c.MaxBufferedBytes)
	case c.DedupWindow < 0:
		return fmt.Errorf("%w: DedupWindow %d is negative", ErrInvalidConfig, c.DedupWindow)
	case c.MaxTasks < 0:
		return fmt.Errorf("%w: MaxTasks %d is negative", ErrInvalidConfig, c.MaxTasks)
	case c.MaxBufferedPerTask > c.MaxBuffered:
		return fmt.Errorf("%w: MaxBufferedPerTask %d exceeds MaxBuffered %d", ErrInvalidConfig, c.MaxBufferedPerTask, c.MaxBuffered)
	}
	return nil
}
