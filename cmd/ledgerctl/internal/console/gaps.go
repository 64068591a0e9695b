package console

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// The projector keeps a marker in the bucket ledger_projector for every
// task that waits for a missing version: key <consumer>.<task>, value the
// time the wait began (wire.FormatTime). The console watches the bucket.

// gapMarker is one open gap.
type gapMarker struct {
	consumer, task string
	since          time.Time
}

type gapState struct {
	open map[string]gapMarker
	// known is set once the bucket's current values were read.
	known   bool
	problem string
}

// retryWait is how long a watch that failed waits before it starts again.
const retryWait = 2 * time.Second

// followGaps watches the open-gap markers until ctx ends.
func (h *hub) followGaps(ctx context.Context) {
	for ctx.Err() == nil {
		err := h.watchGaps(ctx)
		if ctx.Err() != nil {
			return
		}
		msg := h.problem("watch "+wire.BucketProjector, "open gaps are unknown: the bucket "+wire.BucketProjector+
			" could not be read (is a projector running? the console's log says why)", err)
		h.mu.Lock()
		h.gaps.problem, h.gaps.known = msg, false
		h.mu.Unlock()
		sleep(ctx, retryWait)
	}
}

func (h *hub) watchGaps(ctx context.Context) error {
	kv, err := h.deps.JS.KeyValue(ctx, wire.BucketProjector)
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", wire.BucketProjector, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", wire.BucketProjector, err)
	}
	defer w.Stop() //nolint:errcheck
	h.mu.Lock()
	clear(h.gaps.open)
	h.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the watch of " + wire.BucketProjector + " ended")
			}
			h.mu.Lock()
			switch {
			case e == nil: // the current values are all in
				h.gaps.known, h.gaps.problem = true, ""
			case e.Operation() != jetstream.KeyValuePut:
				delete(h.gaps.open, e.Key())
			default:
				if g, err := parseGapMarker(e.Key(), e.Value()); err == nil {
					h.gaps.open[e.Key()] = g
				} else {
					delete(h.gaps.open, e.Key())
				}
			}
			h.mu.Unlock()
		}
	}
}

// parseGapMarker reads one marker of the bucket ledger_projector.
func parseGapMarker(key string, value []byte) (gapMarker, error) {
	consumer, task, ok := strings.Cut(key, ".")
	if !ok || consumer == "" || !wire.ValidID(task) {
		return gapMarker{}, fmt.Errorf("key %q is not <consumer>.<task>", key)
	}
	since, err := time.Parse(time.RFC3339Nano, string(value))
	if err != nil {
		return gapMarker{}, fmt.Errorf("marker %q: %w", key, err)
	}
	return gapMarker{consumer: consumer, task: task, since: since}, nil
}

func (h *hub) gapView() gapView {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := gapView{Open: len(h.gaps.open), Known: h.gaps.known, OldestMS: -1}
	var oldest *gapMarker
	for _, g := range h.gaps.open {
		if oldest == nil || g.since.Before(oldest.since) {
			oldest = &g
		}
	}
	if oldest != nil {
		v.OldestTask, v.OldestConsumer = oldest.task, oldest.consumer
		v.OldestMS = max(time.Since(oldest.since).Milliseconds(), 0)
	}
	return v
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
