package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowness/ledger/pkg/wire"
)

// Client is one worker's connection to the ledger: it acquires leases as
// Config.Holder and receives that holder's receipts. It is safe for
// concurrent use. The NATS connection stays the caller's: Close does not
// close it.
type Client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  Config
	subj wire.Subjects
	log  *slog.Logger
	sub  *nats.Subscription
	// heads asks for the heads of new tasks, many in one request.
	heads *headBatcher
	// lookups asks for the verdicts of events without a receipt, many in
	// one request.
	lookups *lookupBatcher

	// closedCh is closed by Close; waits on receipts and acks end there.
	closedCh chan struct{}
	// ctx is cancelled by Close: it ends verdict lookups in flight.
	ctx  context.Context
	stop context.CancelFunc
	// wg counts keep-alive goroutines, events waiting for a publish ack
	// and verdict lookups in flight.
	wg sync.WaitGroup

	mu     sync.Mutex
	closed bool
	// leases are the active leases by partition; a nil entry reserves a
	// partition while its acquire is in flight.
	leases map[int]*Lease
	// pending are published events without a receipt, by event id.
	pending map[string]*Pending
	// acking are published events waiting for their publish ack, by event
	// id (the JetStream callbacks resolve them; a receipt may come first).
	acking map[string]*Pending
	// batches are the events of each batch message waiting for its
	// publish ack, by its Nats-Msg-Id (batch.go).
	batches map[string][]*Pending
	// noBatches is set once LEDGER_IN refused a batch: events go alone.
	noBatches atomic.Bool
}

// New checks cfg and returns a client on nc. It subscribes (core NATS) to
// the holder's receipt subject, <prefix>.receipt.<holder>, at once: the
// subscription reaches the server before any acquire this client sends,
// so no receipt of its events can be missed.
//
// With Config.Partitions 0 (the default), New asks the lease service for
// the deployment's partition count (one <prefix>.lease.get, bounded by
// Config.RequestTimeout), so that PartitionOf agrees with the ingest
// without the count being configured twice; it fails with an error
// matching ErrUnavailable when the service does not answer.
func New(nc *nats.Conn, cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if nc == nil {
		return nil, errors.New("worker: a NATS connection is required")
	}
	if prefix := wire.InboxPrefix(wire.Principal(cfg.Holder)); !strings.HasPrefix(nc.NewInbox(), prefix+".") {
		return nil, fmt.Errorf("worker: the connection's replies must come to %s.>, the only inbox the holder's principal may read: "+
			"connect with worker.InboxOption(%q)", prefix, cfg.Holder)
	}
	if o := nc.Opts; o.MaxReconnect >= 0 || !o.AllowReconnect {
		// A connection that gives up closes for good, and the events still
		// waiting for their verdicts never get them (docs/sdk.md).
		cfg.Logger.Warn("the NATS connection stops reconnecting after a while: events waiting for their verdicts "+
			"then never get them; connect with nats.MaxReconnects(-1)",
			slog.Int("max_reconnects", o.MaxReconnect), slog.Bool("allow_reconnect", o.AllowReconnect))
	}
	// Client bounds its events per lease itself (MaxInFlight), so
	// JetStream's own bound is only a backstop and must never stall first.
	c := &Client{nc: nc, cfg: cfg, subj: wire.Subjects{Prefix: cfg.Prefix}, log: cfg.Logger,
		closedCh: make(chan struct{}), leases: map[int]*Lease{}, pending: map[string]*Pending{},
		acking: map[string]*Pending{}, batches: map[string][]*Pending{}}
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.heads = newHeadBatcher(c)
	c.lookups = newLookupBatcher(c)
	if cfg.Partitions == 0 {
		n, err := c.askPartitions()
		if err != nil {
			return nil, err
		}
		c.cfg.Partitions = n
	}
	// Publish acks are taken by two callbacks rather than a goroutine per
	// event: at thousands of events a second that goroutine was a sixth of
	// the SDK's cost.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(math.MaxInt32),
		jetstream.WithPublishAsyncTimeout(cfg.PublishAckTimeout),
		jetstream.WithPublishAsyncAckHandler(c.onAck), jetstream.WithPublishAsyncErrHandler(c.onAckErr))
	if err != nil {
		return nil, fmt.Errorf("worker: jetstream: %w", err)
	}
	c.js = js
	c.sub, err = nc.Subscribe(c.subj.Receipt(cfg.Holder), c.onReceipt)
	if err != nil {
		return nil, fmt.Errorf("worker: subscribe to receipts: %w", err)
	}
	c.wg.Add(1)
	go c.watchReconnects()
	return c, nil
}

