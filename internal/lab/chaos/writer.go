package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of WriterConfig.
const (
	// WriterTTLDefault is the lease TTL a writer asks for: 1 s.
	WriterTTLDefault = time.Second
	// WriterRateDefault is how many events a holding writer publishes per
	// second: 50.
	WriterRateDefault = 50
	// ZombieDefault is how long a writer that finds it was paused keeps
	// publishing with its old generation: 300 ms.
	ZombieDefault = 300 * time.Millisecond
)

// eventTypes are the types writers cycle through, so that a projection's
// status says which version it last applied.
var eventTypes = []string{"created", "running", "progress", "completed"}

// typeOf is the type of a task's version: every 20th is a side effect's
// intent (effectType), the others cycle through eventTypes. One event in
// twenty keeps the effect runner's load near a real service's at the
// default hot-task rate (1,200 events a second).
func typeOf(version int64) string {
	if version%20 == 3 {
		return effectType
	}
	return eventTypes[int(version)%len(eventTypes)]
}

// WriterConfig configures one writer: a process that competes for one
// partition's lease and, while it holds it, publishes the next versions of
// that partition's tasks, logging everything it does and sees.
type WriterConfig struct {
	// Holder is the writer's holder id, <principal>.<instance> (docs/contract.md,
	// Identifiers). Required.
	Holder string
	// Partition is the partition it competes for.
	Partition int
	// Tasks are the tasks it publishes to, in turn. Required.
	Tasks []string
	// Prefix is the subject prefix; default "ledger".
	Prefix string
	// TTL is the lease TTL it asks for; default 1 s. As the Go SDK does
	// (pkg/worker), it renews TTL/3 after the last renewal was sent, retries
	// a failed one after TTL/12 (at least 10 ms), bounds each by its local
	// deadline and by 2 s, and stops trusting a generation TTL − (2% +
	// 25 ms) after the last renewal it had confirmed was sent.
	TTL time.Duration
	// Rate is events per second while it holds the lease; default 50.
	Rate float64
	// Zombie is how long it keeps publishing with its old generation after
	// it notices it was paused for longer than TTL; default 300 ms, and a
	// negative value (Off) turns it off, as the Go SDK would. Such sends,
	// once another writer's grant was acknowledged, must all be refused by
	// the fence.
	Zombie time.Duration
	// Log receives the writer's records, one JSON object per line (see
	// Record). Required.
	Log io.Writer
	// Downstream, if set, is the downstream database the writer performs
	// each intent's effect on directly, with its fence (effects.go).
	Downstream *pgxpool.Pool
	// Resend, when positive, publishes again (same event id) an event
	// JetStream acked that has no receipt this long after its ack: a
	// server that lost its unsynced writes may have lost it, and a receipt
	// sent while the writer was cut off is gone. Default 0: never.
	Resend time.Duration
	// ReceiptTimeout is the SDK writer's worker.Config.ReceiptTimeout: how
	// long an event waits for its receipt before the SDK asks the ledger,
	// and publishes it again if the ledger has no record of it; default
	// SDKReceiptTimeoutDefault (2 s). The raw writer ignores it.
	ReceiptTimeout time.Duration
}

func (c WriterConfig) withDefaults() WriterConfig {
	c.Prefix = cmp.Or(c.Prefix, wire.PrefixDefault)
	c.TTL = cmp.Or(c.TTL, WriterTTLDefault)
	c.Rate = cmp.Or(c.Rate, WriterRateDefault)
	c.Zombie = cmp.Or(c.Zombie, ZombieDefault)
	return c
}

func (c WriterConfig) validate() error {
	switch {
	case !wire.ValidHolder(c.Holder):
		return fmt.Errorf("writer: holder %q is not <principal>.<instance>, each 1..64 of [A-Za-z0-9_-]", c.Holder)
	case c.Partition < 0:
		return fmt.Errorf("writer: partition %d is negative", c.Partition)
	case len(c.Tasks) == 0:
		return errors.New("writer: no tasks")
	case c.TTL < wire.TTLMinMillis*time.Millisecond || c.TTL > wire.TTLMaxMillis*time.Millisecond:
		return fmt.Errorf("writer: ttl %v is outside the contract's bounds", c.TTL)
	case c.Rate <= 0:
		return errors.New("writer: rate must be positive")
	case c.Log == nil:
		return errors.New("writer: no log")
	}
	for _, t := range c.Tasks {
		if !wire.ValidID(t) {
			return fmt.Errorf("writer: task %q is not 1..128 of [A-Za-z0-9_-]", t)
		}
	}
	return nil
}

