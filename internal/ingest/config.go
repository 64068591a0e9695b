package ingest

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of Config.
const (
	// BatchSizeDefault is the most events one fenced append takes: 500.
	BatchSizeDefault = 500
	// MaxBatchBytesDefault bounds the payload bytes of one batch: 4 MiB.
	MaxBatchBytesDefault = 4 << 20
	// BatchWaitDefault is how long a batch waits for more events after its
	// first one: 1 ms. Under load batches fill while the previous one
	// commits, so this only bounds the delay of a lone event.
	BatchWaitDefault = time.Millisecond
	// GapWindowDefault is how long an event whose version is ahead of its
	// task's head waits for the missing versions before its gap verdict: 30 s.
	GapWindowDefault = 30 * time.Second
	// RetryMinDefault and RetryMaxDefault bound the backoff of transient
	// failures (database or NATS unavailable): 100 ms doubling to 1 s, so
	// commits resume within about a second of the database coming back.
	RetryMinDefault = 100 * time.Millisecond
	RetryMaxDefault = time.Second
	// NotYetDelayMinDefault is the first redelivery delay of a "not yet"
	// event: 10 ms, doubling to NotYetDelayMaxDefault, 1 s. The missing
	// version is usually in flight in another batch or process, so the
	// first retries come quickly; a real gap costs one redelivery a second
	// per waiting event until its window closes.
	NotYetDelayMinDefault = 10 * time.Millisecond
	NotYetDelayMaxDefault = time.Second
	// MaxWaitingPerPrincipalDefault is how many of one principal's events
	// may wait in memory here for an earlier version at once: 4096, four
	// times the SDK's in-flight limit per lease.
	MaxWaitingPerPrincipalDefault = 4096
	// LeaseRateDefault and LeaseBurstDefault are one principal's share of
	// the lease service's requests: 200 a second, in bursts of up to 400.
	// A principal keeping 16 partitions renews about 16 times a second.
	LeaseRateDefault  = 200
	LeaseBurstDefault = 400
	// LeaseInFlightDefault is how many of one principal's requests may wait
	// or be served at once: 64.
	LeaseInFlightDefault = 64
	// LeaseWorkersDefault is how many lease requests are served at once: 4.
	LeaseWorkersDefault = 4
	// LeaseMaxAgeDefault is how long a lease request may wait to be served
	// before it is dropped unanswered: 2 s, the Go SDK's request timeout.
	LeaseMaxAgeDefault = 2 * time.Second
	// DeadLetterQuotaDefault is one principal's share of LEDGER_DLQ: 64 MiB
	// of dead letters, refilled at that much an hour. Beyond it a letter
	// keeps the verdict and drops the message's body and headers.
	DeadLetterQuotaDefault = 64 << 20
	// ClaimTTLDefault is how long an ingest's claim on a partition lasts
	// without a heartbeat: 3 s. An ingest beats every ClaimTTL/3; when one
	// dies or stalls, another takes its partitions over about this long
	// after its last beat.
	ClaimTTLDefault = 3 * time.Second
	// MaxPartitions is the most partitions an ingest decides: 4096. Each
	// has a JetStream consumer of its own, and LEDGER_IN a subject.
	MaxPartitions = 4096
	// StopTimeoutDefault bounds how long Stop waits for batches in hand: 10 s.
	StopTimeoutDefault = 10 * time.Second
)

// LanesDefault is how many batches are processed at once when Config.Lanes
// is not set: one per CPU the process may use (GOMAXPROCS), at least 2 and
// at most 8. Events are routed to lanes by partition, so one partition's
// events stay in order. Each lane already overlaps its next append with its
// previous batch's copies and acks; more lanes than CPUs only add
// transactions that compete for them (docs/internals/benchmarks.md has the figures).
func LanesDefault() int { return min(max(runtime.GOMAXPROCS(0), 2), 8) }

