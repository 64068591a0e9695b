package ingest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// copier stores the LEDGER_LOG and LEDGER_DLQ copies of committed batches.
// Each copy is a JetStream publish whose reply subject names its set (one
// publish of a batch's copies) and its index in the set; one wildcard
// subscription takes every publish ack. jetstream's PublishMsgAsync would
// keep a future, a timer and a JSON-decoded ack per copy; in the pipeline
// benchmark that bookkeeping was about a twentieth of the CPU per event.
//
// A copy whose ack does not come (a lost reply, a stream leader that died
// mid-request), or comes as an error, counts as not stored: the caller
// publishes it again in a new set. Copies are deduplicated by Nats-Msg-Id,
// so publishing one twice is safe.
type copier struct {
	nc     *nats.Conn
	own    bool   // nc is the copier's own (copiesConn): close closes it
	inbox  string // the reply prefix, ending in "."
	sub    *nats.Subscription
	status chan nats.Status
	ended  chan struct{}

	mu   sync.Mutex
	sets map[uint64]*copySet
	next uint64
	// drop is a test seam: a copy it returns true for is not sent.
	drop func(*nats.Msg) bool
}

// copySet is one publish of a batch's copies.
type copySet struct {
	id   uint64
	msgs []*nats.Msg

	mu      sync.Mutex
	stored  []bool
	seqs    []uint64 // where copy i is in its stream (a duplicate's: the first copy's)
	errs    []error  // why copy i was not stored, where known
	left    int      // copies whose outcome is not known yet
	lastErr error
	done    chan struct{} // closed when left reaches 0
}

// failedCopy is a copy that was not stored, and why (nil: no ack came).
// orig is the message as published; msg is what to publish again.
type failedCopy struct {
	msg, orig *nats.Msg
	err       error
}

func newCopier(nc *nats.Conn, own bool) (*copier, error) {
	c := &copier{nc: nc, own: own, inbox: nc.NewInbox() + ".", sets: map[uint64]*copySet{}}
	sub, err := nc.Subscribe(c.inbox+"*.*", c.onAck)
	if err == nil {
		// A dropped ack costs a republish after the timeout; never drop
		// them for want of buffer.
		if err = sub.SetPendingLimits(-1, -1); err != nil {
			_ = sub.Unsubscribe()
		}
	}
	if err != nil {
		if own {
			nc.Close()
		}
		return nil, fmt.Errorf("ingest: publish-ack subscription: %w", err)
	}
	c.sub = sub
	c.status, c.ended = nc.StatusChanged(nats.RECONNECTING, nats.CLOSED), make(chan struct{})
	go c.failOnDisconnect()
	return c, nil
}

func (c *copier) close() {
	_ = c.sub.Unsubscribe()
	c.nc.RemoveStatusListener(c.status)
	<-c.ended
	if c.own {
		c.nc.Close()
	}
}

// copiesConn is a second connection to NATS like nc, for LEDGER_LOG and
// LEDGER_DLQ copies, that buffers nothing while it reconnects. On nc, a copy
// published just as the server went down waited in the client's reconnect
// buffer and was stored first on the restarted server, before the copies
// its loss took were put back (log_order in chaos: v505 before v504).
func copiesConn(nc *nats.Conn) (*nats.Conn, error) {
	o := nc.Opts
	o.ReconnectBufSize = -1
	o.Name = cmp.Or(o.Name, "ledger-ingest") + " (log copies)"
	// Its owner's callbacks are about nc.
	o.ConnectedCB, o.DisconnectedCB, o.DisconnectedErrCB, o.ReconnectedCB, o.ClosedCB = nil, nil, nil, nil, nil
	o.DiscoveredServersCB, o.AsyncErrorCB, o.LameDuckModeHandler, o.ReconnectErrCB = nil, nil, nil, nil
	cc, err := o.Connect()
	if err != nil {
		return nil, fmt.Errorf("ingest: a connection for log copies: %w", err)
	}
	return cc, nil
}

