package fencecheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// FollowConfig configures FollowLeases.
type FollowConfig struct {
	// Store receives the raised marks. Required.
	Store Store
	// Resources are the resources whose marks follow every partition's
	// lease. Required.
	Resources []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// FollowLeases raises the store's high-water marks from the ledger's leases
// view (the KV bucket ledger_leases, kv) as soon as a partition's lease is
// granted to a new generation, so a superseded holder is refused even
// before its successor's first call. It is an optimisation, never the
// guarantee: the view lags the database and may miss a change, so the
// check on every write stays. It runs until ctx ends or the watch fails,
// and returns the reason (ctx.Err() when ctx ended).
func FollowLeases(ctx context.Context, kv jetstream.KeyValue, cfg FollowConfig) error {
	if cfg.Store == nil || len(cfg.Resources) == 0 || kv == nil {
		return errors.New("fencecheck: FollowLeases needs a bucket, a store and resources")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("fencecheck: watch %s: %w", wire.BucketLeases, err)
	}
	defer w.Stop() //nolint:errcheck // the watch ends with ctx anyway
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("fencecheck: watch of %s ended", wire.BucketLeases)
			}
			if e == nil { // the initial values are all delivered
				continue
			}
			var v wire.LeaseView
			if err := json.Unmarshal(e.Value(), &v); err != nil || !v.Fence().Valid() {
				cfg.Logger.Warn("fencecheck: leases view value skipped", slog.String("key", e.Key()))
				continue
			}
			for _, r := range cfg.Resources {
				if err := raise(ctx, cfg.Store, r, v.Fence()); err != nil {
					cfg.Logger.Warn("fencecheck: mark not raised from the leases view", slog.String("resource", r),
						slog.String("fence", v.Fence().String()), slog.String("error", err.Error()))
				}
			}
		}
	}
}

// raise records f as seen for resource unless a higher generation was: an
// admission with nothing written in it.
func raise(ctx context.Context, s Store, resource string, f wire.Fence) error {
	_, finish, err := s.Admit(ctx, resource, f)
	var refused *RefusedError
	switch {
	case errors.As(err, &refused):
		return nil // the mark is already at or past f
	case err != nil:
		return err
	}
	return finish(true)
}
