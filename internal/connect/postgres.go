package connect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/pkg/fence"
)

// ErrNoDatabase is returned when no database URL was given.
var ErrNoDatabase = errors.New("no database: set DATABASE_URL or -database-url")

// ErrTransactionPooler is returned, and /readyz fails with it, when the
// pool's connections share server sessions (a pooler in transaction mode:
// PgBouncer's pool_mode = transaction, RDS Proxy) while the pool names
// its prepared statements: they would clash on the shared sessions.
var ErrTransactionPooler = errors.New("PostgreSQL is reached through a transaction-mode pooler, " +
	"which cannot keep named prepared statements: remove default_query_exec_mode from DATABASE_URL " +
	"(the ledger then picks cache_describe), set it to cache_describe or exec, or run the pooler in session mode")

// Session is what Postgres learned about the sessions behind its pool.
type Session struct {
	// Pooled reports that two client connections shared one server
	// session: a pooler in transaction mode is in between.
	Pooled bool
	// Proxied reports that a pooler or proxy is in between, in any mode:
	// the process id the server announced at connect is not the session's
	// own (PgBouncer, RDS Proxy and their kind hand out keys of their own).
	Proxied bool
	// ExecMode is the pool's query execution mode: pgx's statement cache,
	// or cache_describe behind a pooler unless the URL chose.
	ExecMode pgx.QueryExecMode
	// ParamsRefused reports that the server (a pooler) refused the
	// session settings sent at connect (tcp_keepalives_*,
	// idle_in_transaction_session_timeout), so none is sent; ParamsDropped
	// that it accepted and ignored them (PgBouncer's
	// ignore_startup_parameters).
	ParamsRefused, ParamsDropped bool
	// IdleInTransaction is the idle_in_transaction_session_timeout the
	// sessions run with: the smaller of the ledger's (30 s) and the one
	// the server sets for the role or database, or the server's alone
	// when the session settings do not reach it. 0: none.
	IdleInTransaction time.Duration
}

// Postgres opens a pool and checks that the server answers. The pool's
// connections carry fence.ConfigurePool's defaults: TCP keepalives on both
// ends (15 s) and idle_in_transaction_session_timeout (30 s, or the
// server's own if it is stricter), so that a connection gone half-open
// holds no lock for long, whichever service it belongs to; the connection
// string may override each.
//
// Poolers are recognised before the pool is made (o.Session tells what
// was found): a server that refuses the session settings gets none (the
// client's keepalives stay, and the ledger's own transactions set their
// timeouts locally), and behind a transaction-mode pooler the pool uses
// pgx's cache_describe mode, whose statements are unnamed, unless the URL
// chose a mode; a URL that chose named statements there is refused
// (ErrTransactionPooler).
func (o *Options) Postgres(ctx context.Context) (*pgxpool.Pool, error) {
	if o.DatabaseURL == "" {
		return nil, ErrNoDatabase
	}
	cfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if err := checkTLS(o.DatabaseURL, os.Getenv); err != nil {
		return nil, err
	}
	if o.Name != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = o.Name
	}
	where := fmt.Sprintf("database %s@%s:%d/%s", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := o.configureSession(pctx, cfg)
	if errors.Is(err, ErrTransactionPooler) {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s is %w: %w", where, ErrUnreachable, err)
	}
	o.Session = s
	if o.Primary != nil {
		fence.GuardPool(cfg, o.Primary)
	}
	if !strings.Contains(o.DatabaseURL, "pool_max_conns") && int(cfg.MaxConns) < o.MinPoolSize {
		cfg.MaxConns = int32(o.MinPoolSize)
	}
	o.clashes = &clashTracer{}
	cfg.ConnConfig.Tracer = o.clashes
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s is %w: %w", where, ErrUnreachable, err)
	}
	return pool, nil
}

