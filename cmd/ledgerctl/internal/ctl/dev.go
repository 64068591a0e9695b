package ctl

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/localstack"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
)

// DevReady is the line "ledgerctl dev -json" prints once the ledger
// answers: what a client (or a test of one) needs to reach it.
type DevReady struct {
	// NATSURL is the embedded NATS server's client URL.
	NATSURL string `json:"nats_url"`
	// Prefix is the subject prefix the services use.
	Prefix string `json:"prefix"`
	// Partitions is the deployment's partition count.
	Partitions int `json:"partitions"`
	// Database names the PostgreSQL database: its name on the server of
	// DATABASE_URL, or "throwaway" for a cluster of its own.
	Database string `json:"database"`
}

// stdin is what -stop-on-stdin-eof watches; a variable for tests.
var stdin io.Reader = os.Stdin

// Dev runs a whole ledger in one process until ctx ends (SIGINT, SIGTERM):
// an embedded NATS JetStream server, the ingest with the lease service, the
// projector, and PostgreSQL from -database-url / DATABASE_URL or a
// throwaway cluster.
func Dev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl dev", "[-nats-port N] [-partitions N] [-fresh-database] [-json]",
		"Run a whole ledger in this process until SIGINT or SIGTERM: NATS with JetStream on\n"+
			"127.0.0.1, the ingest (with the lease service) and the projector. PostgreSQL is\n"+
			"DATABASE_URL when it answers, else a throwaway cluster. With -json, one line tells\n"+
			"the NATS URL once the ledger answers, for scripts and tests of clients.", stderr)
	port := f.Int("nats-port", 4222, "NATS client port on 127.0.0.1 (0: any free port)")
	partitions := f.Int("partitions", fence.PartitionsDefault, "partition count of the deployment")
	gapWindow := f.Duration("gap-window", ingest.GapWindowDefault, "how long an event ahead of its task's head waits for the versions before it")
	fresh := f.Bool("fresh-database", false, "make an empty database of its own on DATABASE_URL's server, dropped on exit")
	stdinEOF := f.Bool("stop-on-stdin-eof", false, "stop when standard input ends too: a test that started dev and died takes it along")
	verbose := f.Bool("v", false, "log the services at debug level to stderr (default: warnings)")
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case f.NArg() > 0:
		return Usagef("unexpected argument %q", f.Arg(0))
	case *port < 0 || *port > 65535:
		return Usagef("-nats-port %d is not a port (0..65535)", *port)
	case *partitions < 1 || *partitions > 1<<20:
		return Usagef("-partitions %d is out of range [1, %d]", *partitions, 1<<20)
	case *gapWindow <= 0:
		return Usagef("-gap-window %v must be positive", *gapWindow)
	case *fresh && f.Conn.DatabaseURL == "":
		return Usagef("-fresh-database needs DATABASE_URL (or -database-url): the server to make the database on")
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	say := func(format string, args ...any) {
		if !f.JSON {
			fmt.Fprintf(stdout, "dev: "+format+"\n", args...)
		}
	}

	dbURL, database := f.Conn.DatabaseURL, "DATABASE_URL"
	if *fresh {
		name, u, drop, err := freshDatabase(ctx, dbURL)
		if err != nil {
			return err
		}
		defer drop()
		dbURL, database = u, name
		say("PostgreSQL: a fresh database %s (dropped on exit)", name)
	}
	s, err := localstack.Start(ctx, localstack.Options{DatabaseURL: dbURL, Logger: logger, Say: say, NATSPort: *port,
		Fence:     fence.Config{Partitions: *partitions},
		Ingest:    ingest.Config{Prefix: f.Prefix, GapWindow: *gapWindow},
		Projector: projector.Config{Prefix: f.Prefix}})
	if err != nil {
		return fmt.Errorf("start the ledger: %w", err)
	}
	defer s.Close()
	if dbURL == "" || s.Pool.Config().ConnConfig.Database != dbDatabase(dbURL) {
		database = "throwaway"
	}
	ready := DevReady{NATSURL: s.NATS.ClientURL(), Prefix: f.Prefix, Partitions: *partitions, Database: database}
	if f.JSON {
		b, _ := json.Marshal(ready) // a struct of strings and ints
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		say("ready: NATS_URL=%s prefix=%s partitions=%d; Ctrl-C stops it", ready.NATSURL, ready.Prefix, ready.Partitions)
	}
	if *stdinEOF {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			cancel()
		}()
	}
	<-ctx.Done()
	say("stopping")
	return nil
}

// dbDatabase is the database name in a connection string, or "" when it
// cannot be read.
func dbDatabase(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return ""
	}
	return cfg.Database
}

// freshDatabase creates an empty database on serverURL's server and returns
// its name, its URL and a func that drops it.
func freshDatabase(ctx context.Context, serverURL string) (string, string, func(), error) {
	// CREATE DATABASE copies a template and waits for a checkpoint: on a
	// busy server it takes longer than a connection does.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(cctx, serverURL)
	if err != nil {
		return "", "", nil, fmt.Errorf("-fresh-database: connect to DATABASE_URL: %w", err)
	}
	defer admin.Close(context.Background())
	name := "ledger_dev_" + strings.ToLower(rand.Text()[:12])
	if _, err := admin.Exec(cctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", "", nil, fmt.Errorf("-fresh-database: create database %s: %w", name, err)
	}
	u, err := withDatabaseName(serverURL, name)
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(dctx, serverURL)
		if err != nil {
			return
		}
		defer c.Close(dctx)
		_, _ = c.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	if err != nil {
		drop()
		return "", "", nil, err
	}
	return name, u, drop, nil
}

// withDatabaseName returns the URL serverURL with its database replaced by
// name; serverURL must be a postgres:// URL.
func withDatabaseName(serverURL, name string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("-fresh-database needs DATABASE_URL as a postgres:// URL, got %q", redactURL(serverURL))
	}
	u.Path = "/" + name
	return u.String(), nil
}

// redactURL hides a password in a connection string for an error message.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
