// Package migrations holds the ledger's schema as numbered SQL files, embedded
// in every binary, and applies them.
//
// Up is safe to call from several processes at once: goose holds a Postgres
// session advisory lock while it migrates, so one process applies and the
// others wait and then find nothing to do.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// VersionTable is the table goose records applied versions in. It lives in
// the public schema so that it exists before the ledger schema does.
const VersionTable = "ledger_schema_version"

func provider(db *sql.DB, logger *slog.Logger) (*goose.Provider, error) {
	// Poll every second (goose polls every 5 s by default) for up to 5 minutes:
	// services starting together should not idle for seconds behind one migrator.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrations: version store: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithStore(store), goose.WithSessionLocker(locker)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider("", db, files, opts...)
	if err != nil {
		return nil, fmt.Errorf("migrations: provider: %w", err)
	}
	return p, nil
}

// Up applies every pending migration through pool and returns the versions it
// applied (none when the schema is current).
//
// Only the schema's owner migrates: when a migration is pending and the
// connected role is one of the ledger's group roles (or a member of one),
// or lacks the rights of the ledger schema's owner, Up applies nothing and
// returns an error wrapping ErrNotMigrator. When nothing is pending such a
// role gets nil, so a service started with -migrate as its own user is
// fine while the owner keeps the schema current.
func Up(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]int64, error) {
	if err := checkMigrator(ctx, pool); err != nil {
		if errors.Is(err, ErrNotMigrator) && schemaCurrent(ctx, pool) {
			return nil, nil
		}
		return nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, logger)
	if err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: up: %w", err)
	}
	applied := make([]int64, 0, len(res))
	for _, r := range res {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// ErrPending is returned by Check when the database is behind the binary.
var ErrPending = errors.New("migrations: schema is not current")

// Check reports whether every embedded migration has been applied; it returns
// ErrPending (wrapped with the versions) when some have not.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, nil)
	if err != nil {
		return err
	}
	current, target, err := p.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("migrations: read version: %w", err)
	}
	if current < target {
		return fmt.Errorf("%w: at version %d, binary has %d", ErrPending, current, target)
	}
	return nil
}

// FS returns the embedded migration files.
func FS() fs.FS { return files }

// Count returns how many migration files are embedded.
func Count() (int, error) {
	names, err := fs.Glob(files, "*.sql")
	return len(names), err
}