// configureSession probes the server behind cfg and sets cfg's session
// settings and query mode from what it finds.
func (o *Options) configureSession(ctx context.Context, cfg *pgxpool.Config) (Session, error) {
	var s Session
	bare := cfg.ConnConfig.Copy()
	given := maps.Clone(bare.RuntimeParams)
	c, err := pgx.ConnectConfig(ctx, bare)
	if err != nil {
		return s, err
	}
	serverIdle, err := idleInTransaction(ctx, c)
	c.Close(ctx)
	if err != nil {
		return s, err
	}
	idle := fence.IdleInTransactionTimeoutDefault
	if serverIdle > 0 && serverIdle < idle {
		idle = serverIdle
	}
	fence.ConfigurePool(cfg, fence.Config{IdleInTransactionTimeout: idle})
	c, err = pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ProtocolViolation:
		// PgBouncer answers a startup parameter it does not know with a
		// protocol violation; without ours the bare connection worked.
		s.ParamsRefused = true
		for name := range cfg.ConnConfig.RuntimeParams {
			if _, ok := given[name]; !ok {
				delete(cfg.ConnConfig.RuntimeParams, name)
			}
		}
		s.IdleInTransaction = serverIdle
	case err != nil:
		return s, err
	default:
		s.IdleInTransaction, err = idleInTransaction(ctx, c)
		c.Close(ctx)
		if err != nil {
			return s, err
		}
		_, explicit := given["idle_in_transaction_session_timeout"]
		s.ParamsDropped = !explicit && s.IdleInTransaction != idle
	}
	if s.Proxied, s.Pooled, err = probeSessions(ctx, cfg.ConnConfig); err != nil {
		return s, err
	}
	// Whether a pooler shares sessions cannot always be seen from two
	// connections (under load, or with server_round_robin, they reach
	// different sessions), so behind any pooler statements are unnamed.
	if (s.Proxied || s.Pooled) && !strings.Contains(o.DatabaseURL, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	s.ExecMode = cfg.ConnConfig.DefaultQueryExecMode
	if s.Pooled && s.ExecMode == pgx.QueryExecModeCacheStatement {
		return s, ErrTransactionPooler
	}
	o.logSession(s)
	return s, nil
}

// logSession says at start what a pooler changed.
func (o *Options) logSession(s Session) {
	if o.Logger == nil {
		return
	}
	if s.ParamsRefused || s.ParamsDropped {
		how := "refused"
		if s.ParamsDropped {
			how = "ignored"
		}
		msg := "the server " + how + " the session settings sent at connect (a pooler?): " +
			"the ledger's own transactions still set their timeouts, but other idle transactions are bounded only by " +
			"the server's idle_in_transaction_session_timeout and the pooler's idle_transaction_timeout"
		o.Logger.Warn(msg, slog.Int64("idle_in_transaction_session_timeout_ms", s.IdleInTransaction.Milliseconds()))
	}
	switch {
	case s.Pooled:
		o.Logger.Info("PostgreSQL sessions are shared (a transaction-mode pooler): statements are not named",
			slog.String("query_exec_mode", s.ExecMode.String()))
	case s.Proxied:
		o.Logger.Info("PostgreSQL is reached through a pooler: statements are not named unless DATABASE_URL "+
			"sets default_query_exec_mode (cache_statement is safe in session mode only)",
			slog.String("query_exec_mode", s.ExecMode.String()))
	}
}