// writer is one running writer.
type writer struct {
	cfg  WriterConfig
	nc   *nats.Conn
	js   jetstream.JetStream
	subj wire.Subjects
	log  *logWriter
	rng  *rand.Rand

	// lastTick is the wall clock (Unix ns) the pause detector last saw.
	lastTick atomic.Int64

	mu sync.Mutex
	// gen is the generation held, 0 while none; deadline is when it stops
	// being trusted; lost marks it given up.
	gen      int64
	deadline time.Time
	lost     bool
	// zombieGen is published with until zombieUntil, whatever the lease.
	zombieGen   int64
	zombieUntil time.Time
	// unanswered holds the acked events without a receipt, for Resend.
	unanswered map[string]*sent
}

// sent is an acked event waiting for its receipt.
type sent struct {
	msg   *nats.Msg
	task  string
	ver   int64
	gen   int64
	typ   string
	acked time.Time
	tries int
}

// RunWriter runs a writer on nc until ctx ends.
func RunWriter(ctx context.Context, nc *nats.Conn, cfg WriterConfig) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("writer: jetstream: %w", err)
	}
	w := &writer{cfg: cfg, nc: nc, js: js, subj: wire.Subjects{Prefix: cfg.Prefix}, log: newLogWriter(cfg.Log),
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(cfg.Partition))), unanswered: map[string]*sent{}}
	p := cfg.Partition
	w.log.add(Record{Kind: KindStart, Holder: cfg.Holder, Partition: &p, Tasks: cfg.Tasks,
		TTLMillis: cfg.TTL.Milliseconds()})
	bg, stopBG := context.WithCancel(context.Background())
	var bgDone sync.WaitGroup
	defer func() {
		stopBG()
		bgDone.Wait()
		w.log.add(Record{Kind: KindStop})
		_ = w.log.flush()
	}()
	bgDone.Add(3)
	go func() { defer bgDone.Done(); w.flushEvery(bg, 100*time.Millisecond) }()
	go func() { defer bgDone.Done(); w.resendLoop(bg) }()
	w.lastTick.Store(time.Now().UnixNano())
	go func() { defer bgDone.Done(); w.watchPauses(bg) }()

	sub, err := nc.Subscribe(w.subj.Receipt(cfg.Holder), w.onReceipt)
	if err != nil {
		return fmt.Errorf("writer: subscribe to receipts: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	_ = sub.SetPendingLimits(-1, -1)

	for ctx.Err() == nil {
		gen, err := w.acquire(ctx)
		if err != nil {
			break
		}
		rctx, stopRenew := context.WithCancel(ctx)
		renewed := make(chan struct{})
		go func() { defer close(renewed); w.renewLoop(rctx, gen) }()
		w.hold(ctx, gen)
		stopRenew()
		<-renewed
		w.mu.Lock()
		w.gen = 0
		w.mu.Unlock()
	}
	w.awaitUnanswered(sdkStopGrace)
	return nil
}

// awaitUnanswered gives the events acked without a receipt up to grace to
// get one, sent again meanwhile by resendLoop: a writer that keeps every
// event until its verdict waits for them before it exits, as the SDK
// writer does. A storage loss just before the stop took some.
func (w *writer) awaitUnanswered(grace time.Duration) {
	if w.cfg.Resend <= 0 {
		return
	}
	for deadline := time.Now().Add(grace); time.Now().Before(deadline); {
		w.mu.Lock()
		n := len(w.unanswered)
		w.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// safetyMargin is how much before TTL after a confirmed request was sent
// the writer stops trusting it (the Go SDK's margin).
func safetyMargin(ttl time.Duration) time.Duration { return ttl/50 + 25*time.Millisecond }

// renewTimeout bounds a renewal that its local deadline does not bound
// sooner: the Go SDK's default request timeout.
const renewTimeout = 2 * time.Second

// flushEvery pushes the log to its file now and then, so a writer that is
// stopped for good leaves most of its log behind.
func (w *writer) flushEvery(ctx context.Context, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = w.log.flush()
		}
	}
}

// watchPauses notices the process being stopped (SIGSTOP) and woken: the
// wall clock jumps by more than the TTL between two ticks.
func (w *writer) watchPauses(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.checkPause()
		}
	}
}