// Config configures the ingest service. Partition count, lease TTL and
// payload limit are the fence.Store's.
type Config struct {
	// Prefix is the subject prefix; default "ledger".
	Prefix string
	// Replicas is the replica count of the streams; default 1.
	Replicas int
	// BatchSize is the most events per fenced append; default 500.
	BatchSize int
	// MaxBatchBytes ends a batch once its payloads reach this many bytes;
	// default 4 MiB. A batch holds its partitions' lease rows locked until
	// it commits, and a takeover waits for it: large events in full
	// batches would keep a standby waiting long enough for its acquire to
	// time out.
	MaxBatchBytes int
	// BatchWait bounds how long a batch waits to fill; default 1 ms.
	BatchWait time.Duration
	// GapWindow is the gap retry window; default 30 s.
	GapWindow time.Duration
	// Lanes is the number of batches processed concurrently; default
	// LanesDefault().
	Lanes int
	// RetryMin and RetryMax bound the transient-failure backoff.
	RetryMin, RetryMax time.Duration
	// NotYetDelayMin and NotYetDelayMax bound the redelivery delay of
	// events that wait for an earlier version.
	NotYetDelayMin, NotYetDelayMax time.Duration
	// StopTimeout bounds Stop's wait for the batches in hand; default 10 s.
	StopTimeout time.Duration
	// Version is reported by the lease micro service; default "1.0.0".
	Version string
	// AckWait is the ingest consumer's ack wait; default 10 s. Keep it well
	// below GapWindow: it is how long the messages of a crashed ingest wait
	// before another takes them, and their successors wait for them.
	AckWait time.Duration
	// MaxWaitingPerPrincipal caps one principal's events (all its
	// instances together: instances are free within a principal) waiting
	// in memory here for an earlier version; beyond it an event ahead of
	// its head is handed back to JetStream and offered again later, never
	// judged for it. Default 4096.
	MaxWaitingPerPrincipal int
	// MaxLeasesPerPrincipal caps the unexpired leases one principal (all
	// its instances together) may hold: an acquire beyond it is refused
	// (invalid). 0, the default, sets no cap.
	MaxLeasesPerPrincipal int
	// MaxLeaseTTL caps the TTL an acquire or a renewal may ask for; a
	// larger ttl_ms is refused (invalid). 0, the default, leaves the
	// contract's own bound, 300 s.
	MaxLeaseTTL time.Duration
	// LeaseRate and LeaseBurst are one principal's requests a second to
	// the lease service and the burst above it; beyond them a request is
	// answered rate_limited at once. Defaults 200 and 400.
	LeaseRate  float64
	LeaseBurst int
	// LeaseInFlight is how many of one principal's lease requests may wait
	// or be served at once; beyond it one is answered busy at once.
	// Default 64.
	LeaseInFlight int
	// LeaseWorkers is how many lease requests are served at once, taken
	// round-robin from the principals, renewals first. Default 4.
	LeaseWorkers int
	// LeaseMaxAge drops a lease request that waited longer to be served:
	// its requester has given up. Default 2 s.
	LeaseMaxAge time.Duration
	// DeadLetterQuota is one principal's dead letter bytes (bodies and
	// headers), refilled at that much an hour. A letter over it is stored
	// without the message's body and headers (Ledger-Truncated and
	// Ledger-Headers-Dropped say so), so one principal cannot push every
	// other's letters out of LEDGER_DLQ. Every ingest of the ledger draws
	// from the same count, kept in PostgreSQL (internal/quota, Shared).
	// Default 64 MiB.
	DeadLetterQuota int64
	// ClaimTTL is how long this ingest's claims on its partitions last
	// without a heartbeat; default 3 s.
	ClaimTTL time.Duration
	// Owner names this process in ledger.ingest_claims; default
	// host:pid:random, new for every process.
	Owner string
	// RequireDurability refuses to start, and fails readiness, while the
	// database offers less (fence.DurabilityLocal: fsync and
	// synchronous_commit on; fence.DurabilitySync: synchronous
	// replication too). Default none: below sync, the ingest starts and
	// warns.
	RequireDurability fence.DurabilityLevel
	// PublishTimeout bounds the wait for a copy's publish ack before the
	// copy is published again; default 5 s.
	PublishTimeout time.Duration
	// LogTailWindow is how far back, at start and after each reconnect to
	// NATS, the ingest checks that LEDGER_LOG holds every task's last
	// commit, and publishes again from PostgreSQL what it lacks
	// (logtail.go); default 10 min (past NATS's default sync interval of
	// 2 min), negative turns it off.
	LogTailWindow time.Duration
	// LogBatches stores each batch's commits in LEDGER_LOG as one message
	// per partition (docs/contract.md §4, "Log batches"), not one per
	// event. Every reader of LEDGER_LOG must read batches first. With it
	// on, each partition's events keep one lane, whichever inbox they come
	// from (logchain.go). Default off.
	LogBatches bool

	// hooks are test seams; nil in production.
	hooks *hooks
}

