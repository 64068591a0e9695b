package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/streams"
)

// partRun is a partition this ingest decides: its claim and its consumer
// on each inbox stream (inboxes.go), each delivering its events, in that
// stream's order, to this process alone.
type partRun struct {
	claim     fence.Claim
	consumers map[string]jetstream.ConsumeContext // by inbox stream; under claims.mu
}

// stopAll stops every consumer of the run.
func (r *partRun) stopAll(mu *sync.Mutex) {
	mu.Lock()
	ccs := make([]jetstream.ConsumeContext, 0, len(r.consumers))
	for _, cc := range r.consumers {
		ccs = append(ccs, cc)
	}
	mu.Unlock()
	for _, cc := range ccs {
		cc.Stop()
	}
}

// claims is this process's share of the partitions. Every ClaimTTL/3 it
// beats: it renews its claims, drops those another ingest took over, and
// takes or hands over partitions until it holds its share, ceil(N / live
// ingests). Only the beat changes which partitions run; lanes read them.
type claims struct {
	owner string
	mu    sync.Mutex
	runs  map[int]*partRun
	// beatMu serialises beats: the periodic one and one a lane asks for
	// when an append finds a claim gone.
	beatMu sync.Mutex
	// stopped, under beatMu, is set by Stop: no beat runs after it.
	stopped  bool
	lastBeat time.Time // of the last heartbeat that reached the database
	failing  bool      // the last beat failed (logged once per streak)
	// superseded: the database was found a superseded primary (logged
	// once until it is not).
	superseded bool
}

// ownerID names this ingest process in ledger.ingest_claims: host, pid and
// a random part, so a restarted process is never mistaken for its former
// self.
func ownerID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r == '.' || r == ' ' {
			return '-'
		}
		return r
	}, host)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), ulid.Make().String()[20:])
}

// epochs returns the claims a batch of these partitions is appended under,
// and the partitions of the list this process no longer decides.
func (c *claims) epochs(partitions []int) (*fence.Claims, []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &fence.Claims{Owner: c.owner, Epochs: make(map[int]int64, len(partitions))}
	var lost []int
	for _, p := range partitions {
		if r, ok := c.runs[p]; ok {
			out.Epochs[p] = r.claim.Epoch
		} else if !slices.Contains(lost, p) {
			lost = append(lost, p)
		}
	}
	return out, lost
}

// owns reports whether this process decides partition p now.
func (c *claims) owns(p int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.runs[p]
	return ok
}

// owned lists the partitions this process decides, in order.
func (c *claims) owned() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int, 0, len(c.runs))
	for p := range c.runs {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// runClaims beats until the service stops.
func (s *Service) runClaims() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ClaimTTL / 3)
	defer t.Stop()
	for {
		s.beat()
		select {
		case <-s.stopping:
			return
		case <-t.C:
		}
	}
}

// beat renews this process's claims and moves it towards its share.
func (s *Service) beat() {
	c := s.claims
	c.beatMu.Lock()
	defer c.beatMu.Unlock()
	if c.stopped {
		return
	}
	ctx, cancel := context.WithTimeout(s.workCtx, s.cfg.ClaimTTL/3)
	defer cancel()
	// Taking or giving up a partition waits for its batches and its
	// consumer; it gets a deadline of its own.
	slow, cancelSlow := context.WithTimeout(s.workCtx, max(s.cfg.ClaimTTL, 10*time.Second))
	defer cancelSlow()
	if err := s.witness.syncPrimary(ctx, s.store); errors.Is(err, fence.ErrSupersededPrimary) && !c.superseded {
		s.log.Error("the database is not the newest primary the ledger wrote to; committing nothing on it", slog.String("error", err.Error()))
		c.superseded = true
	} else if !errors.Is(err, fence.ErrSupersededPrimary) && c.superseded {
		s.log.Info("the database is the newest primary again")
		c.superseded = false
	}
	// An ingest cut off from NATS cannot serve its partitions: it stops
	// renewing, and another ingest takes them over once the claims expire.
	connected := s.nc.IsConnected()
	v, err := s.store.IngestHeartbeat(ctx, c.owner, s.cfg.ClaimTTL, connected, c.owned())
	if err != nil {
		if !c.failing && s.workCtx.Err() == nil {
			s.log.Warn("ingest heartbeat failed; the partitions keep running until another ingest takes them over",
				slog.String("error", err.Error()))
		}
		c.failing = true
		return
	}
	if c.failing {
		s.log.Info("ingest heartbeat works again")
	}
	c.failing = false
	if connected {
		c.mu.Lock()
		c.lastBeat = time.Now()
		c.mu.Unlock()
	}
	for _, p := range c.owned() {
		cl := v.Claims[p]
		c.mu.Lock()
		r := c.runs[p]
		c.mu.Unlock()
		if r != nil && (cl.Owner != c.owner || cl.Epoch != r.claim.Epoch) {
			s.log.Warn("partition taken over by another ingest; no longer deciding it", slog.Int("partition", p),
				slog.String("by", cl.Owner), slog.Int64("epoch", cl.Epoch))
			s.stopPartition(p, false)
		}
	}
	if !connected {
		return
	}
	s.syncInboxes(slow)
	s.reviveConsumers(slow)
	n := s.store.Partitions()
	share := (n + max(v.Members, 1) - 1) / max(v.Members, 1)
	mine := c.owned()
	for len(mine) > share {
		// The ingest that joined takes them on its next beat.
		s.handOver(slow, mine[len(mine)-1])
		mine = mine[:len(mine)-1]
	}
	start := int(fnv32(c.owner) % uint32(n))
	for k := 0; k < n && len(mine) < share; k++ {
		p := (start + k) % n
		if cl, ok := v.Claims[p]; (ok && cl.Valid && cl.Owner != c.owner) || c.owns(p) {
			continue
		}
		if s.claim(slow, p) {
			mine = append(mine, p)
		}
	}
}