// InboxOption is the NATS connection option a worker of holder connects
// with: its replies (lease service answers, publish acks) come to
// _INBOX.<principal>.>, which in an authenticated deployment only that
// principal may subscribe to (docs/contract.md §9).
func InboxOption(holder string) nats.Option {
	return nats.CustomInboxPrefix(wire.InboxPrefix(wire.Principal(holder)))
}

// Holder returns the client's holder id.
func (c *Client) Holder() string { return c.cfg.Holder }

// PartitionOf is the SDK's default partition of a task:
// fnv1a32(task) mod Partitions() (docs/contract.md, Identifiers).
func (c *Client) PartitionOf(task string) int { return wire.PartitionOf(task, c.cfg.Partitions) }

// Partitions returns the partition count the client uses: Config.Partitions,
// or the deployment's as the lease service told New.
func (c *Client) Partitions() int { return c.cfg.Partitions }

// Close ends every lease of the client without releasing it (each expires
// by its TTL; their contexts are cancelled with cause ErrClosed), stops
// receiving receipts, and waits for the client's goroutines. Waits on
// receipts and publish acks return ErrClosed. It does not close the NATS
// connection. Calling it again does nothing.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closedCh)
	var leases []*Lease
	for _, l := range c.leases {
		if l != nil {
			leases = append(leases, l)
		}
	}
	pending := make([]*Pending, 0, len(c.pending))
	for _, p := range c.pending {
		pending = append(pending, p)
	}
	c.mu.Unlock()

	for _, l := range leases {
		l.end(ErrClosed, false)
	}
	err := c.sub.Unsubscribe()
	c.failAcks(ErrClosed)
	c.stop()
	for _, p := range pending {
		p.stopLookups()
	}
	c.wg.Wait()
	c.js.CleanupPublisher()
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("worker: unsubscribe from receipts: %w", err)
	}
	return nil
}

// TaskHead asks the ledger for task's head: its last committed version,
// the partition it is pinned to and the type of its last event (version 0,
// partition and type nil for a task never committed).
//
// A holder that takes a partition over resumes each task from it: acquire
// first (a head read before the lease can still move), then skip a task
// whose type is terminal for your work (such as "completed"), and carry on
// with the others from Version+1, which is the version Publish assigns to
// the lease's next event of the task.
func (c *Client) TaskHead(ctx context.Context, task string) (wire.TaskHeadReply, error) {
	var r wire.TaskHeadReply
	if !wire.ValidID(task) {
		return r, fmt.Errorf("worker: task id %q is not 1..128 of [A-Za-z0-9_-]: %w", task, ErrInvalid)
	}
	if err := c.request(ctx, c.subj.TaskHead(), wire.TaskHeadRequest{Task: task}, &r); err != nil {
		return r, fmt.Errorf("worker: head of task %s: %w", task, err)
	}
	return r, nil
}

// request sends one request to the lease service and decodes the success
// reply into out. Error replies become *ServiceError; a service that cannot
// be reached is ErrUnavailable.
func (c *Client) request(ctx context.Context, subject string, body, out any) error {
	// Without HTML escaping: a payload of '<' would grow sixfold.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	resp, err := c.nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
			errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	return decodeReply(resp.Header.Get(micro.ErrorCodeHeader), resp.Header.Get(micro.ErrorHeader), resp.Data, out)
}