// hooks lets tests stop the pipeline at the point they want to crash it.
type hooks struct {
	// afterPublish runs after a batch's LEDGER_LOG/LEDGER_DLQ copies are
	// stored and before any inbound message is acked. Returning false
	// abandons the batch there, as a crash would.
	afterPublish func() bool
	// beforeAppend runs before each batch's fenced append.
	beforeAppend func(ctx context.Context)
	// loseAppendAnswer turns a committed append into a failure when it
	// returns true (pipeline.go, appendWithRetry).
	loseAppendAnswer func() bool
	// noEarlierCheck switches off the LEDGER_IN lookup that keeps an event
	// from its gap verdict while an earlier message of its task is queued.
	noEarlierCheck bool
	// noKeepAlive switches off the progress acks of held messages.
	noKeepAlive bool
	// dropCopy keeps the copies it returns true for from being sent.
	dropCopy func(m *nats.Msg) bool
	// noWitness switches off the generation witness (witness.go).
	noWitness bool
	// noTimelineWitness lets the store's primary guard take a newer
	// timeline before the witness records it (witness.go, recordTimeline).
	noTimelineWitness bool
	// noTimelineFollow leaves the guard to learn other ingests' newer
	// timelines at the beat only (service.go, streams.FollowTimeline).
	noTimelineFollow bool
	// noMemoryCheck switches off the check that the database holds every
	// acknowledged commit (forgotten.go).
	noMemoryCheck bool
	// noBatchDecode routes a batch message as a single event (it is then
	// invalid/bad_subject); noBatchGapCheck leaves earlier batches out of
	// the gap check; batchAckOnReceive acks a batch message when it
	// arrives, not once its events are durable (batch.go).
	noBatchDecode, noBatchGapCheck, batchAckOnReceive bool
	// staleAcks settles a message taken before a reconnect like any other
	// (staleack.go).
	staleAcks bool
	// noLogExpectations publishes log copies without the sequence of the
	// copy before them (order.go, planCopies).
	noLogExpectations bool
	// oneRound publishes all of a batch's copies at once, a task's later
	// versions beside its first (order.go, planCopies).
	oneRound bool
	// noLookupBatches refuses a batch of verdict lookups as an ingest
	// older than it does (leases.go).
	noLookupBatches bool
	// noRevive leaves a partition's vanished consumer gone (revive.go).
	noRevive bool
	// dropDirectGet sends no request for LEDGER_LOG's newest copies
	// (forgotten.go): its reply never comes.
	dropDirectGet bool
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, wire.PrefixDefault)
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.MaxBatchBytes = cmp.Or(c.MaxBatchBytes, MaxBatchBytesDefault)
	c.Lanes = cmp.Or(c.Lanes, LanesDefault())
	c.Version = cmp.Or(c.Version, "1.0.0")
	c.BatchWait = cmp.Or(c.BatchWait, BatchWaitDefault)
	c.GapWindow = cmp.Or(c.GapWindow, GapWindowDefault)
	c.RetryMin = cmp.Or(c.RetryMin, RetryMinDefault)
	c.RetryMax = cmp.Or(c.RetryMax, RetryMaxDefault)
	c.NotYetDelayMin = cmp.Or(c.NotYetDelayMin, NotYetDelayMinDefault)
	c.NotYetDelayMax = cmp.Or(c.NotYetDelayMax, NotYetDelayMaxDefault)
	c.StopTimeout = cmp.Or(c.StopTimeout, StopTimeoutDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	c.LogTailWindow = cmp.Or(c.LogTailWindow, LogTailWindowDefault)
	c.AckWait = cmp.Or(c.AckWait, AckWaitDefault)
	c.MaxWaitingPerPrincipal = cmp.Or(c.MaxWaitingPerPrincipal, MaxWaitingPerPrincipalDefault)
	c.ClaimTTL = cmp.Or(c.ClaimTTL, ClaimTTLDefault)
	c.DeadLetterQuota = cmp.Or(c.DeadLetterQuota, DeadLetterQuotaDefault)
	c.LeaseRate = cmp.Or(c.LeaseRate, LeaseRateDefault)
	c.LeaseBurst = cmp.Or(c.LeaseBurst, LeaseBurstDefault)
	c.LeaseInFlight = cmp.Or(c.LeaseInFlight, LeaseInFlightDefault)
	c.LeaseWorkers = cmp.Or(c.LeaseWorkers, LeaseWorkersDefault)
	c.LeaseMaxAge = cmp.Or(c.LeaseMaxAge, LeaseMaxAgeDefault)
	c.RequireDurability = cmp.Or(c.RequireDurability, fence.DurabilityNone)
	return c
}