// claim takes partition p and starts its consumer; false if another ingest
// got it first or the consumer could not be started.
func (s *Service) claim(ctx context.Context, p int) bool {
	cl, ok, err := s.store.ClaimPartition(ctx, p, s.claims.owner, s.cfg.ClaimTTL)
	if err != nil {
		s.log.Warn("claiming a partition failed", slog.Int("partition", p), slog.String("error", err.Error()))
		return false
	}
	if !ok {
		return false
	}
	if err := s.startRun(ctx, cl); err != nil {
		s.log.Warn("starting a partition's consumer failed; releasing its claim", slog.Int("partition", p),
			slog.String("error", err.Error()))
		_ = s.store.ReleaseClaim(context.WithoutCancel(ctx), cl)
		return false
	}
	s.metrics.claims.Set(float64(len(s.claims.owned())))
	s.log.Info("deciding partition", slog.Int("partition", p), slog.Int64("epoch", cl.Epoch))
	return true
}

// startRun makes partition cl's consumers and records the run. The
// partition is this process's before its consumers start: their first
// messages can reach a lane while the next consumer is being made, and a
// lane hands back what it does not own. On an error nothing is left
// running and the partition is not this process's.
func (s *Service) startRun(ctx context.Context, cl fence.Claim) error {
	r := &partRun{claim: cl, consumers: map[string]jetstream.ConsumeContext{}}
	s.claims.mu.Lock()
	s.claims.runs[cl.Partition] = r
	s.claims.mu.Unlock()
	consumers, err := s.consumePartition(ctx, cl)
	s.claims.mu.Lock()
	defer s.claims.mu.Unlock()
	if err != nil {
		delete(s.claims.runs, cl.Partition)
		return err
	}
	r.consumers = consumers
	return nil
}

// consumerName is the durable consumer of partition p under claim epoch e.
// A new claim gets a consumer of its own, so a former owner that wakes up
// finds nothing to pull.
func consumerName(p int, epoch int64) string { return fmt.Sprintf("ingest-%d-%d", p, epoch) }

// consumePartition gives the partition a consumer on every inbox stream
// (consumeInbox); on a failure the ones started are stopped.
func (s *Service) consumePartition(ctx context.Context, cl fence.Claim) (map[string]jetstream.ConsumeContext, error) {
	out := map[string]jetstream.ConsumeContext{}
	for _, stream := range s.inboxes.names() {
		cc, err := s.consumeInbox(ctx, cl, stream)
		if err != nil {
			for _, cc := range out {
				cc.Stop()
			}
			return nil, err
		}
		out[stream] = cc
	}
	return out, nil
}

// consumeInbox replaces the partition's consumers on the inbox stream with
// new ones that start at the oldest message still in the stream (acked
// ones are gone: it is a work queue), so the new owner sees the partition's
// events in stream order, those a former owner held unacked first. Single
// events and batches have a consumer each (inboxForms), and the two reach
// the partition's lane side by side.
func (s *Service) consumeInbox(ctx context.Context, cl fence.Claim, stream string) (jetstream.ConsumeContext, error) {
	st := s.inboxes.stream(stream)
	if st == nil {
		return nil, fmt.Errorf("no inbox stream %s", stream)
	}
	forms := s.inboxForms(stream, cl)
	prefix := fmt.Sprintf("ingest-%d-", cl.Partition)
	names := st.ConsumerNames(ctx)
	var stale []string
	for n := range names.Name() {
		current := slices.ContainsFunc(forms, func(f inboxForm) bool { return f.name == n })
		if !current && (n == "ingest" || strings.HasPrefix(n, prefix)) {
			stale = append(stale, n)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list consumers of %s: %w", stream, err)
	}
	for _, n := range stale {
		if err := s.js.DeleteConsumer(ctx, stream, n); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("delete consumer %s of %s: %w", n, stream, err)
		}
	}
	var both consumePair
	for i, f := range forms {
		cc, err := s.consumeForm(ctx, cl, stream, f)
		if err != nil {
			both.Stop()
			return nil, err
		}
		both[i] = cc
	}
	return both, nil
}

