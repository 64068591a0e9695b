package worker

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of Config.
const (
	// TTLDefault is the lease TTL the client asks for: 3 s, the contract's
	// default.
	TTLDefault = wire.TTLDefaultMillis * time.Millisecond
	// RequestTimeoutDefault bounds one request to the lease service when the
	// caller's context has no deadline: 2 s.
	RequestTimeoutDefault = 2 * time.Second
	// MaxInFlightDefault is how many events of one lease may be published
	// and still wait for their receipt: 1024.
	MaxInFlightDefault = 1024
	// PublishAckTimeoutDefault is how long one publish attempt waits for
	// JetStream's ack before it is sent again (same event id): 5 s.
	PublishAckTimeoutDefault = 5 * time.Second
	// ReceiptTimeoutDefault is how long after its publish ack an event
	// waits for its receipt before the client asks the ledger for its
	// verdict, and then how often it asks again: 10 s.
	ReceiptTimeoutDefault = 10 * time.Second
	// BatchMaxDefault is the most events of one lease sent in one batch
	// message: 256.
	BatchMaxDefault = 256
	// BatchLingerDefault is how long the first event of a batch waits for
	// more before the batch leaves: 1 ms.
	BatchLingerDefault = time.Millisecond
	// BatchMaxBytesDefault bounds a batch message's body: 512 KiB, half
	// the server's default max_payload.
	BatchMaxBytesDefault = 512 << 10
	// LookupBatchMaxDefault is the most verdict lookups in one request:
	// 1000, the ledger's limit.
	LookupBatchMaxDefault = 1000
)

