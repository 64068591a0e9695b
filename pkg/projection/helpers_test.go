package projection

import (
	"encoding/json"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is the injected clock of the tests: time moves only when told.
type fakeClock struct{ now time.Time }

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// helperT is what the helpers need of *testing.T, *testing.B and *rapid.T.
type helperT interface {
	require.TestingT
	Helper()
}

// newEngine returns an engine on a fake clock with the given config.
func newEngine(t helperT, cfg Config) (*Engine, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	cfg.Now = clock.Now
	e, err := New(cfg)
	require.NoError(t, err)
	return e, clock
}

// loaded returns newEngine with the given tasks loaded as new.
func loaded(t helperT, cfg Config, tasks ...string) (*Engine, *fakeClock) {
	t.Helper()
	e, clock := newEngine(t, cfg)
	for _, id := range tasks {
		require.NoError(t, e.Load(State{Task: id}))
	}
	return e, clock
}

// ev builds an event; Seq is derived from the version so tests can check it.
func ev(task string, version int64, typ, payload string) Event {
	return Event{Task: task, Partition: 3, Version: version, Seq: 1000 + version, Type: typ, Payload: json.RawMessage(payload)}
}

// offer offers an event and requires it to succeed with the given outcome.
func offer(t helperT, e *Engine, event Event, want Outcome) Result {
	t.Helper()
	res, err := e.Offer(event)
	require.NoError(t, err)
	require.Equal(t, want, res.Outcome, "offer %s v%d", event.Task, event.Version)
	return res
}

// dataString renders State.Data for comparisons, nil as null.
func dataString(d json.RawMessage) string {
	if len(d) == 0 {
		return "null"
	}
	return string(d)
}