// failOnDisconnect settles every copy still waiting for its ack as not
// stored when the connection is lost: acks in flight then are lost with it,
// and waiting out the publish timeout would only delay the republish.
func (c *copier) failOnDisconnect() {
	defer close(c.ended)
	for st := range c.status {
		err := fmt.Errorf("jetstream: connection %s before the publish ack", strings.ToLower(st.String()))
		c.mu.Lock()
		sets := make([]*copySet, 0, len(c.sets))
		for _, set := range c.sets {
			sets = append(sets, set)
		}
		c.mu.Unlock()
		for _, set := range sets {
			set.failPending(err)
		}
	}
}

// publish sends msgs, each with a reply subject of the new set.
func (c *copier) publish(msgs []*nats.Msg) *copySet {
	c.mu.Lock()
	c.next++
	set := &copySet{id: c.next, msgs: msgs, stored: make([]bool, len(msgs)),
		seqs: make([]uint64, len(msgs)), errs: make([]error, len(msgs)),
		left: len(msgs), done: make(chan struct{})}
	c.sets[set.id] = set
	c.mu.Unlock()
	if len(msgs) == 0 {
		close(set.done)
		return set
	}
	// While the connection is down the client would buffer the copies and
	// send them once it reconnects, ahead of the earlier copies a server
	// that lost its tail needs first (storeCopies starts over instead).
	if !c.nc.IsConnected() {
		set.failPending(nats.ErrConnectionReconnecting)
		return set
	}
	prefix := c.inbox + strconv.FormatUint(set.id, 10) + "."
	for i, m := range msgs {
		m.Reply = prefix + strconv.Itoa(i)
		if c.drop != nil && c.drop(m) {
			continue
		}
		if err := c.nc.PublishMsg(m); err != nil {
			set.settle(i, err, 0)
		}
	}
	return set
}

// onAck settles the copy an ack is for; acks of sets already given up on
// are dropped.
func (c *copier) onAck(m *nats.Msg) {
	rest, ok := strings.CutPrefix(m.Subject, c.inbox)
	if !ok {
		return
	}
	ids, is, ok := strings.Cut(rest, ".")
	id, err1 := strconv.ParseUint(ids, 10, 64)
	i, err2 := strconv.Atoi(is)
	if !ok || err1 != nil || err2 != nil {
		return
	}
	c.mu.Lock()
	set := c.sets[id]
	c.mu.Unlock()
	if set == nil || i < 0 || i >= len(set.msgs) {
		return
	}
	err := pubAckError(m)
	var seq uint64
	if err == nil {
		seq = pubAckSeq(m.Data)
	}
	set.settle(i, err, seq)
}

// settle records the outcome of copy i: stored at seq when err is nil.
func (s *copySet) settle(i int, err error, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left == 0 || s.stored[i] {
		return
	}
	if err != nil {
		s.lastErr, s.errs[i] = err, err
	} else {
		s.stored[i], s.seqs[i] = true, seq
	}
	// Each copy is settled once: by its ack, or by its failed publish (then
	// no ack comes). A second reply to the same subject cannot arrive.
	s.left--
	if s.left == 0 {
		close(s.done)
	}
}

// failPending settles every copy without an outcome yet as not stored.
func (s *copySet) failPending(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left == 0 {
		return
	}
	s.lastErr, s.left = err, 0
	close(s.done)
}

// wait waits until every copy of set has its outcome, or timeout passes, or
// ctx ends (ok false). It returns the copies not stored and the last error
// seen, and forgets the set: acks arriving later are dropped.
func (c *copier) wait(ctx context.Context, set *copySet, timeout time.Duration) (failed []failedCopy, lastErr error, ok bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-set.done:
	case <-t.C:
	case <-ctx.Done():
	}
	c.mu.Lock()
	delete(c.sets, set.id)
	c.mu.Unlock()
	if ctx.Err() != nil {
		return nil, nil, false
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	for i, stored := range set.stored {
		if !stored {
			failed = append(failed, failedCopy{msg: set.msgs[i], orig: set.msgs[i], err: set.errs[i]})
		}
	}
	if len(failed) > 0 && set.lastErr == nil {
		set.lastErr = fmt.Errorf("no publish ack within %v", timeout)
	}
	return failed, set.lastErr, true
}

// outcome is whether copy i was stored, and where (0 if its ack named no
// sequence). Read it after wait.
func (s *copySet) outcome(i int) (stored bool, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stored[i], s.seqs[i]
}

