// Package demo runs the ledger end to end in one process and plays the two
// stories the ledger was born from: a task's "completed" arriving before its
// "running", and a paused worker whose late write must not overwrite the
// work of the worker that replaced it. Every line of the timeline it prints
// is read back from the ledger (receipts, the task head, the DLQ, the KV
// bucket), not from what the script expects.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/flowness/ledger/pkg/projection"
)

// Options configure a demo run.
type Options struct {
	// DatabaseURL is the PostgreSQL to use; when empty or unreachable a
	// throwaway cluster is started from the local installation.
	DatabaseURL string
	// Out receives the timeline; default os.Stdout.
	Out io.Writer
	// Logger receives the services' logs; default discards them.
	Logger *slog.Logger
}

// stack is the running ledger of a demo.
type stack struct {
	pool  *pgxpool.Pool
	ns    *server.Server
	nc    *nats.Conn
	store *fence.Store
	in    *ingest.Service
	proj  *projector.Service
	stops []func()
}

func (s *stack) close() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

// startStack brings up PostgreSQL (given or throwaway), an embedded NATS
// server, the ingest and the projector.
func startStack(ctx context.Context, o Options, say func(string, string, ...any)) (*stack, error) {
	s := &stack{}
	ok := false
	defer func() {
		if !ok {
			s.close()
		}
	}()

	url := o.DatabaseURL
	if url != "" {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		pool, err := pgxpool.New(pctx, url)
		if err == nil {
			err = pool.Ping(pctx)
		}
		cancel()
		if err != nil {
			if pool != nil {
				pool.Close()
			}
			say("setup", "DATABASE_URL is not reachable (%v); using a throwaway PostgreSQL instead", short(err))
			url = ""
		} else {
			s.pool = pool
			say("setup", "PostgreSQL: DATABASE_URL")
		}
	}
	if url == "" && s.pool == nil {
		c, err := pgtemp.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("no DATABASE_URL, and a throwaway PostgreSQL could not start: %w", err)
		}
		s.stops = append(s.stops, c.Stop)
		pool, err := pgxpool.New(ctx, c.URL())
		if err != nil {
			return nil, err
		}
		s.pool = pool
		say("setup", "PostgreSQL: a throwaway cluster in a temporary directory (removed on exit)")
	}
	s.stops = append(s.stops, s.pool.Close)
	if _, err := migrations.Up(ctx, s.pool, nil); err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "ledger-demo-nats-")
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, func() { os.RemoveAll(dir) })
	s.ns, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		NoSigs: true, NoLog: true, ServerName: "ledger-demo"})
	if err != nil {
		return nil, err
	}
	go s.ns.Start()
	if !s.ns.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("embedded NATS server did not start")
	}
	s.stops = append(s.stops, func() { s.ns.Shutdown(); s.ns.WaitForShutdown() })
	say("setup", "NATS: embedded JetStream server at %s", s.ns.ClientURL())
	conn := func() (*nats.Conn, error) { return nats.Connect(s.ns.ClientURL()) }
	if s.nc, err = conn(); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.nc.Close)

	if s.store, err = fence.New(s.pool, fence.Config{}); err != nil {
		return nil, err
	}
	inNC, err := conn()
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, inNC.Close)
	if s.in, err = ingest.New(ingest.Config{}, ingest.Deps{NC: inNC, Store: s.store, Logger: o.Logger}); err != nil {
		return nil, err
	}
	if err := s.in.Start(ctx); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.in.Stop)
	projNC, err := conn()
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, projNC.Close)
	s.proj, err = projector.New(projector.Config{Engine: projection.Config{GapTimeout: time.Second}},
		projector.Deps{NC: projNC, Pool: s.pool, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	if err := s.proj.Start(ctx); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.proj.Stop)
	say("setup", "ingest (with the lease service) and projector running")
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