// checkPause records a wake-up if the clock jumped since the last check;
// the holder of a generation becomes a zombie of it for cfg.Zombie.
func (w *writer) checkPause() {
	now := time.Now()
	last := w.lastTick.Swap(now.UnixNano())
	paused := time.Duration(now.UnixNano() - last)
	if paused <= w.cfg.TTL {
		return
	}
	w.mu.Lock()
	gen := w.gen
	if gen > 0 && w.cfg.Zombie > 0 {
		w.zombieGen, w.zombieUntil = gen, now.Add(w.cfg.Zombie)
	}
	w.mu.Unlock()
	w.log.add(Record{Kind: KindWoke, T: now.UnixNano(), PausedMillis: paused.Milliseconds(), Gen: gen,
		Zombie: gen > 0 && w.cfg.Zombie > 0})
}

// valid reports whether gen is held and trusted now.
func (w *writer) valid(gen int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen == gen && !w.lost && time.Now().Before(w.deadline)
}

// zombie reports whether gen is published with regardless of the lease.
func (w *writer) zombie(gen int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.zombieGen == gen && time.Now().Before(w.zombieUntil)
}

// markLost gives gen up, once.
func (w *writer) markLost(gen int64, why string) {
	w.mu.Lock()
	first := w.gen == gen && !w.lost
	if first {
		w.lost = true
	}
	w.mu.Unlock()
	if first {
		w.log.add(Record{Kind: KindLost, Gen: gen, Why: why})
	}
}

// extend moves gen's deadline after a confirmed renewal sent at sent; a
// reply that arrives out of order never moves it back.
func (w *writer) extend(gen int64, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := sent.Add(w.cfg.TTL - safetyMargin(w.cfg.TTL)); w.gen == gen && !w.lost && d.After(w.deadline) {
		w.deadline = d
	}
}

// acquire asks for the lease until it is granted or ctx ends. A refusal
// because another holder has it waits until that lease's expiry. A request
// that got no answer is sent again with its request_id, so a grant whose
// reply was lost is given again, not bumped (docs/contract.md §1).
func (w *writer) acquire(ctx context.Context) (int64, error) {
	part, ttl := w.cfg.Partition, w.cfg.TTL.Milliseconds()
	req := wire.LeaseRequest{Partition: &part, TTLMillis: &ttl, RequestID: ulid.Make().String()}
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		sent := time.Now()
		var rep wire.LeaseReply
		er, err := w.request(ctx, w.subj.Lease(wire.LeaseAcquire, w.cfg.Holder), req, &rep, w.cfg.TTL)
		now := time.Now()
		switch {
		case err == nil && rep.Generation > 0:
			w.mu.Lock()
			w.gen, w.lost, w.deadline = rep.Generation, false, sent.Add(w.cfg.TTL-safetyMargin(w.cfg.TTL))
			w.mu.Unlock()
			w.log.add(Record{Kind: KindGrant, T: now.UnixNano(), Sent: sent.UnixNano(), Gen: rep.Generation,
				ExpiresAt: rep.ExpiresAt})
			return rep.Generation, nil
		case er != nil && er.Error == wire.ErrCodeHeld:
			w.log.add(Record{Kind: KindHeld, T: now.UnixNano(), Sent: sent.UnixNano(), Holder: er.Holder,
				Gen: er.Generation, ExpiresAt: er.ExpiresAt})
			req.RequestID = ulid.Make().String()
			wait := w.cfg.TTL
			if exp, perr := time.Parse(time.RFC3339Nano, er.ExpiresAt); perr == nil {
				wait = min(max(time.Until(exp)+2*time.Millisecond, 5*time.Millisecond), w.cfg.TTL)
			}
			sleep(ctx, wait)
		default:
			sleep(ctx, 50*time.Millisecond+time.Duration(w.rng.IntN(50))*time.Millisecond)
		}
	}
}

