package fence

// Ingest claims: which ingest process decides each partition's events.
// Migration 00009 holds the tables; docs/operations.md says how partitions
// spread over ingests.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotClaimed is the error of an append made under claims the ingest no
// longer holds: another ingest took a partition of the batch over. Nothing
// of the batch was written; the caller stops deciding that partition.
var ErrNotClaimed = errors.New("fence: another ingest claimed a partition of the batch")

// sqlStateClaimCheck is raised by ledger.claim_check (migration 00009).
const sqlStateClaimCheck = "LF003" // the ledger's own

// Claims names what an append is made under: the ingest's owner id and,
// for each partition, the epoch of its claim. Every partition of the batch
// must be among them.
type Claims struct {
	Owner  string
	Epochs map[int]int64
}

// Claim is one partition's claim as the database holds it.
type Claim struct {
	Partition int
	Owner     string
	Epoch     int64
	// Valid is false once the claim expired: another ingest may take it.
	Valid bool
}

// IngestView is what one heartbeat of an ingest reads back.
type IngestView struct {
	// Members is how many ingests are alive, this one included.
	Members int
	// Claims are every partition's claim, by partition.
	Claims map[int]Claim
}

const (
	// sqlClaimCheck locks the batch's claim rows FOR KEY SHARE until commit
	// and raises unless this ingest holds each at the epoch given. A
	// takeover (sqlClaimLock, FOR UPDATE) waits for it.
	sqlClaimCheck = `
SELECT ledger.claim_check((SELECT count(*) FROM (
    SELECT 1 FROM ledger.ingest_claims c
    JOIN unnest($1::int[], $2::bigint[]) AS w(p, e) ON c.partition = w.p AND c.epoch = w.e
    WHERE c.owner = $3 FOR KEY SHARE OF c) held), cardinality($1::int[]))`

	// sqlIngestMember keeps owner a member; sqlIngestRenewClaims keeps the
	// claims it names alive.
	sqlIngestMember = `
INSERT INTO ledger.ingest_members (owner, expires_at, joined_at)
VALUES ($1, clock_timestamp() + $2::bigint * interval '1 millisecond', clock_timestamp())
ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at`
	sqlIngestRenewClaims = `
UPDATE ledger.ingest_claims SET expires_at = clock_timestamp() + $2::bigint * interval '1 millisecond'
WHERE owner = $1 AND partition = ANY($3::int[])`
	sqlIngestForget = `
DELETE FROM ledger.ingest_members WHERE expires_at < clock_timestamp() - interval '1 hour'`
	sqlIngestCount = `
SELECT count(*) FROM ledger.ingest_members WHERE expires_at > clock_timestamp()`
	sqlIngestClaims = `
SELECT partition, owner, epoch, expires_at > clock_timestamp() FROM ledger.ingest_claims`

	sqlClaimFirst = `
INSERT INTO ledger.ingest_claims (partition, owner, epoch, expires_at, claimed_at)
VALUES ($1, $2, 1, clock_timestamp() + $3::bigint * interval '1 millisecond', clock_timestamp())
ON CONFLICT (partition) DO NOTHING RETURNING epoch`

	// sqlClaimLock waits for every append that holds the claim row.
	sqlClaimLock = `
SELECT owner, epoch, expires_at > clock_timestamp() FROM ledger.ingest_claims WHERE partition = $1 FOR UPDATE`
	sqlClaimTake = `
UPDATE ledger.ingest_claims
SET owner = $2, epoch = epoch + 1, expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond',
    claimed_at = clock_timestamp()
WHERE partition = $1 AND epoch = $4 RETURNING epoch`

	// sqlClaimRelease expires a claim now and keeps its epoch; the next
	// claim raises it.
	// A released claim has no owner, so nobody's heartbeat renews it.
	sqlClaimRelease = `
UPDATE ledger.ingest_claims SET expires_at = clock_timestamp(), owner = ''
WHERE partition = $1 AND owner = $2 AND epoch = $3`
	sqlIngestLeave = `
WITH gone AS (DELETE FROM ledger.ingest_members WHERE owner = $1)
UPDATE ledger.ingest_claims SET expires_at = clock_timestamp(), owner = '' WHERE owner = $1`
)

// AppendClaimed is Append made under an ingest's claims: the transaction
// also locks the batch's claim rows and fails with ErrNotClaimed, writing
// nothing, unless c holds every partition of the batch at its epoch. An
// ingest that another one took over from can then commit and reject
// nothing more for the partitions it lost.
func (s *Store) AppendClaimed(ctx context.Context, c *Claims, events []Event) ([]Result, error) {
	return s.appendBatch(ctx, c, events)
}

// queueClaimCheck queues the check of the batch's claims, if it has any.
func queueClaimCheck(pb *pgx.Batch, b *batch) {
	if b.claims == nil || b.noClaimCheck {
		return
	}
	partitions, _, _ := b.keys()
	epochs := make([]int64, len(partitions))
	for i, p := range partitions {
		epochs[i] = b.claims.Epochs[int(p)]
	}
	pb.Queue(sqlClaimCheck, partitions, epochs, b.claims.Owner)
}