// decodeReply reads a reply of the lease service: an error reply (its
// micro error code header set) becomes a *ServiceError, whatever its body;
// a success reply is decoded into out.
func decodeReply(code, message string, data []byte, out any) error {
	if code != "" {
		var er wire.ErrorReply
		if json.Unmarshal(data, &er) != nil || er.Error == "" {
			er = wire.ErrorReply{Error: wire.ErrCodeInvalid, Message: fmt.Sprintf("error %.40s: %.200s", code, message)}
		}
		return newServiceError(er)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode reply %.200q: %w", data, err)
	}
	return nil
}

// askPartitions asks the lease service for the deployment's partition
// count: lease.get of partition 0, which every deployment has, answers it
// whether the partition was ever leased or not.
func (c *Client) askPartitions() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RequestTimeout)
	defer cancel()
	zero := 0
	var reply wire.LeaseReply
	err := c.request(ctx, c.subj.LeaseGet(), wire.LeaseRequest{Partition: &zero}, &reply)
	n, err := partitionsFrom(reply, err)
	if err != nil {
		return 0, fmt.Errorf("worker: ask the lease service for the partition count (set Config.Partitions to start without it): %w", err)
	}
	return n, nil
}

// partitionsFrom is the partition count a lease.get reply tells: a success
// or a no_lease error carries it; anything else is an error.
func partitionsFrom(reply wire.LeaseReply, err error) (int, error) {
	n := reply.Partitions
	var se *ServiceError
	switch {
	case errors.As(err, &se) && errors.Is(err, ErrNoLease):
		n = se.Partitions
	case err != nil:
		return 0, err
	}
	if n < 1 || n > math.MaxInt32 {
		return 0, fmt.Errorf("the reply has no partition count (an ingest older than this SDK?), or an impossible one: %d", n)
	}
	return n, nil
}

// onReceipt routes a receipt to its pending event. Receipts are at least
// once: a second receipt of an event (a redelivery after an ingest crash),
// or one that comes after a lookup settled the event, finds nothing
// pending and is dropped.
func (c *Client) onReceipt(m *nats.Msg) {
	if m.Header.Get(wire.HeaderBatch) != "" {
		c.onBatchReceipt(m)
		return
	}
	r, err := wire.DecodeReceipt(m.Data)
	if err != nil {
		c.log.Warn("undecodable receipt", slog.String("error", err.Error()))
		return
	}
	if !c.settle(r) {
		c.log.Debug("receipt of no pending event", slog.String("event_id", r.EventID),
			slog.String("verdict", string(r.Verdict)))
	}
}

// settle gives an event its verdict, from its receipt or from a lookup,
// exactly once: taking it out of c.pending is the one decision, so
// whichever comes second finds nothing and changes nothing.
func (c *Client) settle(r wire.Receipt) bool {
	c.mu.Lock()
	p := c.pending[r.EventID]
	delete(c.pending, r.EventID)
	c.mu.Unlock()
	if p == nil {
		return false
	}
	if p.resent.Load() && r.Verdict == wire.VerdictDuplicate && r.Reason == wire.ReasonSameEventID {
		// The answer to this client's own copy: the event is the row, as
		// a lookup would report it.
		r.Verdict, r.Reason = wire.VerdictCommitted, ""
	}
	p.stopLookups()
	// The task is marked refused before Wait returns: a caller that saw the
	// refusal and publishes the task's next version at once must get
	// ErrResyncNeeded, not a race.
	p.lease.noteRefusal(p, r)
	p.resolve(r)
	p.lease.onReceipt(p, r)
	return true
}