// renewLoop renews gen every TTL/3 until ctx ends or gen is lost: refused,
// or not confirmed before its deadline. Its schedule is the Go SDK's
// (Lease.keepAlive), so that what a run measures of failovers and pauses
// holds for the SDK's users.
func (w *writer) renewLoop(ctx context.Context, gen int64) {
	every := w.cfg.TTL / 3
	retry := max(every/4, 10*time.Millisecond)
	part, ttl := w.cfg.Partition, w.cfg.TTL.Milliseconds()
	req := wire.LeaseRequest{Partition: &part, Generation: &gen, TTLMillis: &ttl}
	wait := every
	for {
		if !sleep(ctx, wait) {
			return
		}
		w.mu.Lock()
		deadline, mine := w.deadline, w.gen == gen && !w.lost
		w.mu.Unlock()
		if !mine {
			return
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			w.markLost(gen, "no renewal confirmed before the local deadline")
			return
		}
		var rep wire.LeaseReply
		// One attempt waits at most half the renewal interval, as the SDK's
		// does, so a lost reply leaves time to ask again.
		er, err := w.request(ctx, w.subj.Lease(wire.LeaseRenew, w.cfg.Holder), req, &rep,
			min(renewTimeout, max(every/2, 50*time.Millisecond), time.Until(deadline)))
		switch {
		case err == nil:
			w.extend(gen, sent)
			wait = time.Until(sent.Add(every))
		case er != nil && er.Error != wire.ErrCodeUnavailable:
			w.markLost(gen, "renewal refused: "+er.Error+": "+er.Message)
			return
		default:
			wait = retry
		}
	}
}

// hold publishes while gen is valid, or while the writer is a zombie of it.
func (w *writer) hold(ctx context.Context, gen int64) {
	next := make(map[string]int64, len(w.cfg.Tasks))
	for _, task := range w.cfg.Tasks {
		for {
			if ctx.Err() != nil || !w.valid(gen) {
				return
			}
			var rep wire.TaskHeadReply
			if _, err := w.request(ctx, w.subj.TaskHead(), wire.TaskHeadRequest{Task: task}, &rep, w.cfg.TTL/3); err == nil {
				next[task] = rep.Version + 1
				w.log.add(Record{Kind: KindHead, Gen: gen, Task: task, Version: rep.Version})
				break
			}
			sleep(ctx, 25*time.Millisecond)
		}
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / w.cfg.Rate))
	defer tick.Stop()
	for i := w.rng.IntN(len(w.cfg.Tasks)); ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		w.checkPause()
		zombie := w.zombie(gen)
		if !zombie && !w.valid(gen) {
			w.markLost(gen, "local deadline passed")
			return
		}
		task := w.cfg.Tasks[i%len(w.cfg.Tasks)]
		if w.publish(ctx, gen, task, next[task]) {
			next[task]++
		}
	}
}

// publish sends the next event of task until JetStream acks it. A zombie
// sends once; otherwise it retries with the same id while gen is valid.
func (w *writer) publish(ctx context.Context, gen int64, task string, version int64) bool {
	id := ulid.Make().String()
	typ := typeOf(version)
	// The payload names the event, so no two events share content; the
	// slot key makes the projection's merged data depend on every version.
	payload, _ := json.Marshal(map[string]any{"by": w.cfg.Holder, "gen": gen, "v": version, "id": id,
		"slot" + strconv.FormatInt(version%4, 10): version})
	msg := w.subj.InboundMsg(wire.Inbound{ID: id, Partition: w.cfg.Partition, Task: task, Holder: w.cfg.Holder,
		Generation: gen, Version: version, Type: typ, Payload: payload})
	for try := 1; ; try++ {
		zombie := w.zombie(gen)
		if !zombie && !w.valid(gen) || ctx.Err() != nil {
			return false
		}
		w.log.add(Record{Kind: KindPub, ID: id, Task: task, Version: version, Gen: gen, Type: typ, Try: try,
			Zombie: zombie && !w.valid(gen)})
		pctx, cancel := context.WithTimeout(ctx, max(w.cfg.TTL, time.Second))
		ack, err := w.js.PublishMsg(pctx, msg, jetstream.WithRetryAttempts(0))
		cancel()
		if try == 1 && typ == effectType && w.cfg.Downstream != nil {
			w.directEffect(ctx, gen, id, zombie && !w.valid(gen))
		}
		if err == nil {
			w.log.add(Record{Kind: KindAck, ID: id, Seq: ack.Sequence, Dup: ack.Duplicate})
			// A zombie's event is kept too: lost from LEDGER_IN, it would
			// get no verdict; sent again, its generation makes it stale.
			if w.cfg.Resend > 0 {
				w.mu.Lock()
				w.unanswered[id] = &sent{msg: msg, task: task, ver: version, gen: gen, typ: typ, acked: time.Now(), tries: try}
				w.mu.Unlock()
			}
			return true
		}
		w.log.add(Record{Kind: KindNack, ID: id, Err: err.Error()})
		if zombie {
			return false
		}
		sleep(ctx, 25*time.Millisecond)
	}
}