// idleInTransaction reads the session's idle_in_transaction_session_timeout.
func idleInTransaction(ctx context.Context, c *pgx.Conn) (time.Duration, error) {
	res := c.PgConn().Exec(ctx, `SELECT setting FROM pg_catalog.pg_settings WHERE name = 'idle_in_transaction_session_timeout'`)
	rows, err := res.ReadAll()
	if err != nil {
		return 0, fmt.Errorf("read idle_in_transaction_session_timeout: %w", err)
	}
	if len(rows) != 1 || len(rows[0].Rows) != 1 {
		return 0, errors.New("read idle_in_transaction_session_timeout: no row")
	}
	var ms int64
	if _, err := fmt.Sscan(string(rows[0].Rows[0][0]), &ms); err != nil {
		return 0, fmt.Errorf("read idle_in_transaction_session_timeout: %w", err)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// probeSessions reports whether a pooler is in between (a connection's
// announced process id is not its session's) and whether two client
// connections reach the same server session one after the other: a pooler
// in transaction mode hands the session one client just released to the
// next (PgBouncer reuses the most recent first). Two sessions of their own
// never share a process id.
func probeSessions(ctx context.Context, cc *pgx.ConnConfig) (proxied, shared bool, err error) {
	var conns [2]*pgx.Conn
	for i := range conns {
		c, err := pgx.ConnectConfig(ctx, cc.Copy())
		if err != nil {
			return false, false, err
		}
		defer c.Close(ctx)
		conns[i] = c
	}
	seen := map[string]int{}
	for round := range 4 {
		i := round % 2
		res, err := conns[i].PgConn().Exec(ctx, `SELECT pg_backend_pid()`).ReadAll()
		if err != nil {
			return false, false, fmt.Errorf("read the server's process id: %w", err)
		}
		pid := string(res[0].Rows[0][0])
		if pid != strconv.FormatUint(uint64(conns[i].PgConn().PID()), 10) {
			proxied = true
		}
		if j, ok := seen[pid]; ok && j != i {
			return true, true, nil
		}
		seen[pid] = i
	}
	return proxied, false, nil
}

// CheckPooler is a readiness check: it fails with ErrTransactionPooler
// while the pool names its statements and either a statement clashed on
// a shared session within the last minute (SQLSTATE 42P05 or 26000) or
// two of the pool's connections share a server session now.
func (o *Options) CheckPooler(pool *pgxpool.Pool) func(context.Context) error {
	return func(ctx context.Context) error {
		if o.Session.ExecMode != pgx.QueryExecModeCacheStatement {
			return nil
		}
		if o.clashes == nil {
			return nil
		}
		if last := o.clashes.last.Load(); last != 0 && time.Since(time.Unix(0, last)) < time.Minute {
			return fmt.Errorf("%w (a statement failed on a shared session %s ago)", ErrTransactionPooler,
				time.Since(time.Unix(0, last)).Round(time.Second))
		}
		shared, err := poolShares(ctx, pool)
		if err != nil {
			return err
		}
		if shared {
			return ErrTransactionPooler
		}
		return nil
	}
}

// poolShares reports whether two of the pool's connections reach one
// server session, asking each in turn for its process id (eight times: a
// pooler does not always hand over the session just released).
func poolShares(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var conns [2]*pgxpool.Conn
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return false, err
		}
		defer c.Release()
		conns[i] = c
	}
	seen := map[string]int{}
	for round := range 8 {
		i := round % 2
		res, err := conns[i].Conn().PgConn().Exec(ctx, `SELECT pg_backend_pid()`).ReadAll()
		if err != nil {
			return false, fmt.Errorf("read the server's process id: %w", err)
		}
		pid := string(res[0].Rows[0][0])
		if j, ok := seen[pid]; ok && j != i {
			return true, nil
		}
		seen[pid] = i
	}
	return false, nil
}

// clashTracer remembers when a statement last failed because prepared
// statements clashed on a shared session.
type clashTracer struct{ last atomic.Int64 }

func (t *clashTracer) note(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.DuplicatePreparedStatement || pgErr.Code == pgerrcode.InvalidSQLStatementName) {
		t.last.Store(time.Now().UnixNano())
	}
}

func (t *clashTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (t *clashTracer) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	t.note(d.Err)
}
func (t *clashTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (t *clashTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.note(d.Err)
}
func (t *clashTracer) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	t.note(d.Err)
}
func (t *clashTracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}
func (t *clashTracer) TracePrepareEnd(_ context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	t.note(d.Err)
}

// checkTLS refuses an sslrootcert the sslmode would not use: with
// sslmode prefer (the default), allow or disable, pgx (like libpq) does
// not verify the server, so a wrong certificate would pass unnoticed.
func checkTLS(connString string, getenv func(string) string) error {
	params := map[string]string{}
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		for k, v := range u.Query() {
			params[k] = v[len(v)-1]
		}
	} else {
		for _, f := range strings.Fields(connString) {
			if k, v, ok := strings.Cut(f, "="); ok {
				params[k] = strings.Trim(v, "'")
			}
		}
	}
	get := func(name, env string) string {
		if v, ok := params[name]; ok {
			return v
		}
		return getenv(env)
	}
	root, mode := get("sslrootcert", "PGSSLROOTCERT"), get("sslmode", "PGSSLMODE")
	switch mode {
	case "require", "verify-ca", "verify-full":
		return nil
	}
	if root == "" {
		return nil
	}
	return fmt.Errorf("database URL: sslrootcert is given but sslmode=%s does not verify the server with it: "+
		"set sslmode=verify-full (docs/operations.md, \"Poolers and managed PostgreSQL\")", cmp.Or(mode, "prefer"))
}
