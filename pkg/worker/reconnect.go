package worker

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// After a reconnect to NATS the client publishes again every event that
// JetStream acknowledged and that has no receipt yet. A server that
// restarted after a power loss or an OS crash may have lost them with its
// unsynced tail; a lost event before a kept one makes the kept one wait
// for a gap verdict. The verdict lookups would notice each lost event
// after its receipt timeout, but they cost one lease-service request an
// event, and with thousands waiting the service refuses most as busy.
//
// The copies keep each event's id and content under a new Nats-Msg-Id
// token ("-r<reconnects>"), in version order. The ledger answers duplicate
// for those it has, which settles them as committed (Client.settle), as a
// lookup would. An event whose lease ended is sent all the same: its own
// generation makes the copy stale, as publishAgain explains.

// watchReconnects re-sends the acknowledged events after each reconnect,
// until Close.
func (c *Client) watchReconnects() {
	defer c.wg.Done()
	connected := c.nc.StatusChanged(nats.CONNECTED)
	defer c.nc.RemoveStatusListener(connected)
	for {
		select {
		case <-c.closedCh:
			return
		case <-connected:
			c.resendAcked()
		}
	}
}

// resendAcked publishes again the events acknowledged and not yet given
// their receipt.
func (c *Client) resendAcked() {
	c.mu.Lock()
	var acked []*Pending
	for id, p := range c.pending {
		if _, waiting := c.acking[id]; !waiting && p.in.ID != "" {
			acked = append(acked, p)
		}
	}
	c.mu.Unlock()
	if len(acked) == 0 {
		return
	}
	slices.SortFunc(acked, func(a, b *Pending) int { return cmp.Compare(a.version, b.version) })
	suffix := "r" + strconv.FormatUint(c.nc.Stats().Reconnects, 10)
	sent := 0
	for _, p := range acked {
		if p.done.isClosed() {
			continue
		}
		p.resent.Store(true)
		if !c.resendOne(copyMsg(p.message(), suffix)) {
			break
		}
		sent++
	}
	c.log.Info("reconnected to NATS; published again the events acknowledged before without a receipt",
		slog.Int("events", sent), slog.Int("of", len(acked)))
}

// resendOne publishes m, retrying while JetStream is not back yet; false
// once the client closes or the connection is lost again (the next
// reconnect sends what is left).
func (c *Client) resendOne(m *nats.Msg) bool {
	delay := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.PublishAckTimeout)
		_, err := c.js.PublishMsg(ctx, m)
		cancel()
		if err == nil {
			return true
		}
		if c.ctx.Err() != nil || !c.nc.IsConnected() {
			return false
		}
		c.log.Debug("publishing an event again after the reconnect failed; retrying", slog.String("error", err.Error()))
		select {
		case <-c.closedCh:
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}