// JetStream's error codes the copier tells apart: a message above the
// stream's max_msg_size (JSStreamMessageExceedsMaximumErr), and a
// Nats-Expected-Last-Subject-Sequence that is not the subject's last
// (JSStreamWrongLastSequenceErr), or that a clustered stream cannot check
// yet (JSStreamWrongLastSequenceConstantErr).
const (
	jsErrCodeMessageTooLarge   = 10054
	jsErrCodeWrongLastSequence = 10071
	jsErrCodeSubjectInFlight   = 10164
)

// errWrongLastSeq marks a copy refused because the copy before it is not
// the last of its subject: the stream lost it, or another process stored
// one since (order.go).
var errWrongLastSeq = errors.New("the copy before it is not the last of its subject")

// errInFlight marks a copy a clustered stream refused because another
// message of its subject was not applied yet: another publisher's, or the
// copy before it, whose ack the leader sends before it clears the subject.
// The same copy goes again at once.
var errInFlight = errors.New("another message of its subject is in flight")

// refusals reports whether the stream refused a failed copy for its
// expectation (wrongLast: its predecessor is not the subject's last), and
// whether every failed copy was refused only for a message of its subject
// still in flight (inFlight: publish the same again at once).
func refusals(failed []failedCopy) (wrongLast, inFlight bool) {
	inFlight = len(failed) > 0
	for _, f := range failed {
		wrongLast = wrongLast || errors.Is(f.err, errWrongLastSeq)
		inFlight = inFlight && errors.Is(f.err, errInFlight)
	}
	return wrongLast, inFlight
}

// pubAckSeq is the stream sequence a successful publish ack names, 0 if
// none reads. The ack is the server's JSON ({"stream":…,"seq":N,…}).
func pubAckSeq(ack []byte) uint64 {
	_, rest, ok := bytes.Cut(ack, []byte(`"seq":`))
	if !ok {
		return 0
	}
	rest = bytes.TrimLeft(rest, " ")
	var n uint64
	for _, b := range rest {
		if b < '0' || b > '9' || n > (1<<63)/10 {
			break
		}
		n = n*10 + uint64(b-'0')
	}
	return n
}

// errTooLarge marks a copy that can never be stored as it is: the server
// or the stream refuses its size. Publishing it again cannot help.
var errTooLarge = errors.New("message too large")

// isTooLarge reports whether a copy failed for its size.
func isTooLarge(err error) bool {
	return errors.Is(err, errTooLarge) || errors.Is(err, nats.ErrMaxPayload)
}

// pubAckPrefix starts every successful publish ack: the server encodes the
// error first (and only when there is one), then the stream.
var pubAckPrefix = []byte(`{"stream":`)

// pubAckError reads a JetStream publish ack: nil when the message is stored
// (or was already, a duplicate).
func pubAckError(m *nats.Msg) error {
	if len(m.Data) == 0 {
		// A status message: 503 when no stream takes the subject or JetStream
		// is unavailable.
		if st := m.Header.Get("Status"); st != "" {
			return fmt.Errorf("jetstream: status %s %s", st, m.Header.Get("Description"))
		}
		return errors.New("jetstream: empty publish ack")
	}
	if bytes.HasPrefix(m.Data, pubAckPrefix) {
		return nil
	}
	var ack struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Stream string `json:"stream"`
	}
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		return fmt.Errorf("jetstream: unreadable publish ack %q: %w", m.Data, err)
	}
	if ack.Error != nil {
		err := fmt.Errorf("jetstream: %s (status %d, error code %d)", ack.Error.Description, ack.Error.Code, ack.Error.ErrCode)
		switch ack.Error.ErrCode {
		case jsErrCodeMessageTooLarge:
			err = fmt.Errorf("%w: %w", errTooLarge, err)
		case jsErrCodeWrongLastSequence:
			err = fmt.Errorf("%w: %w", errWrongLastSeq, err)
		case jsErrCodeSubjectInFlight:
			err = fmt.Errorf("%w: %w", errInFlight, err)
		}
		return err
	}
	if ack.Stream == "" {
		return fmt.Errorf("jetstream: publish ack names no stream: %q", m.Data)
	}
	return nil
}
