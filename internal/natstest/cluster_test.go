package natstest_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/natstest"
)

// publisher publishes msg-0001, msg-0002, ... with a Nats-Msg-Id equal to
// the payload, retrying each message until it is acked, so that a message is
// never skipped and (thanks to deduplication) never stored twice.
type publisher struct {
	js      jetstream.JetStream
	subject string

	mu    sync.Mutex
	acked []string
	errs  int
	last  error
}

func (p *publisher) ackedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

func (p *publisher) run(ctx context.Context) {
	for i := 1; ; i++ {
		id := fmt.Sprintf("msg-%04d", i)
		for {
			if ctx.Err() != nil {
				return
			}
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := p.js.Publish(pctx, p.subject, []byte(id), jetstream.WithMsgID(id))
			cancel()
			if err == nil {
				p.mu.Lock()
				p.acked = append(p.acked, id)
				p.mu.Unlock()
				break
			}
			p.mu.Lock()
			p.errs++
			p.last = err
			p.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitAcked waits until the publisher has at least n acks.
func (p *publisher) waitAcked(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for p.ackedCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("publisher stuck at %d acks after %s (want %d); last error: %v", p.ackedCount(), within, n, p.lastErr())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *publisher) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)

	require.Len(t, c.Servers, 3)
	require.NotEqual(t, -1, c.MetaLeader())
	names := map[string]bool{}
	for _, s := range c.Servers {
		require.True(t, s.JetStreamIsClustered())
		require.Equal(t, c.Name(), s.ClusterName())
		require.GreaterOrEqual(t, s.NumRoutes(), 2, "routes to both peers")
		names[s.Name()] = true
	}
	require.Len(t, names, 3, "distinct server names")
	for _, u := range strings.Split(c.URLs(), ",") {
		pu, err := url.Parse(u)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", pu.Hostname())
		require.NotEqual(t, "4222", pu.Port())
	}
}

// testNodeFailure publishes to an R3 stream while node victim(c) is stopped
// with stop (Shutdown or Kill), then checks that every acked message is
// stored exactly once, reading through a new connection to the surviving
// nodes only. Finally the node is restarted and must catch up.
func testNodeFailure(t *testing.T, stream string, victim func(c *natstest.Cluster) int, stop func(c *natstest.Cluster, i int)) {
	c := natstest.StartCluster(t, 3)
	js := c.JetStream(t)
	createStream(t, js, stream, 3)
	c.WaitStreamCurrent(t, stream)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &publisher{js: js, subject: strings.ToLower(stream) + ".posted"}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx)
	}()

	p.waitAcked(t, 20, 10*time.Second)
	down := victim(c)
	require.NotEqual(t, -1, down)
	beforeFailure := p.ackedCount()
	stopped := time.Now()
	stop(c, down)
	require.False(t, c.Servers[down].Running())
	p.waitAcked(t, beforeFailure+1, 20*time.Second)
	t.Logf("first ack %s after stopping n%d", time.Since(stopped).Round(time.Millisecond), down+1)

	// The stream must keep accepting writes with one node gone (after a
	// new election if the leader went down).
	p.waitAcked(t, beforeFailure+20, 20*time.Second)
	cancel()
	<-done
	leader := c.StreamLeader(stream)
	require.NotEqual(t, -1, leader)
	require.NotEqual(t, down, leader)
	acked := p.ackedCount()
	t.Logf("acked %d messages (%d before stopping n%d), %d failed publish attempts", acked, beforeFailure, down+1, p.errs)

	// Read back through the surviving nodes only.
	nc := c.ConnTo(t, c.URLsExcept(down), nats.IgnoreDiscoveredServers())
	rjs, err := jetstream.New(nc)
	require.NoError(t, err)
	var st jetstream.Stream
	for deadline := time.Now().Add(10 * time.Second); ; {
		ictx, icancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err = rjs.Stream(ictx, stream)
		icancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream info via the surviving nodes: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := readAll(t, st)

	p.mu.Lock()
	want := append([]string(nil), p.acked...)
	p.mu.Unlock()
	// Messages whose ack was lost may be stored but not counted as acked;
	// every acked one must be there, in order, exactly once.
	require.GreaterOrEqual(t, len(got), len(want))
	seen := map[string]int{}
	for _, m := range got {
		seen[m]++
	}
	for _, id := range want {
		require.Equal(t, 1, seen[id], "acked message %s stored %d times", id, seen[id])
	}
	require.Equal(t, want, got[:len(want)], "acked messages in publish order")

	// The failed node comes back and catches up.
	restarted := time.Now()
	defer func() { t.Logf("restart and catch-up took %s", time.Since(restarted).Round(time.Millisecond)) }()
	c.Restart(t, down)
	require.True(t, c.Servers[down].Running())
	c.WaitStreamCurrent(t, stream)
	require.Eventually(t, func() bool {
		jsz, err := c.Servers[down].Jsz(nil)
		return err == nil && jsz.Messages == uint64(len(got))
	}, 10*time.Second, 25*time.Millisecond, "restarted node did not catch up")
}

func followerOf(stream string) func(c *natstest.Cluster) int {
	return func(c *natstest.Cluster) int {
		leader := c.StreamLeader(stream)
		if leader == -1 {
			return -1
		}
		return (leader + 1) % len(c.Servers)
	}
}

func leaderOf(stream string) func(c *natstest.Cluster) int {
	return func(c *natstest.Cluster) int { return c.StreamLeader(stream) }
}

func shutdown(c *natstest.Cluster, i int) { c.Shutdown(i) }
func kill(c *natstest.Cluster, i int)     { c.Kill(i) }

func TestClusterFollowerShutdown(t *testing.T) {
	t.Parallel()
	testNodeFailure(t, "FOLLOWER", followerOf("FOLLOWER"), shutdown)
}

func TestClusterStreamLeaderShutdown(t *testing.T) {
	t.Parallel()
	testNodeFailure(t, "LEADER", leaderOf("LEADER"), shutdown)
}

// A crashed stream leader: no hand-over, the survivors must elect a new
// leader on their own (this takes the raft election timeout, 4-9s).
func TestClusterStreamLeaderKill(t *testing.T) {
	t.Parallel()
	start := time.Now()
	testNodeFailure(t, "CRASH", leaderOf("CRASH"), kill)
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}
