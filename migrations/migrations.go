// Package migrations holds the ledger's schema as numbered SQL files, embedded
// in every binary, and applies them.
//
// The files keep goose's format (-- +goose Up / Down) and the applied
// versions goose's table, but Up applies them itself:
//   - Every pending migration is applied in one transaction: a failure
//     leaves the schema as it was, never half migrated.
//   - The transaction takes a transaction-scoped advisory lock first, so
//     concurrent migrators wait for each other, also through a pooler in
//     transaction mode, where a session lock would be taken on one
//     server session and released on another.
//   - The transaction sets its own statement_timeout (StatementTimeout),
//     whatever the server's default for the role is.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed *.sql
var files embed.FS

// VersionTable is the table goose records applied versions in. It lives in
// the public schema so that it exists before the ledger schema does.
const VersionTable = "ledger_schema_version"

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
	ms, err := load(files)
	if err != nil {
		return nil, err
	}
	return apply(ctx, pool, ms, logger)
}

// ErrPending is returned by Check when the database is behind the binary.
var ErrPending = errors.New("migrations: schema is not current")

// Check reports whether every embedded migration has been applied; it returns
// ErrPending (wrapped with the versions) when some have not.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	target, err := latestVersion()
	if err != nil {
		return err
	}
	current, err := currentVersion(ctx, pool)
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
