package fence

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/pkg/wire"
)

// Store is the ledger's storage on PostgreSQL. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	// hooks are the test seams (hooks.go); the zero value is production.
	hooks hooks
	// heads is nil when the cache is disabled.
	heads *headCache
	// parts keeps partitions of ledger.events ready ahead of the appends.
	parts *partitionKeeper
	// last is what appends last read under the lease locks, which the fast
	// path predicts from.
	last *lastRead
	// fastAppends and missedPredictions count the attempts that took the
	// fast path, and those of them whose prediction missed.
	fastAppends, missedPredictions *atomic.Int64
	// replan has the connections plan again as the tables grow (replan.go).
	replan *replanner
}

// buildUnfenced is set only in a build with the tag ledger_nofence
// (nofence_chaos.go), the chaos run's negative control; never by an option.
var buildUnfenced bool

// New returns a Store on pool. The schema must be migrated (package migrations).
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{pool: pool, cfg: cfg, hooks: hooks{unfenced: buildUnfenced}, parts: &partitionKeeper{pool: pool}, last: &lastRead{},
		fastAppends: &atomic.Int64{}, missedPredictions: &atomic.Int64{}, replan: newReplanner()}
	if cfg.HeadCacheSize > 0 {
		s.heads = newHeadCache(cfg.HeadCacheSize)
	}
	if cfg.Primary != nil {
		cfg.Primary.track(pool)
	}
	return s, nil
}

// Partitions is the store's partition count N: partitions are 0..N-1.
func (s *Store) Partitions() int { return s.cfg.Partitions }

// Pool is the database the store works on, for the ingest's own tables
// beside the fence's (its shared quotas).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// MaxPayload is the largest event payload the store accepts (Config.MaxPayload).
func (s *Store) MaxPayload() int { return s.cfg.MaxPayload }

// Lease is a partition's lease as the database showed it.
type Lease struct {
	Partition  int
	Holder     string
	Generation int64
	// ExpiresAt is decided by the database clock.
	ExpiresAt time.Time
	// TTL is the TTL of the last grant or renewal.
	TTL time.Duration
	// Valid reports whether the lease had not expired when it was read.
	Valid bool
}

func (s *Store) checkLeaseArgs(partition int, holder string, needHolder bool, ttl time.Duration) error {
	if partition < 0 || partition >= s.cfg.Partitions {
		return leaseErr(ErrInvalid, nil, "partition %d is outside [0, %d)", partition, s.cfg.Partitions)
	}
	if needHolder && !wire.ValidHolder(holder) {
		return leaseErr(ErrInvalid, nil, "holder %q is not <principal>.<instance>, each 1..64 of [A-Za-z0-9_-]", holder)
	}
	if ttl != 0 && (ttl < TTLMin || ttl > TTLMax) {
		return leaseErr(ErrInvalid, nil, "ttl %v is outside [%v, %v]", ttl, TTLMin, TTLMax)
	}
	return nil
}

// scanLease reads a lease row (holder, generation, expires_at, ttl_ms,
// valid), and into extra any columns that follow.
func scanLease(row pgx.Row, partition int, extra ...any) (Lease, error) {
	l := Lease{Partition: partition}
	var ttlMS int64
	err := row.Scan(append([]any{&l.Holder, &l.Generation, &l.ExpiresAt, &ttlMS, &l.Valid}, extra...)...)
	l.TTL = time.Duration(ttlMS) * time.Millisecond
	return l, err
}

// Acquire takes partition's lease for holder for ttl (0: the configured TTL).
// A never-leased partition gets generation 1; an expired lease is taken over
// with generation + 1; the holder's own valid lease is re-granted with
// generation + 1 at once, unless the request is a retry of the grant that
// made it (WithRequestID): then that grant is returned unchanged. A valid
// lease of another holder fails with ErrHeld.
func (s *Store) Acquire(ctx context.Context, partition int, holder string, ttl time.Duration, opts ...AcquireOption) (Lease, error) {
	return s.acquire(ctx, partition, holder, ttl, nil, opts)
}

// AcquireOption is a per-call variant of Acquire.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	requestID string
	floor     int64
}

// WithGenerationFloor makes a new grant's generation at least floor: the
// ledger knows, from outside PostgreSQL, of grants up to floor - 1 that the
// database may have forgotten (a failover, a restore), so a fencing token
// is never issued twice.
func WithGenerationFloor(floor int64) AcquireOption {
	return func(o *acquireOptions) { o.floor = floor }
}

