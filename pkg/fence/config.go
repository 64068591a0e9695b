package fence

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	// MaxNumberDigits is the most digits (integer and fraction, as written)
	// a number of a payload may have: 1000.
	MaxNumberDigits = 1000
	// MaxNumberExponent bounds the exponent of a number of a payload, as
	// written: -1000..1000. With MaxNumberDigits it keeps every accepted
	// number inside PostgreSQL's numeric range, and one number's text under
	// about 3000 bytes.
	MaxNumberExponent = 1000
	// MaxNumberGrowthSlack bounds, with the payload's own size, how much
	// longer PostgreSQL renders a payload's numbers, all together, than they
	// are written: 4 KiB. A payload's text as PostgreSQL renders it is then
	// at most about three times its size plus 4 KiB (jsonb adds a space
	// after each ':' and ',').
	MaxNumberGrowthSlack = 4096
	// StatementTimeoutDefault is the default of Config.StatementTimeout: 30 s.
	StatementTimeoutDefault = 30 * time.Second
	// AttemptTimeoutDefault is the default of Config.AttemptTimeout: 65 s,
	// a little over the two round trips of an append at the default
	// statement timeout, so that the database's own timeout, with its
	// clearer error, normally comes first.
	AttemptTimeoutDefault = 65 * time.Second
	// IdleInTransactionTimeoutDefault is the default of
	// Config.IdleInTransactionTimeout: 30 s.
	IdleInTransactionTimeoutDefault = 30 * time.Second
	// KeepAliveDefault is the default of Config.KeepAlive: 15 s.
	KeepAliveDefault = 15 * time.Second
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
	// SharedTasks lets any principal write any task. By default (false) a
	// task belongs to the principal that wrote its version 1, and another
	// principal's event on it is invalid (not_owner). A deployment whose
	// principals share tasks sets it knowingly.
	SharedTasks bool
	// StatementTimeout bounds each statement of an append or a takeover
	// (SET LOCAL statement_timeout), so that no statement holds lease rows
	// locked for long whatever it meets. A stricter one the session has
	// already is kept. Default 30 s; negative disables.
	StatementTimeout time.Duration
	// AttemptTimeout bounds each attempt of an append by the client's own
	// clock. The database bounds its statements (StatementTimeout), but a
	// connection that went silent, dropped by a proxy or a NAT without a
	// reset, answers nothing at all, and TCP keepalives do not notice
	// when something in between still answers them: the append, and the
	// ingest lane that waits for it, would wait for ever. Past it the
	// attempt fails with an error IsTransient accepts, the connection is
	// closed, and the caller tries again on another. Default 65 s;
	// negative disables.
	AttemptTimeout time.Duration
	// IdleInTransactionTimeout ends the session of an append or takeover
	// transaction that waits longer than this for its client (SET LOCAL
	// idle_in_transaction_session_timeout): a client behind a half-open
	// connection would otherwise keep its lease rows locked, and every
	// takeover of them waiting, until TCP gives up, which can take hours.
	// A stricter one the session has already is kept. Default 30 s;
	// negative disables.
	IdleInTransactionTimeout time.Duration
	// Primary, when set, refuses a superseded primary: every append checks
	// that its server writes on the newest timeline the guard knows
	// (primary.go). Give the same guard to GuardPool.
	Primary *PrimaryGuard
	// KeepAlive is the TCP keepalive idle time ConfigurePool sets on both
	// ends of a connection, so that a peer that vanished is noticed within
	// about twice this. Default 15 s; negative disables.
	KeepAlive time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Partitions = cmp.Or(c.Partitions, PartitionsDefault)
	c.TTL = cmp.Or(c.TTL, TTLDefault)
	c.MaxPayload = cmp.Or(c.MaxPayload, MaxPayloadDefault)
	c.HeadCacheSize = cmp.Or(c.HeadCacheSize, HeadCacheSizeDefault)
	c.MaxAhead = cmp.Or(c.MaxAhead, MaxAheadDefault)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, StatementTimeoutDefault)
	c.AttemptTimeout = cmp.Or(c.AttemptTimeout, AttemptTimeoutDefault)
	c.IdleInTransactionTimeout = cmp.Or(c.IdleInTransactionTimeout, IdleInTransactionTimeoutDefault)
	c.KeepAlive = cmp.Or(c.KeepAlive, KeepAliveDefault)
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
	for name, d := range map[string]time.Duration{"statement timeout": c.StatementTimeout, "attempt timeout": c.AttemptTimeout,
		"idle in transaction timeout": c.IdleInTransactionTimeout, "keepalive": c.KeepAlive} {
		if d > 0 && d < time.Millisecond {
			return fmt.Errorf("fence: %s must be at least 1 ms (or negative to disable), got %v", name, d)
		}
	}
	return nil
}

// ConfigurePool sets, on a pool's configuration, what keeps a connection
// that went half-open from holding lease rows locked: TCP keepalives on the
// client's socket and on the server's (tcp_keepalives_idle, _interval and
// _count: idle c.KeepAlive, then 3 probes c.KeepAlive/3 apart), and, as a
// backstop for transactions the Store does not run itself, the session's
// idle_in_transaction_session_timeout. Settings the connection string gives
// explicitly are kept. Zero fields of c take their defaults.
func ConfigurePool(pc *pgxpool.Config, c Config) {
	c = c.WithDefaults()
	params := pc.ConnConfig.RuntimeParams
	set := func(name string, value string) {
		if _, given := params[name]; !given {
			params[name] = value
		}
	}
	if c.IdleInTransactionTimeout > 0 {
		set("idle_in_transaction_session_timeout", strconv.FormatInt(c.IdleInTransactionTimeout.Milliseconds(), 10))
	}
	if c.KeepAlive <= 0 {
		return
	}
	idle := max(1, int64(c.KeepAlive/time.Second))
	interval := max(1, idle/3)
	set("tcp_keepalives_idle", strconv.FormatInt(idle, 10))
	set("tcp_keepalives_interval", strconv.FormatInt(interval, 10))
	set("tcp_keepalives_count", "3")
	d := &net.Dialer{Timeout: pc.ConnConfig.ConnectTimeout, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: c.KeepAlive, Interval: time.Duration(interval) * time.Second, Count: 3}}
	pc.ConnConfig.DialFunc = d.DialContext
}

// ms renders a timeout for set_config: milliseconds, "0" (off) if negative.
func ms(d time.Duration) string {
	if d < 0 {
		return "0"
	}
	return strconv.FormatInt(max(1, d.Milliseconds()), 10)
}
