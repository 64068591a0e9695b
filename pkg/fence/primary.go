package fence

// The superseded-primary guard. A standby that is promoted starts a new
// WAL timeline; an old primary that comes back writable stays on its old
// one. A PrimaryGuard holds the newest timeline the ledger has written to
// (an ingest keeps it in the bucket ledger_witness, beside the grants), and
// refuses anything older: a new connection to such a server fails, so a
// multi-host connection string moves on to the next host, and every append
// checks it in its own transaction (ledger.primary_check, migration 00010).
//
// A newer timeline is witnessed before anything is written on it: when a
// guard with a witness (SetWitness) meets a server on a newer timeline, the
// connection waits until the witness recorded it, and an append or a grant
// on a connection that shows a timeline the witness has not recorded fails
// inside its transaction (migration 00019) and runs again once it has.
// Otherwise an ingest that starts against the writable old primary in the
// moment between the newest primary's first commit and its witnessing
// would take the old one for the newest, and grant and commit there.

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

// ErrUnwitnessedTimeline is the error of a connection to a server on a
// newer timeline than the newest the witness recorded, while the witness
// cannot record it (SetWitness): nothing is written there until it can.
// It is transient (IsTransient).
var ErrUnwitnessedTimeline = errors.New("fence: the server's timeline is not witnessed yet")

// sqlStatePrimaryCheck is raised by ledger.primary_check (migration 00010).
const sqlStatePrimaryCheck = "LF004" // the ledger's own

// sqlStateUnwitnessed is raised by ledger.primary_check(min, max) on a
// server whose timeline is above max (migration 00019).
const sqlStateUnwitnessed = "LF005" // the ledger's own

const (
	sqlPrimaryCheck      = `SELECT ledger.primary_check($1)`
	sqlPrimaryCheckExact = `SELECT ledger.primary_check($1, $1)`
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
	// witness records a newer timeline before the guard accepts it.
	witness atomic.Pointer[TimelineWitness]
}

// TimelineWitness records, outside the database, that the ledger is about
// to write on timeline, unless a newer one is recorded already, and
// returns the newest timeline recorded.
type TimelineWitness func(ctx context.Context, timeline int64) (newest int64, err error)

// SetWitness makes the guard accept a newer timeline only once w recorded
// it, and makes every append and grant check that its server's timeline
// is exactly the newest accepted. Set it before the first grant or append.
func (g *PrimaryGuard) SetWitness(w TimelineWitness) { g.witness.Store(&w) }

// exact reports whether appends and grants check their server's timeline
// for equality with the newest (a witness is set).
func (g *PrimaryGuard) exact() bool { return g.witness.Load() != nil }

// Track resets pool, whose connections GuardPool checks against g,
// whenever g learns a newer timeline: its connections were checked against
// an older one. A Store's pool is tracked already (New).
func (g *PrimaryGuard) Track(pool *pgxpool.Pool) { g.track(pool) }

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
// learns a newer one, once the witness (if any) recorded it. A standby
// (timeline 0 here) is left to the connection string's
// target_session_attrs.
func (g *PrimaryGuard) check(ctx context.Context, timeline int64) error {
	if g == nil || buildUnguarded || timeline == 0 {
		return nil
	}
	if err := g.refuseOlder(timeline); err != nil {
		return err
	}
	if w := g.witness.Load(); w != nil && timeline > g.newest.Load() {
		newest, err := (*w)(ctx, timeline)
		if err != nil {
			return fmt.Errorf("%w: record timeline %d before writing on it: %w", ErrUnwitnessedTimeline, timeline, err)
		}
		g.Raise(newest)
		if err := g.refuseOlder(timeline); err != nil {
			return err
		}
	}
	g.Raise(timeline)
	return nil
}

func (g *PrimaryGuard) refuseOlder(timeline int64) error {
	if newest := g.newest.Load(); timeline < newest {
		return fmt.Errorf("%w: it writes on timeline %d, but the ledger has written to timeline %d; "+
			"fence or remove the old primary", ErrSupersededPrimary, timeline, newest)
	}
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
		return g.check(ctx, tl)
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
	return tl, s.cfg.Primary.check(ctx, tl)
}

// primaryCheck is the check of the server's timeline a transaction that
// writes runs first: the statement and its argument, or "" for none. With
// a witness the timeline must be the newest witnessed (even while none
// is, so that the first write learns one); without, at least the newest
// known.
func (s *Store) primaryCheck() (string, int64) {
	g := s.cfg.Primary
	switch {
	case g == nil || buildUnguarded:
		return "", 0
	case g.exact():
		return sqlPrimaryCheckExact, g.Newest()
	case g.Newest() > 0:
		return sqlPrimaryCheck, g.Newest()
	}
	return "", 0
}

// learnTimeline handles a primary check's failure: on a server whose
// timeline the witness has not recorded (LF005), it records it, so that
// the transaction may run again; it reports whether it may.
func (s *Store) learnTimeline(ctx context.Context, err error) (bool, error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != sqlStateUnwitnessed {
		return false, nil
	}
	tl, perr := strconv.ParseInt(pgErr.Detail, 10, 64)
	if perr != nil {
		return false, fmt.Errorf("fence: the server's timeline in %q: %w", pgErr.Detail, perr)
	}
	if cerr := s.cfg.Primary.check(ctx, tl); cerr != nil {
		return false, cerr
	}
	return true, nil
}

// queuePrimaryCheck queues the append's check of its server's timeline.
func queuePrimaryCheck(pb *pgx.Batch, b *batch) {
	if b.primaryCheck != "" {
		pb.Queue(b.primaryCheck, b.timeline)
	}
}

// readPrimaryCheck reads its result.
func readPrimaryCheck(br pgx.BatchResults, b *batch) error {
	if b.primaryCheck != "" {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("check the server's timeline: %w", err)
		}
	}
	return nil
}

// Primary is the store's superseded-primary guard (Config.Primary); nil if
// it has none.
func (s *Store) Primary() *PrimaryGuard { return s.cfg.Primary }