// Config configures a Client. Only Holder is required.
type Config struct {
	// Holder is the holder id the client acquires leases and publishes as:
	// <principal>.<instance>, each 1..64 of [A-Za-z0-9_-] (wire.Holder).
	// The principal is the NATS user the connection authenticates as (in
	// an authenticated deployment the server lets it publish nothing
	// else); the instance names this process, such as a pod name. Required.
	// Two processes with the same holder fence each other: a new Acquire
	// by the same holder bumps the generation (docs/contract.md §1).
	Holder string
	// Prefix is the subject prefix; default "ledger".
	Prefix string
	// Partitions is the deployment's partition count N, used by
	// PartitionOf. Default 0: New asks the lease service for it, so it
	// agrees with the ingest's -partitions without being configured twice.
	// Set it to create a client while the service is not reachable.
	Partitions int
	// TTL is the lease TTL sent as ttl_ms with every acquire and renewal:
	// 100 ms..300 s, millisecond precision; default 3 s.
	TTL time.Duration
	// RenewEvery is the interval between renewals; default TTL/3. It must
	// be at most TTL/2, so a failed renewal still has time for a retry.
	RenewEvery time.Duration
	// RequestTimeout bounds a request to the lease service when the
	// caller's context has no earlier deadline; default 2 s. Acquire sends
	// an unanswered request again (same request_id) while its context lasts.
	RequestTimeout time.Duration
	// StandbyPoll is how often AcquireWait asks the service
	// (<prefix>.lease.get) whether a held lease has ended before its expiry,
	// as after a Release; default TTL/10. At its expiry AcquireWait tries at
	// once, whatever the poll.
	StandbyPoll time.Duration
	// MaxInFlight bounds the events of one lease that are published and
	// have no receipt yet; Publish blocks while it is reached. Default 1024.
	MaxInFlight int
	// MaxPayload is the largest payload Publish accepts; default 256 KiB,
	// the ledger's default limit.
	MaxPayload int
	// PublishAckTimeout is how long a publish attempt waits for JetStream's
	// ack before the event is published again under the same id (JetStream
	// and the ledger both deduplicate it); default 5 s.
	PublishAckTimeout time.Duration
	// ReceiptTimeout is how long an event waits for its receipt after its
	// publish ack (or after its last publish attempt, when the lease ended
	// before an ack) before the client asks the ledger for the event's
	// recorded verdict on <prefix>.task.head. Receipts travel on core NATS
	// and are lost while the client is disconnected; the answer settles the
	// event as its receipt would have. While the ledger has no verdict yet
	// (the event still waits in LEDGER_IN, or its message was lost) the
	// client asks again every ReceiptTimeout, one request at a time per
	// event, and publishes the event again on the 1st, 2nd, 4th, ... such
	// answer, after the lease ended too (that copy is answered stale).
	// Default 10 s.
	ReceiptTimeout time.Duration
	// BatchMax is the most events of one lease in one LEDGER_IN message
	// (docs/contract.md §2, "Batches"), 1..1000; default 256. 1 sends
	// every event alone. Against a ledger whose LEDGER_IN takes no batches
	// the client sends every event alone anyway.
	BatchMax int
	// BatchLinger is how long the first event of a batch waits for more
	// before the batch leaves; default 1 ms. Under load a batch fills
	// before then.
	BatchLinger time.Duration
	// BatchMaxBytes bounds a batch message's body, which must stay within
	// the server's max_payload; default 512 KiB. A larger event goes alone.
	BatchMaxBytes int
	// LookupBatchMax is the most verdict lookups (see ReceiptTimeout) sent
	// in one request, 1..1000; default 1000. Lookups that come due while
	// a request is in flight go together in the next one, so a burst
	// costs the principal's share of the lease service a few requests,
	// not one per event. 1 asks for each event alone, as does a client
	// whose ledger does not know the batch form.
	LookupBatchMax int
	// Logger receives the client's warnings (failed renewals, lost
	// leases); default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, wire.PrefixDefault)
	c.TTL = cmp.Or(c.TTL, TTLDefault)
	c.RenewEvery = cmp.Or(c.RenewEvery, c.TTL/3)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, RequestTimeoutDefault)
	c.StandbyPoll = cmp.Or(c.StandbyPoll, c.TTL/10)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, MaxInFlightDefault)
	c.MaxPayload = cmp.Or(c.MaxPayload, wire.MaxPayloadDefault)
	c.PublishAckTimeout = cmp.Or(c.PublishAckTimeout, PublishAckTimeoutDefault)
	c.ReceiptTimeout = cmp.Or(c.ReceiptTimeout, ReceiptTimeoutDefault)
	c.BatchMax = cmp.Or(c.BatchMax, BatchMaxDefault)
	c.BatchLinger = cmp.Or(c.BatchLinger, BatchLingerDefault)
	c.BatchMaxBytes = cmp.Or(c.BatchMaxBytes, BatchMaxBytesDefault)
	c.LookupBatchMax = cmp.Or(c.LookupBatchMax, LookupBatchMaxDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

func (c Config) validate() error {
	minTTL := time.Duration(wire.TTLMinMillis) * time.Millisecond
	maxTTL := time.Duration(wire.TTLMaxMillis) * time.Millisecond
	switch {
	case !wire.ValidHolder(c.Holder):
		return fmt.Errorf("worker: holder %q must be <principal>.<instance>, each 1..64 of [A-Za-z0-9_-] (the principal is the NATS user)", c.Holder)
	case !wire.ValidID(c.Prefix):
		return fmt.Errorf("worker: prefix %q must be one subject token of [A-Za-z0-9_-]", c.Prefix)
	case c.Partitions < 0:
		return fmt.Errorf("worker: partitions must be at least 1 (or 0: ask the service), got %d", c.Partitions)
	case c.TTL < minTTL || c.TTL > maxTTL || c.TTL%time.Millisecond != 0:
		return fmt.Errorf("worker: ttl %v must be whole milliseconds in [%v, %v]", c.TTL, minTTL, maxTTL)
	case c.RenewEvery <= 0 || c.RenewEvery > c.TTL/2:
		return fmt.Errorf("worker: renew interval %v must be in (0, ttl/2 = %v]", c.RenewEvery, c.TTL/2)
	case c.RequestTimeout <= 0 || c.PublishAckTimeout <= 0 || c.ReceiptTimeout <= 0 || c.StandbyPoll <= 0:
		return fmt.Errorf("worker: request, publish ack and receipt timeouts and the standby poll must be positive")
	case c.MaxInFlight < 1:
		return fmt.Errorf("worker: max in flight must be at least 1, got %d", c.MaxInFlight)
	case c.BatchMax < 1 || c.BatchMax > wire.MaxBatch:
		return fmt.Errorf("worker: batch max must be 1..%d, got %d", wire.MaxBatch, c.BatchMax)
	case c.BatchLinger < 0 || c.BatchMaxBytes < 1:
		return fmt.Errorf("worker: batch linger must not be negative and batch max bytes positive")
	case c.LookupBatchMax < 1 || c.LookupBatchMax > LookupBatchMaxDefault:
		return fmt.Errorf("worker: lookup batch max must be 1..%d, got %d", LookupBatchMaxDefault, c.LookupBatchMax)
	case c.MaxPayload < 1:
		return fmt.Errorf("worker: max payload must be at least 1 byte, got %d", c.MaxPayload)
	}
	return nil
}

// safetyMargin is how much earlier than TTL after a request was sent the
// client stops trusting the lease it confirmed: 2% of the TTL for clock-rate
// drift between this host and the database, plus 25 ms for a timer that
// fires late on a busy host.
func safetyMargin(ttl time.Duration) time.Duration {
	return ttl/50 + 25*time.Millisecond
}
