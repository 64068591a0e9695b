package connect

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/fence"
)

// AdminHostDefault is the host the admin endpoints listen on unless
// -admin-addr says otherwise: 127.0.0.1. /metrics and /readyz describe the
// service's dependencies to whoever asks, so they are not offered to other
// hosts until the operator widens the address (0.0.0.0:9090 in a container
// whose port is published, for example).
const AdminHostDefault = "127.0.0.1"

// Service holds what every service binary shares: the connection flags,
// the subject prefix, the admin address and the log level.
type Service struct {
	Conn      Options
	Prefix    string
	AdminAddr string
	LogLevel  string
	// StartWait bounds how long Postgres and NATS keep trying a
	// dependency that does not answer yet before the service gives up.
	StartWait time.Duration
	// Log is the JSON logger, set by Parse.
	Log *slog.Logger
}

// StartWaitDefault is -start-wait's default: 1 min.
const StartWaitDefault = time.Minute

// ErrUnreachable is in the error of a connection that failed for want of
// an answer (refused, reset, timed out, a server still starting up),
// which trying again may cure; not in one that the settings doom (a
// malformed URL, a TLS setting, a refused pooler mode).
var ErrUnreachable = errors.New("not reachable")

// Register adds the shared flags to fs. adminPort is the service's own
// admin port ("9090" for the ingest, "9091" for the projector; empty for no
// admin endpoints by default): -admin-addr defaults to that port on
// AdminHostDefault. It panics if adminPort is not a bare port, as the flag
// package does on a misdeclared flag.
func (s *Service) Register(fs *flag.FlagSet, adminPort string) {
	adminDefault := ""
	if adminPort != "" {
		if strings.ContainsAny(adminPort, ":[]") {
			panic(fmt.Sprintf("connect: admin port %q: want a bare port such as \"9090\"", adminPort))
		}
		adminDefault = net.JoinHostPort(AdminHostDefault, adminPort)
	}
	s.Conn.Register(fs)
	fs.StringVar(&s.Prefix, "prefix", Env("LEDGER_PREFIX", "ledger"), "subject prefix (env LEDGER_PREFIX)")
	fs.StringVar(&s.AdminAddr, "admin-addr", Env("LEDGER_ADMIN_ADDR", adminDefault),
		"address of /metrics, /healthz and /readyz (env LEDGER_ADMIN_ADDR); loopback by default, 0.0.0.0:<port> serves other hosts; empty disables")
	fs.StringVar(&s.LogLevel, "log-level", Env("LEDGER_LOG_LEVEL", "info"), "debug, info, warn or error (env LEDGER_LOG_LEVEL)")
	fs.DurationVar(&s.StartWait, "start-wait", EnvDuration("LEDGER_START_WAIT", StartWaitDefault),
		"how long the service waits at start for PostgreSQL and NATS to answer, trying again, before it exits; 0 tries once (env LEDGER_START_WAIT)")
}

// Postgres opens the pool (Options.Postgres). While the database is not
// reachable it tries again, logging each failure, for up to StartWait: a
// service started beside a database that is restarting or failing over
// waits for it rather than exiting into its supervisor's restart loop.
func (s *Service) Postgres(ctx context.Context) (*pgxpool.Pool, error) {
	var pool *pgxpool.Pool
	err := s.untilReachable(ctx, "PostgreSQL", func() (err error) {
		pool, err = s.Conn.Postgres(ctx)
		return err
	})
	return pool, err
}

// NATS connects to the NATS servers (Options.NATS), trying again as
// Postgres does. Once connected, the client reconnects by itself.
func (s *Service) NATS(ctx context.Context) (*nats.Conn, error) {
	var nc *nats.Conn
	err := s.untilReachable(ctx, "NATS", func() (err error) {
		nc, err = s.Conn.NATS(s.Log)
		return err
	})
	return nc, err
}

// WhileStarting runs a start step that reads or writes the database (the
// migrations, the ingest's durability check) as Postgres connects: a failure
// that retrying may cure (fence.IsTransient: a connection lost or refused,
// a server shutting down) is tried again until StartWait ends, so that a
// database restarting while a service starts delays the start instead of
// ending it. A step that fails part way must be safe to run again.
func (s *Service) WhileStarting(ctx context.Context, what string, step func() error) error {
	return s.untilReachable(ctx, what, func() error {
		err := step()
		if err != nil && ctx.Err() == nil && fence.IsTransient(err) && !errors.Is(err, ErrUnreachable) {
			return fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		return err
	})
}

// startRetryMax is the longest pause between two tries at start.
const startRetryMax = 5 * time.Second

// untilReachable runs try until it succeeds, fails for a reason other than
// ErrUnreachable, ctx ends or the next try would start past StartWait.
func (s *Service) untilReachable(ctx context.Context, what string, try func() error) error {
	deadline := time.Now().Add(s.StartWait)
	delay := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil || !errors.Is(err, ErrUnreachable) || time.Now().Add(delay).After(deadline) {
			if err != nil && attempt > 1 {
				err = fmt.Errorf("%w (tried %d times in %v: -start-wait)", err, attempt, s.StartWait)
			}
			return err
		}
		log := s.Log
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		log.Warn("waiting for "+what+" to answer", slog.Int("attempt", attempt), slog.Duration("retry_in", delay),
			slog.String("error", err.Error()))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(2*delay, startRetryMax)
	}
}

// Parse parses args, builds the logger and gives the process the services'
// garbage-collector defaults (TuneGC). It reports false (and no error) when
// only -h was asked for.
func (s *Service) Parse(fs *flag.FlagSet, args []string) (bool, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return false, nil
		}
		return false, err
	}
	if err := EnvError(); err != nil {
		return false, err
	}
	log, err := Logger(s.LogLevel)
	if err != nil {
		return false, err
	}
	s.Log = log
	s.Conn.Logger = log
	TuneGC(log)
	return true, nil
}

// Run runs a service's run function on args and returns the process's
// exit status: 0, or 1 after writing the error to stderr.
func Run(name string, run func(args []string) error, args []string, stderr io.Writer) int {
	if err := run(args); err != nil {
		fmt.Fprintln(stderr, name+":", Explain(err))
		return 1
	}
	return 0
}