// WithRequestID names the acquire request, so that a retry of it (the
// reply was lost, the request timed out) gets the same grant instead of a
// second generation.
func WithRequestID(id string) AcquireOption {
	return func(o *acquireOptions) { o.requestID = id }
}

// TakeOver is Acquire as a compare-and-swap on the generation the caller
// observed: it succeeds only if the lease still shows generation observed
// (0: never leased) and is expired or the caller's own. Of many callers that
// observed the same generation, one wins; the others get ErrHeld (the winner
// holds it) or ErrObservationStale.
func (s *Store) TakeOver(ctx context.Context, partition int, holder string, observed int64, ttl time.Duration) (Lease, error) {
	return s.acquire(ctx, partition, holder, ttl, &observed, nil)
}

func (s *Store) acquire(ctx context.Context, partition int, holder string, ttl time.Duration, observed *int64, opts []AcquireOption) (Lease, error) {
	l, err := s.grant(ctx, partition, holder, ttl, observed, opts)
	if sqlState(err) == sqlStateOutOfRange {
		return l, outOfRange(err)
	}
	if errors.Is(err, ErrHeld) {
		// A partition that is not the holder's to lease is answered so
		// while another holds it too: waiting would not help.
		if why := s.rangeRefusal(ctx, partition, holder); why != "" {
			return l, &LeaseError{Kind: ErrForbidden, Msg: why}
		}
	}
	return l, s.cordoned(ctx, partition, err)
}

func (s *Store) grant(ctx context.Context, partition int, holder string, ttl time.Duration, observed *int64, opts []AcquireOption) (Lease, error) {
	var o acquireOptions
	for _, opt := range opts {
		opt(&o)
	}
	var reqID *string // NULL in the tables when the request has none
	if o.requestID != "" {
		reqID = &o.requestID
	}
	if err := s.checkLeaseArgs(partition, holder, true, ttl); err != nil {
		return Lease{}, err
	}
	if ttl == 0 {
		ttl = s.cfg.TTL
	}
	ttlMS := ttl.Milliseconds()
	var out Lease
	// A takeover's row lock can meet an append's in a deadlock, which
	// PostgreSQL breaks by aborting one of them: nothing was granted, so
	// the grant is tried again, as an append is (append.go).
	var err error
	for try := 0; ; try++ {
		err = s.acquireOnce(ctx, partition, holder, observed, ttlMS, reqID, o, &out)
		if c := sqlState(err); try < 4 && (c == pgerrcode.DeadlockDetected || c == pgerrcode.SerializationFailure) {
			continue
		}
		if ok, lerr := s.learnTimeline(ctx, err); lerr != nil {
			err = errors.Join(err, lerr)
		} else if ok && try < 4 {
			continue
		}
		return out, err
	}
}

// acquireOnce is one transaction of acquire.
func (s *Store) acquireOnce(ctx context.Context, partition int, holder string, observed *int64, ttlMS int64, reqID *string, o acquireOptions, out *Lease) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// A takeover holds the lease row FOR UPDATE: bounded like an append.
		if _, err := tx.Exec(ctx, sqlSetTimeouts, ms(s.cfg.StatementTimeout), ms(s.cfg.IdleInTransactionTimeout)); err != nil {
			return fmt.Errorf("fence: acquire partition %d: set timeouts: %w", partition, err)
		}
		// A grant on a superseded primary would be forgotten with it.
		if check, tl := s.primaryCheck(); check != "" {
			if _, err := tx.Exec(ctx, check, tl); err != nil {
				if sqlState(err) == sqlStatePrimaryCheck {
					return fmt.Errorf("%w: acquire partition %d: %w", ErrSupersededPrimary, partition, err)
				}
				return fmt.Errorf("fence: acquire partition %d: %w", partition, err)
			}
		}
		if observed == nil || *observed == 0 {
			l, err := scanLease(tx.QueryRow(ctx, sqlLeaseInsertFirst, partition, holder, ttlMS, reqID, o.floor), partition)
			if err == nil {
				*out = l
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("fence: acquire partition %d: %w", partition, err)
			}
		}
		var curReqID string
		cur, err := scanLease(tx.QueryRow(ctx, sqlLeaseLock, partition), partition, &curReqID)
		if err != nil {
			if errors.Is(err, pgx.ErrNoRows) && observed != nil {
				return leaseErr(ErrObservationStale, nil, "partition %d: observed generation %d but it was never leased", partition, *observed)
			}
			return fmt.Errorf("fence: lock lease of partition %d: %w", partition, err)
		}
		if cur.Valid && cur.Holder == holder && o.requestID != "" && curReqID == o.requestID {
			*out = cur // a retry of the grant that made this generation
			return nil
		}
		if cur.Valid && cur.Holder != holder {
			return leaseErr(ErrHeld, &cur, "partition %d is held by %s at generation %d until %s",
				partition, cur.Holder, cur.Generation, wire.FormatTime(cur.ExpiresAt))
		}
		want := cur.Generation
		if observed != nil {
			want = *observed
		}
		if want != cur.Generation {
			return leaseErr(ErrObservationStale, &cur, "partition %d: observed generation %d, current is %d",
				partition, want, cur.Generation)
		}
		l, err := scanLease(tx.QueryRow(ctx, sqlLeaseCAS, partition, holder, ttlMS, want, reqID, o.floor), partition)
		if errors.Is(err, pgx.ErrNoRows) {
			// Unreachable while the row lock is held; kept as a guard.
			return leaseErr(ErrObservationStale, &cur, "partition %d: compare-and-swap on generation %d failed", partition, want)
		}
		if err != nil {
			return fmt.Errorf("fence: take over partition %d: %w", partition, err)
		}
		*out = l
		return nil
	})
}

