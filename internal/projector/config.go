package projector

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of Config.
const (
	// BatchSizeDefault is the most events handled per turn: 1000.
	BatchSizeDefault = 1000
	// CatchUpBatchSizeDefault is the most events a turn takes while the
	// projector is behind: 10,000.
	CatchUpBatchSizeDefault = 10_000
	// CatchUpWaitDefault is how long a catch-up turn waits for its next
	// message before it goes with what it has: 20 ms.
	CatchUpWaitDefault = 20 * time.Millisecond
	// RefetchEveryDefault is how often due re-fetches are looked for: 250 ms.
	RefetchEveryDefault = 250 * time.Millisecond
	// RefetchLimitDefault caps the versions one re-fetch reads per task: 10,000.
	RefetchLimitDefault = 10_000
	// RetryMinDefault and RetryMaxDefault bound the backoff of failed writes
	// and of redelivered messages: 100 ms doubling to 5 s.
	RetryMinDefault = 100 * time.Millisecond
	RetryMaxDefault = 5 * time.Second
	// AckWaitDefault is the projector consumer's ack wait: 30 s.
	AckWaitDefault = 30 * time.Second
	// TasksQuotaDefault is one principal's share of ledger_tasks: 64 MiB of
	// values, refilled at that much an hour. Beyond it a task's value is
	// written without its data.
	TasksQuotaDefault = 64 << 20
	// StopTimeoutDefault bounds Stop: 10 s.
	StopTimeoutDefault = 10 * time.Second
	// ReconcileEveryDefault is how often a page of task heads is compared
	// with the projections: 5 s.
	ReconcileEveryDefault = 5 * time.Second
	// ReconcilePageDefault is how many task heads one reconciliation reads: 500.
	ReconcilePageDefault = 500
	// ReconcileGraceDefault is how long a head is left to its log copy before
	// a projection below it counts as behind: 30 s.
	ReconcileGraceDefault = 30 * time.Second
)

// Config configures a projector.
type Config struct {
	// Prefix is the subject prefix; default "ledger".
	Prefix string
	// PartitionCount is N; default 16.
	PartitionCount int
	// Partitions is the set this projector owns; nil means all. Projectors
	// on disjoint sets may run side by side.
	Partitions []int
	// Replicas of the bucket; default 1.
	Replicas int
	// BatchSize is the most events per turn, a log batch counting as
	// many as it holds; default 1000.
	BatchSize int
	// CatchUpBatchSize is the most events per turn while the projector
	// is behind (a turn found BatchSize events waiting): it
	// keeps taking them, each within CatchUpWait, up to this many. A task
	// gets one bucket write a turn, so a larger turn folds a backlog with
	// fewer writes. Default 10,000; BatchSize turns it off. A turn's
	// messages, the ones waiting for it (2 × BatchSize events) and the
	// ones the pulls buffer (16 MiB) are all unacked: keep the turn well
	// within the consumer's max_ack_pending (20,000 messages), or turns
	// end short of it.
	CatchUpBatchSize int
	// CatchUpWait is how long a catch-up turn waits for its next message;
	// it collects for ten times as long at most, which is what a turn can
	// add to the time a change takes to reach the bucket. Default 20 ms.
	CatchUpWait time.Duration
	// RefetchEvery is the re-fetch timer; default 250 ms.
	RefetchEvery time.Duration
	// RefetchLimit caps the versions read per task per re-fetch; default 10,000.
	RefetchLimit int
	// RetryMin and RetryMax bound the backoff of failed writes and of
	// redelivered messages; default 100 ms and 5 s.
	RetryMin, RetryMax time.Duration
	// AckWait is the consumer's ack wait; default 30 s.
	AckWait time.Duration
	// StopTimeout bounds Stop: how long it lets the turn in hand finish
	// before it cancels the turn's I/O and hands its messages back to
	// JetStream; default 10 s.
	StopTimeout time.Duration
	// ReconcileEvery is how often a page of ledger.heads is compared with
	// the projections, and what they miss folded from PostgreSQL
	// (reconcile.go); default 5 s, negative turns it off.
	ReconcileEvery time.Duration
	// ReconcilePage is how many heads one reconciliation reads; default 500.
	// A whole sweep takes tasks / ReconcilePage × ReconcileEvery.
	ReconcilePage int
	// ReconcileGrace is how long a head is left to its log copy before a
	// projection below it counts as behind; default 30 s.
	ReconcileGrace time.Duration
	// TasksMaxBytes and MarksMaxBytes size the buckets ledger_tasks and
	// ledger_projector (max_bytes). 0 keeps the size of the definition in
	// streams/ (512 MiB and 32 MiB), -1 lifts the limit. streams/README.md
	// says what the projector does when a bucket is full.
	TasksMaxBytes, MarksMaxBytes int64
	// TasksQuota is one principal's value bytes in ledger_tasks (the
	// principal of the event that changed the value), refilled at that much
	// an hour. A value over it is written as one too large for the bucket
	// is, without its data (data null, data_too_large its size), so one
	// principal cannot fill the bucket for everyone. Every projector of the
	// ledger draws from the same count, kept in PostgreSQL (internal/quota,
	// Shared). Default 64 MiB.
	TasksQuota int64
	// Engine configures the ordering engine (gap timeout default 5 s, buffer
	// caps); its clock defaults to time.Now.
	Engine projection.Config
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, wire.PrefixDefault)
	c.PartitionCount = cmp.Or(c.PartitionCount, wire.PartitionsDefault)
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.CatchUpBatchSize = cmp.Or(c.CatchUpBatchSize, max(CatchUpBatchSizeDefault, c.BatchSize))
	c.CatchUpWait = cmp.Or(c.CatchUpWait, CatchUpWaitDefault)
	c.RefetchEvery = cmp.Or(c.RefetchEvery, RefetchEveryDefault)
	c.RefetchLimit = cmp.Or(c.RefetchLimit, RefetchLimitDefault)
	c.RetryMin = cmp.Or(c.RetryMin, RetryMinDefault)
	c.RetryMax = cmp.Or(c.RetryMax, RetryMaxDefault)
	c.AckWait = cmp.Or(c.AckWait, AckWaitDefault)
	c.StopTimeout = cmp.Or(c.StopTimeout, StopTimeoutDefault)
	c.ReconcileEvery = cmp.Or(c.ReconcileEvery, ReconcileEveryDefault)
	c.ReconcilePage = cmp.Or(c.ReconcilePage, ReconcilePageDefault)
	c.ReconcileGrace = cmp.Or(c.ReconcileGrace, ReconcileGraceDefault)
	c.TasksQuota = cmp.Or(c.TasksQuota, TasksQuotaDefault)
	c.Engine = c.Engine.WithDefaults()
	return c
}

