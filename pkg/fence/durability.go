package fence

import (
	"context"
	"fmt"
	"strings"
)

// DurabilityLevel says what a commit the database acknowledged survives.
type DurabilityLevel string

// The levels, from weakest to strongest.
const (
	// DurabilityNone: a crash of the database's host can lose acknowledged
	// commits (fsync or synchronous_commit off).
	DurabilityNone DurabilityLevel = "none"
	// DurabilityLocal: a commit survives a crash of the primary, but a
	// failover to a standby that replicates asynchronously can lose the
	// newest ones.
	DurabilityLocal DurabilityLevel = "local"
	// DurabilitySync: a commit is on a synchronous standby too before it is
	// acknowledged, so a failover to that standby loses none.
	DurabilitySync DurabilityLevel = "sync"
)

// Durability is what the database says of its commits.
type Durability struct {
	Fsync                   string
	SynchronousCommit       string
	SynchronousStandbyNames string
	// SyncStandbys is how many standbys pg_stat_replication shows as
	// synchronous (sync or quorum) now, as far as this role may see
	// (pg_read_all_stats shows them all).
	SyncStandbys int
	Level        DurabilityLevel
}

const sqlDurability = `
SELECT current_setting('fsync'), current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       (SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) FROM pg_stat_replication)::int`

// ReadDurability asks the database what its acknowledged commits survive.
func (s *Store) ReadDurability(ctx context.Context) (Durability, error) {
	var d Durability
	if err := s.pool.QueryRow(ctx, sqlDurability).Scan(&d.Fsync, &d.SynchronousCommit, &d.SynchronousStandbyNames,
		&d.SyncStandbys); err != nil {
		return d, fmt.Errorf("fence: read the database's durability settings: %w", err)
	}
	d.Level = d.level()
	return d, nil
}

// level classifies the settings. synchronous_commit = local waits for no
// standby, remote_write for the standby's memory only: both count as local.
func (d Durability) level() DurabilityLevel {
	switch {
	case d.Fsync != "on" || d.SynchronousCommit == "off":
		return DurabilityNone
	case strings.TrimSpace(d.SynchronousStandbyNames) == "":
		return DurabilityLocal
	case d.SynchronousCommit == "on" || d.SynchronousCommit == "remote_apply":
		return DurabilitySync
	}
	return DurabilityLocal
}

// Meets reports whether the level is at least want.
func (l DurabilityLevel) Meets(want DurabilityLevel) bool {
	rank := map[DurabilityLevel]int{DurabilityNone: 0, DurabilityLocal: 1, DurabilitySync: 2}
	return rank[l] >= rank[want]
}

// Explain says in a sentence what the level means for the ledger's
// promises, and what raises it.
func (d Durability) Explain() string {
	switch d.Level {
	case DurabilityNone:
		return fmt.Sprintf("fsync=%s, synchronous_commit=%s: a crash of the database's host can lose events the ledger "+
			"acknowledged; set fsync=on and synchronous_commit=on", d.Fsync, d.SynchronousCommit)
	case DurabilityLocal:
		return fmt.Sprintf("synchronous_commit=%s, synchronous_standby_names=%q: a failover to an asynchronous standby can "+
			"lose the newest events the ledger acknowledged; use synchronous replication (docs/operations.md, "+
			"\"PostgreSQL high availability\")", d.SynchronousCommit, d.SynchronousStandbyNames)
	}
	return fmt.Sprintf("synchronous_commit=%s with synchronous standbys %q: an acknowledged commit survives a failover "+
		"to a synchronous standby", d.SynchronousCommit, d.SynchronousStandbyNames)
}