// awaitVerdict schedules a lookup of p's verdict ReceiptTimeout from now,
// in case its receipt is lost. It is called once the publish ack came (or
// publishing stopped without one: the event may still have been stored),
// and again after each lookup that learned nothing, so an event never has
// more than one lookup in flight.
//
// Receipts travel on core NATS, at least once in the normal flow, but one
// sent while this client is disconnected is lost. The lookup asks
// <prefix>.task.head for the verdict recorded under the event's id, with
// the event's content, so that committed is answered only for what the
// ledger stored. It settles the event as its receipt would have: committed
// with the row's seq (also for a duplicate of the same id), or stale,
// conflict or gap with its reason and current_generation 0. While the
// ledger has no record (the LEDGER_IN message may have been lost by a
// JetStream server that crashed), the event is published again, same id
// and content, on the 1st, 2nd, 4th, 8th, ... such answer, after the
// lease ended too (publishAgain). Two verdicts record nothing under the event's id: invalid, and a
// duplicate of identical content under another id. An event whose receipt
// of either is lost stays pending; the caller's context bounds every wait.
func (c *Client) awaitVerdict(p *Pending) {
	if isClosed(c.closedCh) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lookupsOver {
		return
	}
	p.lookup = time.AfterFunc(c.cfg.ReceiptTimeout, func() { c.lookUpVerdict(p) })
}

// lookUpVerdict asks the ledger for p's recorded verdict and settles p with
// it; while the ledger has none, or cannot be asked, it schedules the next
// lookup.
func (c *Client) lookUpVerdict(p *Pending) {
	if !c.hold() {
		return
	}
	defer c.wg.Done()
	r, found, err := c.verdictOf(p)
	switch {
	case err != nil:
		if c.ctx.Err() != nil {
			return
		}
		// An unreachable service is reported by the keep-alive already,
		// once per lease rather than once per event.
		level := slog.LevelWarn
		if errors.Is(err, ErrUnavailable) {
			level = slog.LevelDebug
		}
		c.log.Log(c.ctx, level, "no receipt, and the ledger could not be asked for the verdict; asking again later",
			slog.String("event_id", p.id), slog.String("error", err.Error()))
	case found:
		if c.settle(r) {
			c.log.Info("no receipt; verdict learned from the ledger", slog.String("event_id", p.id),
				slog.String("task", p.task), slog.Int64("version", p.version), slog.String("verdict", string(r.Verdict)))
		}
		return
	default:
		c.log.Debug("no receipt, and no verdict recorded yet", slog.String("event_id", p.id))
		c.publishAgain(p)
	}
	c.awaitVerdict(p)
}

// publishAgain sends p again after the ledger answered that it has no
// record of it: its LEDGER_IN message may be lost (a stream that lost
// acknowledged writes after a crash), and the event must not wait for
// ever. The copy has p's id and content under a new Nats-Msg-Id token, so
// LEDGER_IN stores it even where it still remembers the lost one; if the
// first copy is only waiting, the ledger answers the second duplicate. It
// sends on the first such answer and then after 2, 4, 8, ... of them, so a
// long queue in LEDGER_IN gains few copies.
//
// It sends after the lease ended too. The copy carries the event's own
// generation, so the fence judges it as it would have judged the lost
// message decided as late: stale once the lease is gone, never a commit
// the original could not have made. Without it an event acknowledged by
// JetStream, and lost there after its lease ended, never gets a verdict.
func (c *Client) publishAgain(p *Pending) {
	p.mu.Lock()
	p.unknown++
	n := p.unknown
	p.mu.Unlock()
	if n&(n-1) != 0 || p.message() == nil {
		return
	}
	m := againMsg(p.message(), n)
	p.resent.Store(true)
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.PublishAckTimeout)
	defer cancel()
	if _, err := c.js.PublishMsg(ctx, m); err != nil {
		c.log.Debug("the ledger has no record of an event; publishing it again failed, trying later",
			slog.String("event_id", p.id), slog.String("error", err.Error()))
		return
	}
	c.log.Info("the ledger has no record of an event; published it again", slog.String("event_id", p.id),
		slog.String("task", p.task), slog.Int64("version", p.version))
}

// againMsg is m, an event's LEDGER_IN message, as its n-th copy sent after
// the ledger had no record of it: the same subject, headers and body, and
// the Nats-Msg-Id token suffixed "-a<n>".
func againMsg(m *nats.Msg, n int) *nats.Msg { return copyMsg(m, "a"+strconv.Itoa(n)) }

