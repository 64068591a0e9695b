package ingest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// operatorAction is an operator's revoke or cordon as an error reply tells
// it, or nil.
func operatorAction(a *fence.Action) *wire.OperatorAction {
	if a == nil {
		return nil
	}
	return &wire.OperatorAction{By: a.By, Reason: a.Reason, At: wire.FormatTime(a.At)}
}

// Revoke is the operator's revoke of partition (docs/contract.md §12),
// done in PostgreSQL by ledgerctl. The generation it raises the partition
// to is above the ingest's witness (bucket ledger_witness) and witnessed
// before the revoke commits, so no later grant repeats it, also after the
// database forgot the revoke.
func Revoke(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, partition int, by, reason string) (fence.Action, error) {
	kv, err := js.KeyValue(ctx, wire.BucketWitness)
	if err != nil {
		return fence.Action{}, fmt.Errorf("ingest: revoke partition %d: bucket %s (an ingest creates it): %w",
			partition, wire.BucketWitness, err)
	}
	w := &witness{kv: kv, gens: map[int]int64{}}
	floor, err := w.floor(ctx, partition)
	if err != nil {
		return fence.Action{}, err
	}
	return fence.Revoke(ctx, pool, partition, by, reason, floor, func(ctx context.Context, generation int64) error {
		return w.grant(ctx, partition, generation)
	})
}
