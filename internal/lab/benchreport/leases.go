package benchreport

import (
	"context"
	"fmt"
	"time"

	"github.com/flowness/ledger/pkg/fence"
)

// leaseSet is every partition's lease, taken through the fence for a
// holder that publishes or appends without the SDK (which would renew its
// own leases).
type leaseSet struct {
	store  *fence.Store
	holder string
	gens   [partitions]int64
}

// acquireAll takes every partition's lease for holder, for the longest TTL
// the fence grants.
func acquireAll(ctx context.Context, store *fence.Store, holder string) (*leaseSet, error) {
	s := &leaseSet{store: store, holder: holder}
	for p := range partitions {
		l, err := store.Acquire(ctx, p, holder, fence.TTLMax)
		if err != nil {
			s.release()
			return nil, fmt.Errorf("acquire partition %d for %s: %w", p, holder, err)
		}
		s.gens[p] = l.Generation
	}
	return s, nil
}

// renew extends every lease by the longest TTL again: a phase that starts
// after renew has that long before its events turn stale.
func (s *leaseSet) renew(ctx context.Context) error {
	for p, g := range s.gens {
		if _, err := s.store.Renew(ctx, p, s.holder, g, fence.TTLMax); err != nil {
			return fmt.Errorf("renew partition %d for %s: %w", p, s.holder, err)
		}
	}
	return nil
}

// release gives back the leases taken, so that a later run on the same
// database finds them free.
func (s *leaseSet) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for p, g := range s.gens {
		if g != 0 {
			_ = s.store.Release(ctx, p, s.holder, g)
		}
	}
}