// Renew extends the lease by ttl (0: the lease's own TTL) from now by the
// database clock. It fails with ErrLost unless holder and generation are the
// current ones and the lease has not expired.
func (s *Store) Renew(ctx context.Context, partition int, holder string, generation int64, ttl time.Duration) (Lease, error) {
	if err := s.checkLeaseArgs(partition, holder, true, ttl); err != nil {
		return Lease{}, err
	}
	var ttlArg *int64
	if ttl != 0 {
		ms := ttl.Milliseconds()
		ttlArg = &ms
	}
	l, err := scanLease(s.pool.QueryRow(ctx, sqlLeaseRenew, partition, holder, generation, ttlArg), partition)
	if err == nil {
		return l, nil
	}
	// A renewal that passed its WHERE as the lease expired is refused by
	// the database's own fence (migration 00012): the lease is lost.
	if !errors.Is(err, pgx.ErrNoRows) && sqlState(err) != sqlStateLeaseFence {
		return Lease{}, fmt.Errorf("fence: renew partition %d: %w", partition, err)
	}
	return Lease{}, s.lostError(ctx, partition, holder, generation, "renew")
}

// sqlStateLeaseFence is raised by ledger.leases_fence (migration 00012)
// when a lease would move in a way the fence refuses.
const sqlStateLeaseFence = "LF006"

// Release ends the lease now. The generation is kept, so the next Acquire
// bumps it. It fails with ErrLost unless holder and generation are the
// current ones and the lease has not expired.
func (s *Store) Release(ctx context.Context, partition int, holder string, generation int64) error {
	if err := s.checkLeaseArgs(partition, holder, true, 0); err != nil {
		return err
	}
	var p int
	err := s.pool.QueryRow(ctx, sqlLeaseRelease, partition, holder, generation).Scan(&p)
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("fence: release partition %d: %w", partition, err)
	}
	return s.lostError(ctx, partition, holder, generation, "release")
}

func (s *Store) lostError(ctx context.Context, partition int, holder string, generation int64, op string) error {
	cur, err := s.Get(ctx, partition)
	if errors.Is(err, ErrNoLease) {
		return leaseErr(ErrLost, nil, "%s: partition %d was never leased", op, partition)
	}
	if err != nil {
		return err
	}
	switch {
	case generation > cur.Generation:
		return leaseErr(ErrLost, &cur, "%s: generation %d of partition %d was never granted; the current generation is %d",
			op, generation, partition, cur.Generation)
	case generation < cur.Generation:
		if a := s.revokeOf(ctx, partition, generation); a != nil {
			return &LeaseError{Kind: ErrLost, Current: &cur, Revoked: a, Msg: fmt.Sprintf(
				"%s: generation %d of partition %d was revoked by %s at %s (%s); the current generation is %d",
				op, generation, partition, a.By, a.At.UTC().Format(time.RFC3339), a.Reason, cur.Generation)}
		}
		return leaseErr(ErrLost, &cur, "%s: generation %d of partition %d is not the current one; the current generation is %d",
			op, generation, partition, cur.Generation)
	case cur.Holder != holder:
		return leaseErr(ErrLost, &cur, "%s: partition %d at generation %d is held by %s, not %s",
			op, partition, generation, cur.Holder, holder)
	}
	return leaseErr(ErrLost, &cur, "%s: %s no longer holds partition %d at generation %d: it expired or was released",
		op, holder, partition, generation)
}

