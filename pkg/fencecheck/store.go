package fencecheck

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/pkg/wire"
)

// Store keeps the highest generation seen per (resource, partition) and
// admits a fence against it. Admit returns, for an admitted fence, the
// context the guarded work runs in and a finish function: finish(true)
// makes the admission (and the work, for a store that shares its
// transaction) durable, finish(false) undoes both. Until finish, other
// admissions of the same resource and partition wait. A refused fence is a
// *RefusedError. MemoryStore and PostgresStore implement it, and one
// conformance suite tests both.
type Store interface {
	Admit(ctx context.Context, resource string, f wire.Fence) (context.Context, func(commit bool) error, error)
}

// MemoryStore is a Store in one process's memory: for a service without a
// database, or with one that cannot hold the check. What it has seen is
// lost when the process ends, and processes do not share it. The zero value
// is ready to use.
type MemoryStore struct {
	mu   sync.Mutex
	keys map[memKey]*memEntry
}

type memKey struct {
	resource  string
	partition int
}

// memEntry is one key's high-water mark; lock is a semaphore held from
// Admit to finish.
type memEntry struct {
	lock       chan struct{}
	generation int64
	holder     string
}

func (s *MemoryStore) entry(k memKey) *memEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[memKey]*memEntry{}
	}
	e := s.keys[k]
	if e == nil {
		e = &memEntry{lock: make(chan struct{}, 1)}
		s.keys[k] = e
	}
	return e
}

// Admit checks f as ledger_fence.admit does, holding the key until finish.
func (s *MemoryStore) Admit(ctx context.Context, resource string, f wire.Fence) (context.Context, func(bool) error, error) {
	if !f.Valid() {
		return nil, nil, &RefusedError{Resource: resource, Fence: f, Reason: ErrMalformed, Detail: fmt.Sprintf("fence %s", f)}
	}
	e := s.entry(memKey{resource, f.Partition})
	select {
	case e.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("fencecheck: wait for %q partition %d: %w", resource, f.Partition, ctx.Err())
	}
	if err := check(resource, f, e.generation, e.holder); err != nil {
		<-e.lock
		return nil, nil, err
	}
	var once sync.Once
	finish := func(commit bool) error {
		once.Do(func() {
			if commit && f.Generation > e.generation {
				e.generation, e.holder = f.Generation, f.Holder
			}
			<-e.lock
		})
		return nil
	}
	return ctx, finish, nil
}

// check is the rule of ledger_fence.admit, for a store that keeps the
// high-water mark itself (generation 0: none seen).
func check(resource string, f wire.Fence, generation int64, holder string) error {
	switch {
	case f.Generation < generation:
		return &RefusedError{Resource: resource, Fence: f, Highest: generation, Reason: ErrSuperseded,
			Detail: fmt.Sprintf("generation %d of %s on partition %d is superseded for %q: generation %d (holder %s) was seen",
				f.Generation, f.Holder, f.Partition, resource, generation, holder)}
	case f.Generation == generation && f.Holder != holder:
		return &RefusedError{Resource: resource, Fence: f, Reason: ErrHolderMismatch,
			Detail: fmt.Sprintf("generation %d on partition %d belongs to %s, not %s", generation, f.Partition, holder, f.Holder)}
	}
	return nil
}

// PostgresStore is a Store on a PostgreSQL database to which fencecheck.sql
// was applied (Apply). Admit begins a transaction, admits the fence in it
// and hands it to the guarded work through the context (Tx), so the check
// and the work commit together.
type PostgresStore struct {
	// Pool is the downstream database.
	Pool *pgxpool.Pool
}

type txKey struct{}

// Tx returns the transaction a PostgresStore admitted the request's fence
// in, for the handler to write in; ok is false outside such a request.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Admit begins a transaction and admits f in it (see the package function
// Admit). finish commits or rolls back that transaction.
func (s PostgresStore) Admit(ctx context.Context, resource string, f wire.Fence) (context.Context, func(bool) error, error) {
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("fencecheck: begin transaction: %w", err)
	}
	if err := Admit(ctx, tx, resource, f); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	finish := func(commit bool) error {
		if !commit {
			return tx.Rollback(context.WithoutCancel(ctx))
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("fencecheck: commit the work of fence %s on %q: %w", f, resource, err)
		}
		return nil
	}
	return context.WithValue(ctx, txKey{}, tx), finish, nil
}
