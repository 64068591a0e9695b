package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotMigrator is returned by Up when the connected role may not migrate
// the ledger and a migration is pending: the role is one of the ledger's
// group roles (or a member of one), or the ledger schema exists and the
// role does not have its owner's rights.
//
// The objects a migration creates belong to the role that runs it. Run as
// a service's user, the service would own the history it may only append
// to, and could delete or rewrite it; run as a role that does not own the
// schema, it fails halfway with "permission denied".
var ErrNotMigrator = errors.New("migrations: this role may not migrate the ledger")

// groupRoles are the roles of 00002_roles.sql: the services and operators
// act through them, and none of them may own the ledger.
var groupRoles = []string{"ledger_ingest", "ledger_projector", "ledger_operator"}

// sqlMigrator reads who is connected, which of the ledger's group roles it
// belongs to (through any chain of memberships, inherited or not; a
// superuser's implicit rights are not membership), and whether it has the
// rights of the ledger schema's owner, if there is a schema.
const sqlMigrator = `
WITH RECURSIVE member_of(oid) AS (
    SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user
  UNION
    SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN member_of ON m.member = member_of.oid
)
SELECT current_user::text,
       coalesce((SELECT array_agg(r.rolname::text ORDER BY r.rolname)
                 FROM member_of JOIN pg_catalog.pg_roles r ON r.oid = member_of.oid
                 WHERE r.rolname = ANY($1)), '{}'),
       coalesce((SELECT pg_catalog.pg_get_userbyid(n.nspowner)::text
                 FROM pg_catalog.pg_namespace n WHERE n.nspname = 'ledger'), ''),
       coalesce((SELECT pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE')
                 FROM pg_catalog.pg_namespace n WHERE n.nspname = 'ledger'), true)`

// checkMigrator returns an error wrapping ErrNotMigrator when the connected
// role may not migrate.
func checkMigrator(ctx context.Context, pool *pgxpool.Pool) error {
	var (
		user, owner string
		groups      []string
		ownerRights bool
	)
	if err := pool.QueryRow(ctx, sqlMigrator, groupRoles).Scan(&user, &groups, &owner, &ownerRights); err != nil {
		return fmt.Errorf("migrations: read the connected role: %w", err)
	}
	const how = "migrate as the owner of the ledger's schema (ledgerctl migrate with the owner's DATABASE_URL) and start the services with -migrate=false"
	switch {
	case len(groups) > 0:
		return fmt.Errorf("%w: role %q is a member of %s, which the services and operators act through; %s",
			ErrNotMigrator, user, strings.Join(groups, ", "), how)
	case !ownerRights:
		return fmt.Errorf("%w: role %q does not own the ledger schema (%q does); %s", ErrNotMigrator, user, owner, how)
	}
	return nil
}

// schemaCurrent reports whether every embedded migration is recorded as
// applied, reading only, so that it leaves nothing behind for a role that
// may not migrate to own. Any failure to read counts as not current.
func schemaCurrent(ctx context.Context, pool *pgxpool.Pool) bool {
	target, err := latestVersion()
	if err != nil {
		return false
	}
	current, err := currentVersion(ctx, pool)
	return err == nil && current >= target
}

// latestVersion is the highest version among the embedded migrations.
func latestVersion() (int64, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return 0, fmt.Errorf("migrations: list files: %w", err)
	}
	var latest int64
	for _, n := range names {
		v, err := strconv.ParseInt(n[:strings.IndexByte(n, '_')], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("migrations: version of %s: %w", n, err)
		}
		latest = max(latest, v)
	}
	return latest, nil
}
