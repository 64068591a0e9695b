package ingest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// witness keeps, outside PostgreSQL, the highest lease generation the
// ledger granted on each partition (bucket ledger_witness, key
// gen-<partition>). A grant is witnessed before its reply is sent, and the
// next grant's generation is above the witness, so a database that forgot
// grants (an asynchronous failover, a restore from backup) never hands one
// generation to two holders.
type witness struct {
	kv jetstream.KeyValue
	mu sync.Mutex
	// gens caches what this process last read or wrote; another ingest
	// may have raised a key since, so a grant reads the bucket again.
	gens map[int]int64
	// off is a test seam: grants are neither floored nor witnessed.
	off bool
}

func openWitness(ctx context.Context, js jetstream.JetStream, opts streams.Options) (*witness, error) {
	cfg, err := streams.Bucket(wire.BucketWitness, opts)
	if err != nil {
		return nil, err
	}
	kv, err := streams.CreateOrUpdateKeyValue(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("ingest: bucket %s: %w", wire.BucketWitness, err)
	}
	return &witness{kv: kv, gens: map[int]int64{}}, nil
}

func witnessKey(partition int) string { return "gen-" + strconv.Itoa(partition) }

// floor is the lowest generation the next grant on partition may have: one
// above every generation the ledger granted there.
func (w *witness) floor(ctx context.Context, partition int) (int64, error) {
	if w == nil || w.off {
		return 0, nil
	}
	g, _, err := w.read(ctx, partition)
	if err != nil {
		return 0, err
	}
	return g + 1, nil
}

func (w *witness) read(ctx context.Context, partition int) (int64, uint64, error) {
	e, err := w.kv.Get(ctx, witnessKey(partition))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("ingest: read the witnessed generation of partition %d: %w", partition, err)
	}
	g, err := strconv.ParseInt(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("ingest: witnessed generation of partition %d is %q: %w", partition, e.Value(), err)
	}
	w.mu.Lock()
	w.gens[partition] = max(w.gens[partition], g)
	w.mu.Unlock()
	return g, e.Revision(), nil
}

// grant records that generation was granted on partition, unless a higher
// one already is. Only then may the grant's reply be sent.
func (w *witness) grant(ctx context.Context, partition int, generation int64) error {
	if w == nil || w.off {
		return nil
	}
	w.mu.Lock()
	known := w.gens[partition]
	w.mu.Unlock()
	if known >= generation {
		return nil
	}
	for range 16 {
		cur, rev, err := w.read(ctx, partition)
		if err != nil {
			return err
		}
		if cur >= generation {
			return nil
		}
		val := []byte(strconv.FormatInt(generation, 10))
		if rev == 0 {
			_, err = w.kv.Create(ctx, witnessKey(partition), val)
		} else {
			_, err = w.kv.Update(ctx, witnessKey(partition), val, rev)
		}
		if err == nil {
			w.mu.Lock()
			w.gens[partition] = max(w.gens[partition], generation)
			w.mu.Unlock()
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLastSequence(err) {
			return fmt.Errorf("ingest: witness generation %d of partition %d: %w", generation, partition, err)
		}
	}
	return fmt.Errorf("ingest: witness generation %d of partition %d: the key kept changing", generation, partition)
}

// isWrongLastSequence reports a compare-and-set that lost to another writer.
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// syncPrimary brings the store's primary guard and the witness together:
// the guard learns the newest timeline any ingest recorded, and the
// witness the one this ingest's database writes on, if newer. It fails
// with fence.ErrSupersededPrimary on an old primary.
func (w *witness) syncPrimary(ctx context.Context, store *fence.Store) error {
	g := store.Primary()
	if w == nil || g == nil {
		return nil
	}
	have, _, err := w.readTimeline(ctx)
	if err != nil {
		return err
	}
	g.Raise(have)
	if _, err := store.Timeline(ctx); err != nil {
		return err
	}
	// The guard learns a timeline from its first connections, before the
	// witness is opened: record it too.
	if g.Newest() > have {
		newest, err := w.recordTimeline(ctx, g.Newest())
		g.Raise(newest)
		return err
	}
	return nil
}

// recordTimeline records timeline as the newest the ledger writes on,
// unless a newer one is recorded, and returns the newest recorded. The
// store's primary guard calls it before it takes a server on a newer
// timeline for the primary (fence.PrimaryGuard.SetWitness), so that no
// ingest starting against an old primary can take that one for the
// newest once anything was written on the new one.
func (w *witness) recordTimeline(ctx context.Context, timeline int64) (int64, error) {
	for range 16 {
		have, rev, err := w.readTimeline(ctx)
		if err != nil {
			return 0, err
		}
		if have >= timeline {
			return have, nil
		}
		val := []byte(strconv.FormatInt(timeline, 10))
		if rev == 0 {
			_, err = w.kv.Create(ctx, streams.TimelineKey, val)
		} else {
			_, err = w.kv.Update(ctx, streams.TimelineKey, val, rev)
		}
		if err == nil {
			return timeline, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLastSequence(err) {
			return 0, fmt.Errorf("ingest: witness timeline %d: %w", timeline, err)
		}
	}
	return 0, errors.New("ingest: witness the timeline: the key kept changing")
}

// readTimeline reads the newest timeline recorded (0: none) and its
// revision.
func (w *witness) readTimeline(ctx context.Context) (int64, uint64, error) {
	tl, rev, err := streams.WitnessedTimeline(ctx, w.kv)
	if err != nil {
		return 0, 0, fmt.Errorf("ingest: %w", err)
	}
	return tl, rev, nil
}