// consumeForm makes partition cl's consumer of one form on the inbox
// stream and consumes it.
func (s *Service) consumeForm(ctx context.Context, cl fence.Claim, stream string, f inboxForm) (jetstream.ConsumeContext, error) {
	ccfg, err := streams.Consumer("ingest", streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas})
	if err != nil {
		return nil, err
	}
	ccfg.Durable, ccfg.Name = f.name, f.name
	ccfg.FilterSubject, ccfg.FilterSubjects = f.filter, nil
	ccfg.AckWait = s.cfg.AckWait
	cons, err := s.js.CreateOrUpdateConsumer(ctx, stream, ccfg)
	if err != nil && (strings.Contains(err.Error(), "storage type can not be updated") ||
		strings.Contains(err.Error(), "filter")) {
		// A consumer of this name made by an older ingest (state on disk,
		// or both forms in one): it is this claim's, so it is made anew.
		if err = s.js.DeleteConsumer(ctx, stream, f.name); err == nil || errors.Is(err, jetstream.ErrConsumerNotFound) {
			cons, err = s.js.CreateOrUpdateConsumer(ctx, stream, ccfg)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create consumer %s of %s: %w", f.name, stream, err)
	}
	p := cl.Partition
	return cons.Consume(func(m jetstream.Msg) { s.route(m, p) },
		jetstream.PullMaxMessagesWithBytesLimit(min(2*s.cfg.BatchSize, 2000), 16<<20),
		// A pull that expires every 5 s (heartbeats every 2.5 s) is found
		// dead within about 5 s when its consumer's leader moves.
		jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			s.consumeErr(consumerKey{partition: p, stream: stream, epoch: cl.Epoch}, err)
		}))
}

// consumePair is a partition's two consumers on one inbox, stopped and
// drained together.
type consumePair [2]jetstream.ConsumeContext

func (c consumePair) Stop() {
	for _, cc := range c {
		if cc != nil {
			cc.Stop()
		}
	}
}

func (c consumePair) Drain() {
	for _, cc := range c {
		if cc != nil {
			cc.Drain()
		}
	}
}

// Closed is closed once both consumers are.
func (c consumePair) Closed() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, cc := range c {
			if cc != nil {
				<-cc.Closed()
			}
		}
	}()
	return done
}

// stopPartition stops deciding p: its consumer stops, and what this process
// held of it is handed back (the next owner's consumer delivers it again).
// With drain, the batches of p already in a lane finish first, for up to
// StopTimeout.
func (s *Service) stopPartition(p int, drain bool) {
	s.claims.mu.Lock()
	r := s.claims.runs[p]
	delete(s.claims.runs, p)
	n := len(s.claims.runs)
	s.claims.mu.Unlock()
	s.metrics.claims.Set(float64(n))
	if r == nil {
		return
	}
	r.stopAll(&s.claims.mu)
	if drain {
		deadline := time.Now().Add(s.cfg.StopTimeout)
		for s.held.count(p) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, in := range s.held.snapshot() {
		if in.part == p && s.held.release(in) {
			_ = in.msg.Nak()
		}
	}
}

// handOver gives p up for another ingest: its batches in hand finish, then
// the claim ends at once.
func (s *Service) handOver(ctx context.Context, p int) {
	s.claims.mu.Lock()
	r := s.claims.runs[p]
	s.claims.mu.Unlock()
	if r == nil {
		return
	}
	s.stopPartition(p, true)
	if err := s.store.ReleaseClaim(ctx, r.claim); err != nil {
		s.log.Warn("releasing a claim failed; it expires on its own", slog.Int("partition", p), slog.String("error", err.Error()))
		return
	}
	s.log.Info("handed a partition over", slog.Int("partition", p), slog.Int64("epoch", r.claim.Epoch))
}

// leave stops every partition and ends this process's claims, so that the
// other ingests take them over at once.
func (s *Service) leave() {
	for _, p := range s.claims.owned() {
		s.stopPartition(p, false)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.store.LeaveIngests(ctx, s.claims.owner); err != nil {
		s.log.Warn("ending this ingest's claims failed; they expire on their own", slog.String("error", err.Error()))
	}
}

// claimsBeaten reports an error unless a heartbeat reached the database
// within the claim TTL: a readiness check.
func (s *Service) claimsBeaten() error {
	s.claims.mu.Lock()
	last := s.claims.lastBeat
	s.claims.mu.Unlock()
	if last.IsZero() || time.Since(last) > s.cfg.ClaimTTL {
		return fmt.Errorf("no ingest heartbeat reached the database in the last %v", s.cfg.ClaimTTL)
	}
	return nil
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}
