// Package dbtest gives each test its own migrated PostgreSQL database on a real
// server, so tests can run in parallel and never see each other's rows.
//
// The server is TEST_DATABASE_URL, by default the local PostgreSQL this
// project's machines run (postgres://root@127.0.0.1:5432/test). The first
// call in a process makes (once per migration set, shared by all test
// processes) a template database that is already migrated; every test then
// gets CREATE DATABASE ... TEMPLATE, which takes a few tens of milliseconds,
// and the database is dropped when the test ends.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/migrations"
)

// URLDefault is the server used when TEST_DATABASE_URL is not set.
const URLDefault = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

// ServerURL is the admin connection string tests create databases through.
func ServerURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return URLDefault
}

// The template of this process's migration set; templateFor remakes it
// when a run of another checkout (another migration set) dropped it as
// stale while this process was using it.
var (
	templateMu   sync.Mutex
	templateName string
)

func templateFor(ctx context.Context, remake bool) (string, error) {
	templateMu.Lock()
	defer templateMu.Unlock()
	if templateName == "" || remake {
		name, err := ensureTemplate(ctx)
		if err != nil {
			return "", err
		}
		templateName = name
	}
	return templateName, nil
}

// DB is one test's database.
type DB struct {
	// Name is the database name.
	Name string
	// URL connects to it.
	URL string
	// Pool is a pool on it, closed when the test ends.
	Pool *pgxpool.Pool
}

// New creates a fresh, migrated database for t and drops it at cleanup.
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	tmpl, err := templateFor(ctx, false)
	if err != nil {
		t.Fatalf("dbtest: template database on %s: %v", redact(ServerURL()), err)
	}

	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		t.Fatalf("dbtest: connect to %s (set TEST_DATABASE_URL): %v", redact(ServerURL()), err)
	}
	defer admin.Close(ctx)

	name := "ledger_test_" + randomSuffix()
	err = createFromTemplate(ctx, admin, name, tmpl)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InvalidCatalogName {
		if tmpl, err = templateFor(ctx, true); err == nil {
			err = createFromTemplate(ctx, admin, name, tmpl)
		}
	}
	if err != nil {
		t.Fatalf("dbtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() { drop(name) })

	url, err := withDatabase(ServerURL(), name)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	// Room for an ingest's lanes and its lease service at once, as the
	// services size their pools: a renewal must not wait behind batches.
	cfg.MaxConns = max(cfg.MaxConns, 12)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("dbtest: pool on %s: %v", name, err)
	}
	t.Cleanup(pool.Close)
	return &DB{Name: name, URL: url, Pool: pool}
}

// NewEmpty creates a fresh database with no schema at all, for tests of
// migration itself, and drops it at cleanup. It returns the connection URL.
func NewEmpty(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		t.Fatalf("dbtest: connect to %s: %v", redact(ServerURL()), err)
	}
	defer admin.Close(ctx)
	name := "ledger_test_" + randomSuffix()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("dbtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() { drop(name) })
	url, err := withDatabase(ServerURL(), name)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	return url
}

// ensureTemplate makes the migrated template database for the embedded
// migrations, unless a complete one exists. The template's name carries a
// hash of the migration files, so a changed migration gets a new template.
func ensureTemplate(ctx context.Context) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "ledger_tmpl_" + sum[:12]

	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		return "", fmt.Errorf("connect (set TEST_DATABASE_URL): %w", err)
	}
	defer admin.Close(ctx)

	// Test binaries of several packages run at once: one makes the template.
	const lockKey = 0x6c6564676572 // "ledger"
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return "", fmt.Errorf("advisory lock: %w", err)
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck

	var isTemplate bool
	err = admin.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		dropStaleTemplates(ctx, admin, name)
		return name, nil
	case err == nil: // left half-made by a crashed run
		if _, err := admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return "", fmt.Errorf("drop incomplete template: %w", err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("look up template: %w", err)
	}

	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	url, err := withDatabase(ServerURL(), name)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", fmt.Errorf("pool on template: %w", err)
	}
	_, err = migrations.Up(ctx, pool, nil)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH IS_TEMPLATE true"); err != nil {
		return "", fmt.Errorf("mark template: %w", err)
	}
	dropStaleTemplates(ctx, admin, name)
	return name, nil
}

// dropStaleTemplates removes the templates of earlier migration sets, so a
// shared server does not collect one per schema change. One still in use
// (a test run of an older checkout) is left for a later run to remove.
func dropStaleTemplates(ctx context.Context, admin *pgx.Conn, current string) {
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'ledger\_tmpl\_%' AND datname <> $1`, current)
	if err != nil {
		return
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range stale {
		id := pgx.Identifier{name}.Sanitize()
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+id+" WITH IS_TEMPLATE false"); err == nil {
			_, _ = admin.Exec(ctx, "DROP DATABASE "+id)
		}
	}
}

func createFromTemplate(ctx context.Context, admin *pgx.Conn, name, tmpl string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{tmpl}.Sanitize()
	for attempt := 0; ; attempt++ {
		_, err := admin.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		// 55006: the template is briefly in use by another CREATE DATABASE.
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.ObjectInUse || attempt > 50 {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func drop(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

func migrationsHash() (string, error) {
	fsys := migrations.FS()
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// withDatabase returns connString pointing at database name, keeping every
// other setting (host, socket, TLS, password).
func withDatabase(connString, name string) (string, error) {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		if err != nil {
			return "", fmt.Errorf("parse TEST_DATABASE_URL: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	// keyword=value form: a later dbname wins.
	return connString + " dbname=" + name, nil
}

func randomSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func redact(url string) string {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return "(unparsable URL)"
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// PoolVia returns a pool on the test's database that connects through addr
// ("host:port", such as a fault-injecting proxy in front of the server),
// with a short connect timeout; it is closed when the test ends.
func (db *DB) PoolVia(t testing.TB, addr string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("dbtest: address %q: %v", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("dbtest: address %q: %v", addr, err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dbtest: pool via %s: %v", addr, err)
	}
	t.Cleanup(pool.Close)
	return pool
}
