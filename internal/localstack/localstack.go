// Package localstack runs a whole ledger in one process for the demo and the
// benchmark: PostgreSQL (the one given, or a throwaway cluster), an embedded
// NATS JetStream server, the ingest (with the lease service) and the
// projector.
package localstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/pgtemp"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
)

// Options configure a stack.
type Options struct {
	// DatabaseURL is the PostgreSQL to use; when empty or unreachable a
	// throwaway cluster is started from the local installation.
	DatabaseURL string
	// Logger receives the services' logs; default discards them.
	Logger *slog.Logger
	// Say receives one line per setup step; default discards them.
	Say func(format string, args ...any)
	// External uses a ledger that is already running: PostgreSQL at
	// DatabaseURL (required) and NATS through NATS (required), with the
	// ingest and the projector running elsewhere. Nothing is started.
	External bool
	// NATS connects to the external NATS servers, with the extra options
	// given.
	NATS func(opts ...nats.Option) (*nats.Conn, error)
	// Ingest and Projector configure the services (zero: defaults, with a
	// 1 s gap timeout for the projector).
	Ingest    ingest.Config
	Projector projector.Config
	// Fence configures the store (zero: defaults, 16 partitions).
	Fence fence.Config
	// NATSPort is the embedded NATS server's client port on 127.0.0.1;
	// 0 picks a free one.
	NATSPort int
}

// Stack is a running ledger.
type Stack struct {
	Pool      *pgxpool.Pool
	NATS      *server.Server
	NC        *nats.Conn
	Store     *fence.Store
	Ingest    *ingest.Service
	Projector *projector.Service
	stops     []func()
	dial      func(opts ...nats.Option) (*nats.Conn, error)
	// startProjector starts a projector on the stack; nil for an external
	// ledger, whose projector runs elsewhere.
	startProjector func(context.Context) (*projector.Service, error)
}

// RestartProjector stops the stack's projector and starts a new one, which
// resumes from the durable consumer where the old one stopped.
func (s *Stack) RestartProjector(ctx context.Context, down func() error) error {
	if s.startProjector == nil {
		return errors.New("the projector of an external ledger runs elsewhere")
	}
	s.Projector.Stop()
	if err := down(); err != nil {
		return err
	}
	p, err := s.startProjector(ctx)
	if err != nil {
		return err
	}
	s.Projector = p
	return nil
}

// Dial opens one more connection to the stack's NATS, with opts (a worker's
// inbox prefix, say); the stack closes it with the rest.
func (s *Stack) Dial(opts ...nats.Option) (*nats.Conn, error) {
	nc, err := s.dial(opts...)
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, nc.Close)
	return nc, nil
}

// CanRestartProjector reports whether RestartProjector can work.
func (s *Stack) CanRestartProjector() bool { return s.startProjector != nil }

// Close stops everything and removes what was created.
func (s *Stack) Close() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

// Start brings up PostgreSQL (given or throwaway), an embedded NATS server,
// the ingest and the projector.
func Start(ctx context.Context, o Options) (*Stack, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	say := func(format string, args ...any) {
		if o.Say != nil {
			o.Say(format, args...)
		}
	}
	if o.Projector.Engine.GapTimeout == 0 {
		o.Projector.Engine.GapTimeout = time.Second
	}
	if o.External {
		return startExternal(ctx, o, say)
	}
	s := &Stack{}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()

	url := o.DatabaseURL
	if url != "" {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		pool, err := newPool(pctx, url, o.Ingest)
		if err == nil {
			err = pool.Ping(pctx)
		}
		cancel()
		if err != nil {
			if pool != nil {
				pool.Close()
			}
			say("DATABASE_URL is not reachable (%v); using a throwaway PostgreSQL instead", short(err))
			url = ""
		} else {
			s.Pool = pool
			say("PostgreSQL: DATABASE_URL")
		}
	}
	if url == "" && s.Pool == nil {
		c, err := pgtemp.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("no DATABASE_URL, and a throwaway PostgreSQL could not start: %w", err)
		}
		s.stops = append(s.stops, c.Stop)
		pool, err := newPool(ctx, c.URL(), o.Ingest)
		if err != nil {
			return nil, err
		}
		s.Pool = pool
		say("PostgreSQL: a throwaway cluster in a temporary directory (removed on exit)")
	}
	s.stops = append(s.stops, s.Pool.Close)
	if _, err := migrations.Up(ctx, s.Pool, nil); err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "ledger-demo-nats-")
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, func() { os.RemoveAll(dir) })
	s.NATS, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: cmp.Or(o.NATSPort, server.RANDOM_PORT), JetStream: true, StoreDir: dir,
		NoSigs: true, NoLog: true, ServerName: "ledger-demo"})
	if err != nil {
		return nil, err
	}
	go s.NATS.Start()
	if !s.NATS.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("embedded NATS server did not start")
	}
	s.stops = append(s.stops, func() { s.NATS.Shutdown(); s.NATS.WaitForShutdown() })
	say("NATS: embedded JetStream server at %s", s.NATS.ClientURL())
	s.dial = func(opts ...nats.Option) (*nats.Conn, error) { return nats.Connect(s.NATS.ClientURL(), opts...) }
	if s.NC, err = s.Dial(); err != nil {
		return nil, err
	}

	if s.Store, err = fence.New(s.Pool, o.Fence); err != nil {
		return nil, err
	}
	inNC, err := s.Dial()
	if err != nil {
		return nil, err
	}
	if s.Ingest, err = ingest.New(o.Ingest, ingest.Deps{NC: inNC, Store: s.Store, Logger: o.Logger}); err != nil {
		return nil, err
	}
	if err := s.Ingest.Start(ctx); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.Ingest.Stop)
	s.startProjector = func(ctx context.Context) (*projector.Service, error) {
		nc, err := s.Dial()
		if err != nil {
			return nil, err
		}
		p, err := projector.New(o.Projector, projector.Deps{NC: nc, Pool: s.Pool, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		if err := p.Start(ctx); err != nil {
			return nil, err
		}
		s.stops = append(s.stops, p.Stop)
		return p, nil
	}
	if s.Projector, err = s.startProjector(ctx); err != nil {
		return nil, err
	}
	say("ingest (with the lease service) and projector running")
	ok = true
	return s, nil
}

func short(err error) string {
	msg := err.Error()
	if len(msg) > 120 {
		msg = msg[:120] + "…"
	}
	return msg
}

// startExternal connects to a ledger that runs elsewhere.
func startExternal(ctx context.Context, o Options, say func(string, ...any)) (*Stack, error) {
	if o.DatabaseURL == "" || o.NATS == nil {
		return nil, errors.New("an external ledger needs DATABASE_URL and NATS_URL")
	}
	s := &Stack{}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := newPool(pctx, o.DatabaseURL, o.Ingest)
	if err == nil {
		err = pool.Ping(pctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return nil, fmt.Errorf("database is not reachable: %w", err)
	}
	s.Pool = pool
	s.stops = append(s.stops, pool.Close)
	s.dial = o.NATS
	if s.NC, err = s.Dial(); err != nil {
		s.Close()
		return nil, err
	}
	say("using the running ledger at %s (ingest and projector run elsewhere)", s.NC.ConnectedUrlRedacted())
	return s, nil
}

// newPool opens a pool with room for every ingest lane and the lease service
// besides (renewals must not wait behind batches).
func newPool(ctx context.Context, url string, in ingest.Config) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if min := int32(in.WithDefaults().Lanes + 8); cfg.MaxConns < min {
		cfg.MaxConns = min
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}
