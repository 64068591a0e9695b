package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// leaseViewQueue bounds the lease changes waiting to be mirrored; beyond
// it a change is dropped, and the partition's next renewal writes it.
const leaseViewQueue = 1024

// leaseView mirrors the lease service's grants, renewals and releases into
// the bucket ledger_leases (docs/contract.md §10). It is an optimisation for
// downstream readers, never the fence: a lease request never waits for it,
// and a failure to write is logged, not answered.
type leaseView struct {
	kv  jetstream.KeyValue
	ch  chan wire.LeaseView
	log *slog.Logger
}

// startLeaseView applies the bucket and mirrors into it until ctx ends. It
// returns nil, after logging why, when the bucket cannot be applied (a
// deployment whose ingest may not write it): the ledger runs without it.
func startLeaseView(ctx context.Context, js jetstream.JetStream, opts streams.Options, log *slog.Logger) *leaseView {
	kv, err := streams.ApplyBucket(ctx, js, wire.BucketLeases, opts)
	if err != nil {
		log.Warn("lease view off: bucket not applied", slog.String("bucket", wire.BucketLeases), slog.String("error", err.Error()))
		return nil
	}
	v := &leaseView{kv: kv, ch: make(chan wire.LeaseView, leaseViewQueue), log: log}
	go v.run(ctx)
	return v
}

// granted and released queue a change; both do nothing on a nil view.
func (v *leaseView) granted(l fence.Lease) {
	v.queue(wire.LeaseView{Partition: l.Partition, Holder: l.Holder, Generation: l.Generation,
		ExpiresAt: wire.FormatTime(l.ExpiresAt), TTLMillis: l.TTL.Milliseconds()})
}

func (v *leaseView) released(partition int, holder string, generation int64) {
	v.queue(wire.LeaseView{Partition: partition, Holder: holder, Generation: generation, Released: true})
}

func (v *leaseView) queue(lv wire.LeaseView) {
	if v == nil {
		return
	}
	select {
	case v.ch <- lv:
	default:
		v.log.Warn("lease view: queue full; change dropped", slog.Int("partition", lv.Partition),
			slog.Int64("generation", lv.Generation))
	}
}

func (v *leaseView) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case lv := <-v.ch:
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := v.write(wctx, lv); err != nil && ctx.Err() == nil {
				v.log.Warn("lease view: write failed", slog.Int("partition", lv.Partition),
					slog.Int64("generation", lv.Generation), slog.String("error", err.Error()))
			}
			cancel()
		}
	}
}

// write stores lv unless the bucket already shows a newer state of the
// partition (another ingest got there first), by compare-and-set on the
// key's revision.
func (v *leaseView) write(ctx context.Context, lv wire.LeaseView) error {
	b, err := json.Marshal(lv)
	if err != nil {
		return fmt.Errorf("encode lease view: %w", err)
	}
	key := wire.LeaseViewKey(lv.Partition)
	for range 3 {
		e, err := v.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err = v.kv.Create(ctx, key, b); err == nil {
				return nil
			}
		case err != nil:
			return fmt.Errorf("read %s: %w", key, err)
		default:
			var cur wire.LeaseView
			if json.Unmarshal(e.Value(), &cur) == nil && !newerView(lv, cur) {
				return nil
			}
			if _, err = v.kv.Update(ctx, key, b, e.Revision()); err == nil {
				return nil
			}
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return fmt.Errorf("write %s: %w", key, err)
		}
	}
	return fmt.Errorf("write %s: lost the race three times", key)
}

// isWrongSequence tells a lost compare-and-set of Update.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// newerView reports whether a is a later state of its partition than b: a
// higher generation; within one, a release; between two renewals, the
// later expiry.
func newerView(a, b wire.LeaseView) bool {
	switch {
	case a.Generation != b.Generation:
		return a.Generation > b.Generation
	case a.Released || b.Released:
		return a.Released && !b.Released
	}
	ta, errA := time.Parse(time.RFC3339Nano, a.ExpiresAt)
	tb, errB := time.Parse(time.RFC3339Nano, b.ExpiresAt)
	return errA == nil && (errB != nil || ta.After(tb))
}
