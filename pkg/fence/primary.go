package fence

// The superseded-primary guard. A standby that is promoted starts a new
// WAL timeline; an old primary that comes back writable stays on its old
// one. A PrimaryGuard holds the newest timeline the ledger has written to
// (an ingest keeps it in the bucket ledger_witness, beside the grants), and
// refuses anything older: a new connection to such a server fails, so a
// multi-host connection string moves on to the next host, and every append
// checks it in its own transaction (ledger.primary_check, migration 00010).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSupersededPrimary is the error of an append or a connection on a
// server whose timeline is older than one the ledger has written to: an
// old primary that came back writable after a failover. Nothing was
// written; the append may be tried again on the newest primary.
var ErrSupersededPrimary = errors.New("fence: the database is a superseded primary")

// sqlStatePrimaryCheck is raised by ledger.primary_check (migration 00010).
const sqlStatePrimaryCheck = "LF004" // the ledger's own

const (
	sqlPrimaryCheck = `SELECT ledger.primary_check($1)`
	// sqlTimeline does not need the migration: a connection is checked
	// before the schema may exist.
	sqlTimeline = `SELECT CASE WHEN pg_is_in_recovery() THEN 0
    ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END`
)

// PrimaryGuard is the newest WAL timeline the ledger has written to. It
// only rises. The zero value refuses nothing until it learns a timeline.
type PrimaryGuard struct {
	newest atomic.Int64
	// pools are the pools of the stores that use the guard (New). They are
	// reset when it learns a newer timeline: each connection they hold
	// was checked against an older one, and may reach an old primary.
	mu    sync.Mutex
	pools []*pgxpool.Pool
}

// track resets pool whenever the guard learns a newer timeline.
func (g *PrimaryGuard) track(pool *pgxpool.Pool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pools = append(g.pools, pool)
}

// Newest is the newest timeline known.
func (g *PrimaryGuard) Newest() int64 { return g.newest.Load() }

// Raise makes timeline the newest known, if it is newer. A pool that
// connected under an older newest timeline (not none) is reset: its
// connections are checked again as they are made anew, so none stays on a
// superseded primary (an ingest that started while an old primary was
// back, first in the connection string, had its first connections there).
func (g *PrimaryGuard) Raise(timeline int64) {
	for {
		cur := g.newest.Load()
		if timeline <= cur {
			return
		}
		if g.newest.CompareAndSwap(cur, timeline) {
			if cur > 0 {
				g.mu.Lock()
				pools := slices.Clone(g.pools)
				g.mu.Unlock()
				for _, p := range pools {
					// Not here: Raise may run inside one of p's connects.
					go p.Reset()
				}
			}
			return
		}
	}
}

// buildUnguarded is set only in a build with the tag ledger_noguards
// (noguard_chaos.go): every guard is off.
var buildUnguarded bool

// check refuses a server on an older timeline than the newest known, and
// learns a newer one. A standby (timeline 0 here) is left to the
// connection string's target_session_attrs.
func (g *PrimaryGuard) check(timeline int64) error {
	if g == nil || buildUnguarded || timeline == 0 {
		return nil
	}
	if newest := g.newest.Load(); timeline < newest {
		return fmt.Errorf("%w: it writes on timeline %d, but the ledger has written to timeline %d; "+
			"fence or remove the old primary", ErrSupersededPrimary, timeline, newest)
	}
	g.Raise(timeline)
	return nil
}

// GuardPool makes pc's connections refuse a superseded primary: a
// connection to a server on an older timeline than g's newest fails, so
// that pgx tries the next host of a multi-host connection string.
func GuardPool(pc *pgxpool.Config, g *PrimaryGuard) {
	prev := pc.ConnConfig.ValidateConnect
	pc.ConnConfig.ValidateConnect = func(ctx context.Context, conn *pgconn.PgConn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		res := conn.ExecParams(ctx, sqlTimeline, nil, nil, nil, nil).Read()
		if res.Err != nil {
			return fmt.Errorf("fence: read the server's timeline: %w", res.Err)
		}
		if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
			return errors.New("fence: read the server's timeline: no row")
		}
		tl, err := strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
		if err != nil {
			return fmt.Errorf("fence: read the server's timeline: %w", err)
		}
		return g.check(tl)
	}
}

// Timeline reads the WAL timeline of the server one of the store's
// connections reaches (0 on a standby), and checks it as a new connection
// is checked.
func (s *Store) Timeline(ctx context.Context) (int64, error) {
	var tl int64
	if err := s.pool.QueryRow(ctx, sqlTimeline).Scan(&tl); err != nil {
		return 0, fmt.Errorf("fence: read the server's timeline: %w", err)
	}
	return tl, s.cfg.Primary.check(tl)
}

// primaryFloor is the timeline an append's server must be on; 0 checks
// nothing.
func (s *Store) primaryFloor() int64 {
	if g := s.cfg.Primary; g != nil && !buildUnguarded {
		return g.Newest()
	}
	return 0
}

// queuePrimaryCheck queues the append's check of its server's timeline.
func queuePrimaryCheck(pb *pgx.Batch, b *batch) {
	if b.timeline > 0 {
		pb.Queue(sqlPrimaryCheck, b.timeline)
	}
}

// readPrimaryCheck reads its result.
func readPrimaryCheck(br pgx.BatchResults, b *batch) error {
	if b.timeline > 0 {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("check the server's timeline: %w", err)
		}
	}
	return nil
}

// Primary is the store's superseded-primary guard (Config.Primary); nil if
// it has none.
func (s *Store) Primary() *PrimaryGuard { return s.cfg.Primary }