func (c Config) validate() error {
	for _, p := range c.Partitions {
		if p < 0 || p >= c.PartitionCount {
			return fmt.Errorf("projector: partition %d is outside [0, %d)", p, c.PartitionCount)
		}
	}
	if !wire.ValidID(c.Prefix) {
		return fmt.Errorf("projector: prefix %q must be one subject token", c.Prefix)
	}
	if c.BatchSize < 1 || c.RefetchLimit < 1 || c.ReconcilePage < 1 {
		return fmt.Errorf("projector: batch size, re-fetch limit and reconciliation page must be positive")
	}
	if c.CatchUpBatchSize < c.BatchSize || c.CatchUpWait < 0 {
		return fmt.Errorf("projector: catch-up batch size must be at least the batch size (%d), its wait not negative", c.BatchSize)
	}
	if c.TasksQuota < 1 {
		return fmt.Errorf("projector: tasks quota must be positive, got %d", c.TasksQuota)
	}
	if c.StopTimeout < 0 || c.TasksMaxBytes < -1 || c.MarksMaxBytes < -1 {
		return fmt.Errorf("projector: stop timeout must not be negative, bucket sizes -1 or more")
	}
	return nil
}

// durable is the consumer name of the configured partition set.
func (c Config) durable() string {
	if c.Partitions == nil {
		return "projector"
	}
	return "projector-" + FormatPartitions(c.Partitions)
}

// filters are the LEDGER_LOG subjects of the configured partitions.
func (c Config) filters() []string {
	subj := wire.Subjects{Prefix: c.Prefix}
	if c.Partitions == nil {
		return []string{subj.LogAll()}
	}
	out := make([]string, len(c.Partitions))
	for i, p := range c.Partitions {
		out[i] = subj.LogPartition(p)
	}
	return out
}

// partitionsOrAll is the set as a list, every partition when nil.
func (c Config) partitionsOrAll() []int32 {
	var out []int32
	if c.Partitions == nil {
		for p := range c.PartitionCount {
			out = append(out, int32(p))
		}
		return out
	}
	for _, p := range c.Partitions {
		out = append(out, int32(p))
	}
	return out
}

// ParsePartitions reads a partition set: "all" (or empty) for every
// partition (nil), or a list of numbers and ranges such as "0-7" or "1,3,8-9".
func ParsePartitions(spec string, n int) ([]int, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "all" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(spec, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("partitions %q: %q is not a number", spec, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("partitions %q: %q is not a number", spec, hi)
			}
		}
		if a < 0 || b >= n || a > b {
			return nil, fmt.Errorf("partitions %q: %q is not within [0, %d)", spec, part, n)
		}
		for p := a; p <= b; p++ {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatPartitions writes a set back in its shortest range form ("0-7", "1_3").
// The separator between ranges is "_", so the result is a valid consumer name.
func FormatPartitions(ps []int) string {
	var parts []string
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ps[i], ps[j]))
		} else {
			parts = append(parts, strconv.Itoa(ps[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, "_")
}