func (c Config) validate() error {
	switch {
	case !wire.ValidID(c.Prefix):
		return fmt.Errorf("ingest: prefix %q must be one subject token of [A-Za-z0-9_-]", c.Prefix)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("ingest: replicas must be 1..5, got %d", c.Replicas)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("ingest: batch size must be 1..10000, got %d", c.BatchSize)
	case c.MaxBatchBytes < 1:
		return fmt.Errorf("ingest: max batch bytes must be positive, got %d", c.MaxBatchBytes)
	case c.Lanes < 1 || c.Lanes > 256:
		return fmt.Errorf("ingest: lanes must be 1..256, got %d", c.Lanes)
	case c.GapWindow < 0 || c.BatchWait < 0 || c.PublishTimeout < 0:
		return fmt.Errorf("ingest: gap window, batch wait and publish timeout must not be negative")
	case c.RetryMin > c.RetryMax || c.NotYetDelayMin > c.NotYetDelayMax:
		return fmt.Errorf("ingest: a minimum delay is above its maximum")
	case c.AckWait < 100*time.Millisecond:
		return fmt.Errorf("ingest: ack wait must be at least 100ms, got %v", c.AckWait)
	case !slices.Contains([]fence.DurabilityLevel{fence.DurabilityNone, fence.DurabilityLocal, fence.DurabilitySync}, c.RequireDurability):
		return fmt.Errorf("ingest: required durability must be none, local or sync, got %q", c.RequireDurability)
	case c.ClaimTTL < 300*time.Millisecond:
		return fmt.Errorf("ingest: claim TTL must be at least 300ms, got %v", c.ClaimTTL)
	case c.LeaseRate <= 0 || c.LeaseBurst < 1 || c.LeaseInFlight < 1 || c.LeaseWorkers < 1 || c.LeaseWorkers > 256 || c.LeaseMaxAge <= 0:
		return fmt.Errorf("ingest: lease rate, burst, in-flight and max age must be positive, and workers 1..256")
	case c.DeadLetterQuota < 1:
		return fmt.Errorf("ingest: dead letter quota must be positive, got %d", c.DeadLetterQuota)
	case c.MaxWaitingPerPrincipal < 1:
		return fmt.Errorf("ingest: max waiting per principal must be at least 1, got %d", c.MaxWaitingPerPrincipal)
	case c.MaxLeasesPerPrincipal < 0:
		return fmt.Errorf("ingest: max leases per principal must not be negative, got %d", c.MaxLeasesPerPrincipal)
	case c.MaxLeaseTTL != 0 && (c.MaxLeaseTTL < fence.TTLMin || c.MaxLeaseTTL > fence.TTLMax):
		return fmt.Errorf("ingest: max lease TTL must be within %v..%v, got %v", fence.TTLMin, fence.TTLMax, c.MaxLeaseTTL)
	}
	return nil
}

// owner is the id this process claims partitions under.
func (c Config) owner() string { return cmp.Or(c.Owner, ownerID()) }