// copyMsg is m with the Nats-Msg-Id token suffixed "-<suffix>".
func copyMsg(m *nats.Msg, suffix string) *nats.Msg {
	out := nats.NewMsg(m.Subject)
	for k, vs := range m.Header {
		out.Header[k] = vs
	}
	id, token, _ := wire.SplitMsgID(m.Header.Get(wire.HeaderMsgID))
	out.Header.Set(wire.HeaderMsgID, wire.MsgID(id, token+"-"+suffix))
	out.Data = m.Data
	return out
}

// verdictOf asks <prefix>.task.head for the verdict the ledger recorded for
// p, with other events' lookups (lookups.go), and returns it as the
// receipt it stands for. The ledger records
// committed, stale, conflict and gap; for an event it has not judged yet,
// or whose verdict leaves no record under its id (invalid; a duplicate of
// identical content under another id), it answers null and found is false.
func (c *Client) verdictOf(p *Pending) (r wire.Receipt, found bool, err error) {
	reply, err := c.lookups.lookup(c.ctx, p)
	if err != nil {
		return r, false, fmt.Errorf("worker: verdict of event %s: %w", p.id, err)
	}
	return p.lookedUp(reply.Event)
}

// lookedUp turns the ledger's answer to a lookup of p into the receipt it
// stands for; found is false for null. An answer about another event, or
// with a verdict the contract does not have, settles nothing.
func (p *Pending) lookedUp(ev *wire.EventVerdict) (r wire.Receipt, found bool, err error) {
	switch {
	case ev == nil:
		return r, false, nil
	case ev.EventID != p.id:
		return r, false, fmt.Errorf("worker: verdict of event %s: the ledger answered for event %.40q", p.id, ev.EventID)
	case !ev.Verdict.Final():
		return r, false, fmt.Errorf("worker: verdict of event %s: the ledger answered verdict %.40q", p.id, ev.Verdict)
	}
	l := p.lease
	return wire.Receipt{EventID: p.id, Task: p.task, Partition: l.partition, Version: p.version,
		Verdict: ev.Verdict, Reason: ev.Reason, Seq: ev.Seq, Generation: l.generation}, true, nil
}

// hold counts a goroutine in c.wg unless the client is closed, so Close
// waits for it.
func (c *Client) hold() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// register makes p receive its receipt and its publish ack; it returns
// false once the client is closed.
func (c *Client) register(p *Pending) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.pending[p.id] = p
	c.acking[p.id] = p
	c.wg.Add(1)
	return true
}

// unregister undoes register for an event that was not published.
func (c *Client) unregister(p *Pending) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, p.id)
	if _, ok := c.acking[p.id]; ok {
		delete(c.acking, p.id)
		c.wg.Done()
	}
}

// takeAcking removes and returns the event a publish ack is for.
func (c *Client) takeAcking(m *nats.Msg) *Pending {
	id := wire.EventIDOf(m.Header.Get(wire.HeaderMsgID))
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.acking[id]
	delete(c.acking, id)
	return p
}

// onAck is JetStream's callback for a stored publish.
func (c *Client) onAck(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
	if m.Header.Get(wire.HeaderBatch) != "" {
		c.onBatchAck(m, ack)
		return
	}
	if p := c.takeAcking(m); p != nil {
		p.setAck(ack, nil)
		c.awaitVerdict(p)
		c.wg.Done()
	}
}

// onAckErr is JetStream's callback for a failed or timed-out publish: the
// event is published again, with its id, until the lease ends.
func (c *Client) onAckErr(_ jetstream.JetStream, m *nats.Msg, err error) {
	if m.Header.Get(wire.HeaderBatch) != "" {
		c.batchFailed(c.takeBatch(m), err)
		return
	}
	if p := c.takeAcking(m); p != nil {
		go c.republish(p, err)
	}
}

// failAcks gives every event still waiting for its publish ack the error.
func (c *Client) failAcks(err error) {
	c.mu.Lock()
	waiting := c.acking
	c.acking = map[string]*Pending{}
	c.mu.Unlock()
	for _, p := range waiting {
		p.setAck(nil, err)
		c.wg.Done()
	}
}
