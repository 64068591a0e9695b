package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// AcquireWait is Acquire for a standby: it returns partition's lease as
// soon as it can be had, or ctx's error. While another holder has a valid
// lease it waits until that lease's expiry (from the held reply, by the
// local clock) plus 5 to 30 ms of jitter, so standbys of one
// partition do not all ask at the same instant, and asks again; between
// tries it polls <prefix>.lease.get every Config.StandbyPoll, so a lease
// that ends early (Release, as on SIGTERM) is taken over within a poll, and
// a local clock behind the database's costs at most a poll. A service that
// does not answer is asked again every StandbyPoll, with the same
// request_id while the outcome of the request is unknown, so a grant that
// was made but not answered is the one returned.
//
// It fails at once, as Acquire does, with ErrLeaseActive, ErrInvalid or
// ErrClosed. A primary/standby worker calls it in a loop: work while the
// lease's context lasts, then call it again.
func (c *Client) AcquireWait(ctx context.Context, partition int) (*Lease, error) {
	req := &acquireRequest{id: newULID()}
	var seen *ServiceError
	for {
		l, err := c.acquireAs(ctx, partition, req)
		var se *ServiceError
		switch {
		case err == nil:
			return l, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("worker: wait for partition %d: %w", partition, ctx.Err())
		case errors.As(err, &se) && errors.Is(err, ErrHeld):
			// The service served the request and granted nothing: the
			// next try is a new request.
			req = &acquireRequest{id: newULID()}
			if seen == nil || seen.Holder != se.Holder || seen.Generation != se.Generation {
				c.log.Info("partition held; standing by until the lease ends", slog.Int("partition", partition),
					slog.String("holder", se.Holder), slog.Int64("generation", se.Generation),
					slog.String("expires_at", wire.FormatTime(se.ExpiresAt)))
				seen = se
			}
			err = c.standBy(ctx, partition, se.ExpiresAt)
		case errors.Is(err, ErrUnavailable):
			c.log.Warn("lease service unavailable; standing by", slog.Int("partition", partition),
				slog.String("error", err.Error()))
			err = sleepCtx(ctx, c.cfg.StandbyPoll)
		case errors.Is(err, ErrLeaseLost): // granted too late to keep
			req = &acquireRequest{id: newULID()}
			err = nil
		default:
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("worker: wait for partition %d: %w", partition, err)
		}
	}
}

// standBy waits until the held lease expiring at expiresAt (zero if the
// service did not say) ends: until its expiry plus jitter, or until a poll
// of lease.get finds it invalid or gone. It returns nil when the next
// acquire is worth trying, or ctx's error.
func (c *Client) standBy(ctx context.Context, partition int, expiresAt time.Time) error {
	for {
		wait, poll := c.cfg.StandbyPoll, true
		if !expiresAt.IsZero() {
			if until := time.Until(expiresAt) + jitter(); until < wait {
				wait, poll = max(until, 0), false
			}
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return err
		}
		if !poll {
			return nil
		}
		var r wire.LeaseReply
		err := c.request(ctx, c.subj.LeaseGet(), wire.LeaseRequest{Partition: &partition}, &r)
		switch {
		case errors.Is(err, ErrNoLease):
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			// Polling is only a shortcut; the expiry still counts.
			c.log.Debug("lease poll failed", slog.Int("partition", partition), slog.String("error", err.Error()))
			continue
		case r.Valid == nil || !*r.Valid:
			return nil
		}
		if t, err := time.Parse(time.RFC3339Nano, r.ExpiresAt); err == nil {
			expiresAt = t
		}
	}
}

// jitter is 5 to 30 ms, added to a wait for an expiry: the database
// judges expiry by its own clock, and standbys of one partition should not
// all ask at the same instant.
func jitter() time.Duration {
	return 5*time.Millisecond + rand.N(25*time.Millisecond)
}