// onReceipt logs a receipt; a stale one of the held generation ends it, as
// the fence will refuse that generation from now on.
func (w *writer) onReceipt(m *nats.Msg) {
	r, err := wire.DecodeReceipt(m.Data)
	if err != nil {
		w.log.add(Record{Kind: KindReceipt, ID: "?", Err: err.Error()})
		return
	}
	w.log.add(Record{Kind: KindReceipt, ID: r.EventID, Task: r.Task, Version: r.Version, Gen: r.Generation,
		Verdict: string(r.Verdict), Reason: r.Reason, Seq: uint64(max(r.Seq, 0))})
	w.mu.Lock()
	delete(w.unanswered, r.EventID)
	w.mu.Unlock()
	if r.Verdict == wire.VerdictStale {
		w.markLost(r.Generation, "stale receipt: "+r.Reason)
	}
}

// request sends a request to the lease service: a success reply is decoded
// into out; an error reply is returned as er (unavailable, when nothing
// answered in time).
func (w *writer) request(ctx context.Context, subject string, body, out any, timeout time.Duration) (*wire.ErrorReply, error) {
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithTimeout(ctx, max(timeout, 50*time.Millisecond))
	defer cancel()
	resp, err := w.nc.RequestWithContext(rctx, subject, b)
	if err != nil {
		return &wire.ErrorReply{Error: wire.ErrCodeUnavailable, Message: err.Error()}, err
	}
	return decodeReply(resp.Header, resp.Data, out)
}

// decodeReply reads a lease service reply: an error reply (the micro error
// header set) as an ErrorReply, anything else as out.
func decodeReply(h nats.Header, data []byte, out any) (*wire.ErrorReply, error) {
	if code := h.Get(micro.ErrorCodeHeader); code != "" {
		var er wire.ErrorReply
		if json.Unmarshal(data, &er) != nil || er.Error == "" {
			er = wire.ErrorReply{Error: wire.ErrCodeInvalid, Message: "error " + code + ": " + h.Get(micro.ErrorHeader)}
		}
		return &er, fmt.Errorf("%s: %s", er.Error, er.Message)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &wire.ErrorReply{Error: wire.ErrCodeInvalid, Message: err.Error()}, fmt.Errorf("decode reply: %w", err)
	}
	return nil, nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// resendLoop publishes again, with its id, each acked event that has had
// no receipt for Resend, until the writer stops. The ingest answers a copy
// of a committed event with duplicate, and judges one it never saw.
func (w *writer) resendLoop(ctx context.Context) {
	if w.cfg.Resend <= 0 {
		return
	}
	tick := time.NewTicker(w.cfg.Resend / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var due []*sent
		var ids []string
		w.mu.Lock()
		for id, s := range w.unanswered {
			if time.Since(s.acked) >= w.cfg.Resend {
				due, ids = append(due, s), append(ids, id)
			}
		}
		w.mu.Unlock()
		for i, s := range due {
			s.tries++
			w.log.add(Record{Kind: KindPub, ID: ids[i], Task: s.task, Version: s.ver, Gen: s.gen, Type: s.typ, Try: s.tries})
			pctx, cancel := context.WithTimeout(ctx, max(w.cfg.TTL, time.Second))
			ack, err := w.js.PublishMsg(pctx, s.msg, jetstream.WithRetryAttempts(0))
			cancel()
			if err != nil {
				w.log.add(Record{Kind: KindNack, ID: ids[i], Err: err.Error()})
				continue
			}
			w.log.add(Record{Kind: KindAck, ID: ids[i], Seq: ack.Sequence, Dup: ack.Duplicate})
			w.mu.Lock()
			s.acked = time.Now()
			w.mu.Unlock()
		}
	}
}