// readClaimCheck reads its result.
func readClaimCheck(br pgx.BatchResults, b *batch) error {
	if b.claims == nil || b.noClaimCheck {
		return nil
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("check the ingest's claims: %w", err)
	}
	return nil
}

// IngestHeartbeat keeps owner among the live ingests and its claims alive
// for ttl, and reads how many ingests are alive and every partition's
// claim. An ingest calls it every ttl/3 with the partitions it decides:
// only their claims are renewed, expired or not (a claim nobody took over
// is still this ingest's to decide). With renew false it only reads: an
// ingest that cannot serve its partitions (its NATS connection is down)
// lets its claims expire, for another to take over.
func (s *Store) IngestHeartbeat(ctx context.Context, owner string, ttl time.Duration, renew bool, partitions []int) (IngestView, error) {
	v := IngestView{Claims: map[int]Claim{}}
	pb := &pgx.Batch{}
	writes := 0
	if renew {
		parts := make([]int32, len(partitions))
		for i, p := range partitions {
			parts[i] = int32(p)
		}
		pb.Queue(sqlIngestMember, owner, ttl.Milliseconds())
		pb.Queue(sqlIngestRenewClaims, owner, ttl.Milliseconds(), parts)
		pb.Queue(sqlIngestForget)
		writes = 3
	}
	pb.Queue(sqlIngestCount)
	pb.Queue(sqlIngestClaims)
	br := s.pool.SendBatch(ctx, pb)
	defer br.Close()
	for range writes {
		if _, err := br.Exec(); err != nil {
			return v, fmt.Errorf("fence: ingest heartbeat: %w", err)
		}
	}
	if err := br.QueryRow().Scan(&v.Members); err != nil {
		return v, fmt.Errorf("fence: count ingests: %w", err)
	}
	rows, _ := br.Query()
	var c Claim
	if _, err := pgx.ForEachRow(rows, []any{&c.Partition, &c.Owner, &c.Epoch, &c.Valid}, func() error {
		v.Claims[c.Partition] = c
		return nil
	}); err != nil {
		return v, fmt.Errorf("fence: read claims: %w", err)
	}
	return v, br.Close()
}

// ClaimPartition makes owner the ingest that decides partition, for ttl:
// a partition never claimed gets epoch 1; an expired claim of another
// ingest is taken over once every append made under it has ended, with
// the epoch raised. It returns ok false, and no error, while another
// ingest's claim is valid. A claim that is already owner's is returned as
// it is.
func (s *Store) ClaimPartition(ctx context.Context, partition int, owner string, ttl time.Duration) (c Claim, ok bool, err error) {
	c = Claim{Partition: partition, Owner: owner, Valid: true}
	if partition < 0 || partition >= s.cfg.Partitions {
		return c, false, fmt.Errorf("fence: partition %d is outside [0, %d)", partition, s.cfg.Partitions)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlSetTimeouts, ms(s.cfg.StatementTimeout), ms(s.cfg.IdleInTransactionTimeout)); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, sqlClaimFirst, partition, owner, ttl.Milliseconds()).Scan(&c.Epoch)
		if err == nil {
			ok = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var cur Claim
		if err := tx.QueryRow(ctx, sqlClaimLock, partition).Scan(&cur.Owner, &cur.Epoch, &cur.Valid); err != nil {
			return err
		}
		if cur.Owner == owner && cur.Valid {
			c.Epoch, ok = cur.Epoch, true
			return nil
		}
		if cur.Valid {
			c = Claim{Partition: partition, Owner: cur.Owner, Epoch: cur.Epoch, Valid: true}
			return nil
		}
		if err := tx.QueryRow(ctx, sqlClaimTake, partition, owner, ttl.Milliseconds(), cur.Epoch).Scan(&c.Epoch); err != nil {
			return err
		}
		ok = true
		return nil
	})
	if err != nil {
		return c, false, fmt.Errorf("fence: claim partition %d: %w", partition, err)
	}
	return c, ok, nil
}

// ReleaseClaim ends owner's claim on a partition now, so that another
// ingest may take it at once. The epoch stays; the next claim raises it.
func (s *Store) ReleaseClaim(ctx context.Context, c Claim) error {
	if _, err := s.pool.Exec(ctx, sqlClaimRelease, c.Partition, c.Owner, c.Epoch); err != nil {
		return fmt.Errorf("fence: release the claim on partition %d: %w", c.Partition, err)
	}
	return nil
}

// LeaveIngests removes owner from the live ingests and ends its claims.
func (s *Store) LeaveIngests(ctx context.Context, owner string) error {
	if _, err := s.pool.Exec(ctx, sqlIngestLeave, owner); err != nil {
		return fmt.Errorf("fence: leave the ingests: %w", err)
	}
	return nil
}

// Claims reads every partition's claim, for operators (ledgerctl, the
// console).
func (s *Store) Claims(ctx context.Context) ([]Claim, error) {
	rows, _ := s.pool.Query(ctx, sqlIngestClaims+` ORDER BY partition`)
	var out []Claim
	var c Claim
	if _, err := pgx.ForEachRow(rows, []any{&c.Partition, &c.Owner, &c.Epoch, &c.Valid}, func() error {
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("fence: read claims: %w", err)
	}
	return out, nil
}