// Get returns partition's lease, or ErrNoLease if it was never leased.
func (s *Store) Get(ctx context.Context, partition int) (Lease, error) {
	if err := s.checkLeaseArgs(partition, "", false, 0); err != nil {
		return Lease{}, err
	}
	l, err := scanLease(s.pool.QueryRow(ctx, sqlLeaseGet, partition), partition)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, leaseErr(ErrNoLease, nil, "partition %d was never leased", partition)
	}
	if err != nil {
		return Lease{}, fmt.Errorf("fence: get lease of partition %d: %w", partition, err)
	}
	return l, nil
}

// Leases returns every lease, by partition.
func (s *Store) Leases(ctx context.Context) ([]Lease, error) {
	rows, err := s.pool.Query(ctx, sqlLeaseList)
	if err != nil {
		return nil, fmt.Errorf("fence: list leases: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) {
		var l Lease
		var ttlMS int64
		err := r.Scan(&l.Partition, &l.Holder, &l.Generation, &l.ExpiresAt, &ttlMS, &l.Valid)
		l.TTL = time.Duration(ttlMS) * time.Millisecond
		return l, err
	})
}

// Head is a task's last committed version.
type Head struct {
	Task string
	// Known is false for a task with no committed event (Version 0).
	Known     bool
	Partition int
	Version   int64
	Seq       int64
	// Type is the type of the last committed event.
	Type string
	// Owner is the principal that wrote version 1, which alone may write
	// the task (Config.SharedTasks); "" for a task committed before the
	// ledger kept owners whose version 1 is archived.
	Owner string
	// Archived is how many of the task's first versions are archived
	// (ledgerctl archive): versions 1..Archived are no longer in the hot
	// log, but in the archive's files. 0 when none is.
	Archived int64
	// Kind is the task's kind, wire.KindEvents or wire.KindSnapshot,
	// pinned by its first committed event.
	Kind string
}

// TaskHead returns task's head.
func (s *Store) TaskHead(ctx context.Context, task string) (Head, error) {
	h := Head{Task: task}
	if !wire.ValidID(task) {
		return h, leaseErr(ErrInvalid, nil, "task id %q is not 1..128 of [A-Za-z0-9_-]", task)
	}
	err := s.pool.QueryRow(ctx, sqlTaskHead, task).Scan(&h.Partition, &h.Version, &h.Seq, &h.Type, &h.Owner, &h.Archived, &h.Kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("fence: head of task %s: %w", task, err)
	}
	h.Known = true
	return h, nil
}

// MaxTaskHeads is the most tasks one TaskHeads call may ask for.
const MaxTaskHeads = 1000

// TaskHeads returns the heads of tasks, in order, in one round trip: a
// worker starting on many fresh tasks learns them all at once.
func (s *Store) TaskHeads(ctx context.Context, tasks []string) ([]Head, error) {
	if len(tasks) > MaxTaskHeads {
		return nil, leaseErr(ErrInvalid, nil, "%d tasks asked for at once; at most %d", len(tasks), MaxTaskHeads)
	}
	out := make([]Head, len(tasks))
	for i, task := range tasks {
		if !wire.ValidID(task) {
			return nil, leaseErr(ErrInvalid, nil, "task id %q is not 1..128 of [A-Za-z0-9_-]", task)
		}
		out[i].Task = task
	}
	if len(tasks) == 0 {
		return out, nil
	}
	pb := &pgx.Batch{}
	pb.Queue(sqlTaskHeads, tasks)
	pb.Queue(sqlTaskHeadsArchived, tasks)
	br := s.pool.SendBatch(ctx, pb)
	defer br.Close()
	rows, _ := br.Query()
	var ord int64
	var h Head
	if _, err := pgx.ForEachRow(rows, []any{&ord, &h.Partition, &h.Version, &h.Seq, &h.Type, &h.Owner, &h.Kind}, func() error {
		if ord < 1 || ord > int64(len(out)) {
			return fmt.Errorf("a head for position %d of %d", ord, len(out))
		}
		h.Task, h.Known = out[ord-1].Task, true
		out[ord-1] = h
		return nil
	}); err != nil {
		return nil, fmt.Errorf("fence: heads of %d tasks: %w", len(tasks), err)
	}
	archived := map[string]int64{}
	rows, _ = br.Query()
	var task string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&task, &n}, func() error {
		archived[task] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("fence: archived versions of %d tasks: %w", len(tasks), err)
	}
	if len(archived) > 0 {
		for i := range out {
			out[i].Archived = archived[out[i].Task]
		}
	}
	return out, br.Close()
}
