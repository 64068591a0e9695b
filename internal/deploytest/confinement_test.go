package deploytest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/wire"
)

// ledgerStreams are the streams whose subjects no credential but the
// operators' may write through the server: each is where an answer aimed
// into the ledger would be stored. The workers' events are in LEDGER_IN, or
// in each principal's inbox.
func (s *authStack) ledgerStreams() []string {
	return append(s.inStreams(), wire.StreamLog, wire.StreamDLQ)
}

// everyStream is every stream and bucket of a ledger, for the JetStream
// requests a probe sends.
func (s *authStack) everyStream() []string {
	return append(s.ledgerStreams(), "KV_"+wire.BucketTasks, "KV_"+wire.BucketProjector, "KV_"+wire.BucketWitness,
		"KV_"+wire.BucketLeases, "KV_"+projector.RebuildBucket)
}

// confinee is one credential the generator writes, the subjects of the
// ledger it may write by design, and whose subjects it aims at.
type confinee struct {
	name string
	conn *userConn
	// own are the protected subjects' prefixes it writes by its role: the
	// ingest writes the log, dead letters and receipts.
	own []string
	// victim is the principal whose subjects its probes aim at.
	victim *workerSide
}

// No credential the generator writes, but the operators', can make a
// stored message land on ledger.in, ledger.log, ledger.dlq or a receipt
// subject. Each credential tries every way: a publish, and a request to
// every service endpoint, every JetStream API subject of every stream,
// every direct get and every bucket write, each with the protected
// subject as its reply; a push consumer delivering there, on every stream
// it may create consumers on; a pull request answered there; a scratch
// bucket that republishes there. Nothing may land, in LEDGER_IN (or each
// principal's inbox stream), LEDGER_LOG, LEDGER_DLQ, or any principal's
// receipts or reply inbox: a worker's
// lease request, lookup or publish ack aimed at another principal's
// receipts lands in its own account.
// Switch: put every worker principal in one account again (one
// LEDGER_WORKERS, as before); worker-a's lease replies and publish acks
// land on worker-b's receipts and inbox.
func (s *authStack) noReplyIntoTheLedger(t *testing.T) {
	who := []confinee{
		{name: "ingest", conn: s.ingestNC, own: []string{"ledger.log.", "ledger.dlq.", "ledger.receipt."}, victim: s.a},
		{name: "projector", conn: s.projectorNC, victim: s.a},
		{name: "worker-a", conn: s.a.conn, victim: s.b},
		{name: "worker-b", conn: s.b.conn, victim: s.a},
		{name: "reader dashboards", conn: s.reader, victim: s.a},
		{name: "reader audit", conn: s.audit, victim: s.a},
	}
	// The operators may publish everything in the ledger: that is their
	// role, not a confinement to test.
	require.NoError(t, s.admin.Publish(wire.Subjects{}.Receipt(s.a.holder), []byte(`{}`)))
	s.admin.requireNoErrors(t)

	// Each principal's receipts and its inbox, as its worker reads them.
	receipts := map[string]*nats.Subscription{}
	for _, w := range []*workerSide{s.a, s.b} {
		for _, subj := range []string{wire.Subjects{}.Receipt(w.holder), probeInbox(w)} {
			sub, err := w.conn.SubscribeSync(subj)
			require.NoError(t, err)
			receipts[subj] = sub
		}
	}
	s.settle(t)
	for _, c := range who {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			defer s.restore(t)
			for _, sub := range receipts { // what an earlier confinee was allowed to send
				for _, err := sub.NextMsg(0); err == nil; _, err = sub.NextMsg(0) {
				}
			}
			before := s.streamSeqs(t)
			for _, target := range s.targets(c) {
				s.aimAt(t, c, target)
			}
			s.settle(t)
			after := s.streamSeqs(t)
			for _, name := range s.ledgerStreams() {
				if c.owns(wire.Subjects{}.Log(0, "t")) && (name == wire.StreamLog || name == wire.StreamDLQ) {
					continue // the ingest writes these streams itself
				}
				require.Equalf(t, before[name], after[name], "%s made the server store in %s: %s", c.name, name,
					s.landed(t, name, before[name], after[name]))
			}
			for subj, sub := range receipts {
				if c.owns(subj) {
					continue
				}
				n, _, err := sub.Pending()
				require.NoError(t, err)
				if n > 0 {
					m, _ := sub.NextMsg(0)
					t.Fatalf("%s made %d messages land on %s, the first: %q", c.name, n, subj, m.Data)
				}
			}
		})
	}
}

// owns reports whether the confinee writes subject by its role.
func (c confinee) owns(subject string) bool {
	for _, p := range c.own {
		if strings.HasPrefix(subject, p) {
			return true
		}
	}
	return false
}

// targets are the protected subjects a confinee aims at: its victim's
// event and receipt subjects, a log copy and a dead letter of the victim's
// task; those it writes by its role are left out.
func (s *authStack) targets(c confinee) []string {
	p, task := c.victim.lease.Partition(), c.victim.task
	var out []string
	for _, subj := range []string{wire.Subjects{}.In(c.victim.holder, p, task), wire.Subjects{}.Log(p, task),
		wire.Subjects{}.DLQ(p, task), wire.Subjects{}.Receipt(c.victim.holder), probeInbox(c.victim)} {
		if !c.owns(subj) {
			out = append(out, subj)
		}
	}
	return out
}

// probeInbox is a subject in a worker's inbox that the probes aim at.
func probeInbox(w *workerSide) string { return wire.InboxPrefix(w.principal) + ".probe" }

// aimAt tries every way the confinee has of making the server, or a
// service of the ledger, send something to target.
func (s *authStack) aimAt(t *testing.T, c confinee, target string) {
	uc := c.conn
	send := func(subject string, body string) {
		require.NoError(t, uc.PublishRequest(subject, target, []byte(body)))
	}
	// A publish of its own.
	require.NoError(t, uc.Publish(target, []byte(`{"probe":true}`)))

	// The ledger's services, answered on target.
	p, task := c.victim.lease.Partition(), c.victim.task
	send(wire.Subjects{}.LeaseGet(), fmt.Sprintf(`{"partition":%d}`, p))
	send(wire.Subjects{}.TaskHead(), `{"task":"`+task+`"}`)
	for _, w := range []*workerSide{s.a, s.b} {
		send(wire.Subjects{}.Lease(wire.LeaseRenew, w.holder), fmt.Sprintf(`{"partition":%d,"generation":%d}`, w.lease.Partition(), w.lease.Generation()))
	}
	for _, op := range []string{"PING", "INFO", "STATS"} {
		send("$SRV."+op, "")
		send("$SRV."+op+"."+wire.ServiceName, "")
	}

	// JetStream's API and direct gets of every stream, and bucket writes.
	send("$JS.API.INFO", "")
	for _, st := range s.everyStream() {
		send("$JS.API.STREAM.INFO."+st, "")
		send("$JS.API.STREAM.MSG.GET."+st, `{"seq":1}`)
		send("$JS.API.DIRECT.GET."+st, `{"seq":1}`)
		send("$JS.API.CONSUMER.NAMES."+st, "")
	}
	send("$JS.API.DIRECT.GET.LEDGER_LOG."+wire.Subjects{}.Log(p, task), "")
	send("$JS.API.DIRECT.GET.KV_ledger_tasks.$KV.ledger_tasks."+task, "")
	send("$JS.API.DIRECT.GET.KV_ledger_witness.$KV.ledger_witness.gen-"+fmt.Sprint(p), "")
	for _, b := range []string{wire.BucketTasks, wire.BucketProjector, projector.RebuildBucket} {
		send("$KV."+b+".probe-"+s.mode, `{"probe":true}`)
	}
	// The ingest's own buckets: keys it never reads.
	send("$KV."+wire.BucketWitness+".probe-"+s.mode, "")
	send("$KV."+wire.BucketLeases+".probe-"+s.mode, "")

	// Pull requests of every consumer, answered on target.
	for _, st := range append(s.inStreams(), wire.StreamLog) {
		for _, name := range s.consumerNames(t, st) {
			send("$JS.API.CONSUMER.MSG.NEXT."+st+"."+name, `{"batch":1,"no_wait":true}`)
		}
	}

	// Push consumers delivering to target, on every stream, then gone.
	for _, st := range s.everyStream() {
		name := "probe-" + strings.ToLower(strings.ReplaceAll(st, "_", "-"))
		cfg := fmt.Sprintf(`{"stream_name":%q,"config":{"name":%q,"deliver_subject":%q,"ack_policy":"explicit","deliver_policy":"last","inactive_threshold":10000000000}}`, st, name, target)
		s.request(t, s.admin, "$JS.API.INFO", "") // keeps the order of the probes apparent in a trace
		require.NoError(t, uc.PublishRequest("$JS.API.CONSUMER.CREATE."+st+"."+name, uc.NewRespInbox(), []byte(cfg)))
	}
	// A stream update that republishes what it stores to target, and a
	// scratch bucket created anew to do the same.
	// (A wildcard source needs a wildcard destination: each republishes
	// one literal subject.)
	sources := map[string]string{wire.StreamDLQ: wire.Subjects{}.DLQ(p, task), wire.StreamLog: wire.Subjects{}.Log(p, task),
		"KV_" + wire.BucketWitness: "$KV." + wire.BucketWitness + ".probe-" + s.mode}
	for st, src := range sources {
		info, err := s.admin.js(t).Stream(s.ctx, st)
		require.NoError(t, err)
		cfg := info.CachedInfo().Config
		cfg.RePublish = &jetstream.RePublish{Source: src, Destination: target}
		body, err := json.Marshal(cfg)
		require.NoError(t, err)
		require.NoError(t, uc.PublishRequest("$JS.API.STREAM.UPDATE."+st, uc.NewRespInbox(), body))
	}
	// Something for such an update to republish: an operator's write to a
	// key of the ingest's bucket that the ingest never reads.
	_ = uc.Flush()
	s.request(t, s.admin, "$KV."+wire.BucketWitness+".probe-"+s.mode, `{"probe":true}`)
	rebuild := "KV_" + projector.RebuildBucket
	require.NoError(t, uc.PublishRequest("$JS.API.STREAM.DELETE."+rebuild, uc.NewRespInbox(), nil))
	_ = uc.Flush()
	body := fmt.Sprintf(`{"name":%q,"subjects":["$KV.%s.>"],"storage":"memory","max_msgs_per_subject":1,"allow_direct":true,"republish":{"src":">","dest":%q}}`,
		rebuild, projector.RebuildBucket, target)
	require.NoError(t, uc.PublishRequest("$JS.API.STREAM.CREATE."+rebuild, uc.NewRespInbox(), []byte(body)))
	_ = uc.Flush()
	send("$KV."+projector.RebuildBucket+".probe-"+s.mode, `{"probe":true}`)
	require.NoError(t, uc.Flush())
}

// settle waits for what the probes set going (pushes, republishes, the
// ingest's verdicts on whatever landed) to be done: until no stream of
// the ledger has changed for a second. A negative check cannot wait for
// its event; this wait bounds how late a landing may come and be missed.
func (s *authStack) settle(t *testing.T) {
	t.Helper()
	last, since := s.streamSeqs(t), time.Now()
	for time.Since(since) < time.Second {
		require.NoError(t, s.ctx.Err(), "the ledger's streams never settled")
		time.Sleep(100 * time.Millisecond)
		if now := s.streamSeqs(t); fmt.Sprint(now) != fmt.Sprint(last) {
			last, since = now, time.Now()
		}
	}
}

// streamSeqs are the last sequences of the ledger's streams.
func (s *authStack) streamSeqs(t *testing.T) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, name := range s.ledgerStreams() {
		out[name] = s.lastSeq(t, name)
	}
	return out
}

// landed describes what a stream stored between two sequences.
func (s *authStack) landed(t *testing.T, stream string, from, to uint64) string {
	t.Helper()
	st, err := s.admin.js(t).Stream(s.ctx, stream)
	require.NoError(t, err)
	var out []string
	for seq := from + 1; seq <= to && len(out) < 5; seq++ {
		m, err := st.GetMsg(s.ctx, seq)
		if err != nil {
			out = append(out, fmt.Sprintf("seq %d: %v", seq, err))
			continue
		}
		body := string(m.Data)
		if len(body) > 120 {
			body = body[:120] + "…"
		}
		out = append(out, fmt.Sprintf("seq %d on %s: %s", seq, m.Subject, body))
	}
	return strings.Join(out, "; ")
}

// consumerNames are the consumers of a stream, none if it does not exist.
func (s *authStack) consumerNames(t *testing.T, stream string) []string {
	t.Helper()
	st, err := s.admin.js(t).Stream(s.ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	require.NoError(t, err)
	var names []string
	lister := st.ConsumerNames(s.ctx)
	for n := range lister.Name() {
		names = append(names, n)
	}
	require.NoError(t, lister.Err())
	return names
}

// restore undoes what a probe may have changed, as an operator: the
// streams' definitions, the probes' consumers and the scratch bucket.
func (s *authStack) restore(t *testing.T) {
	js := s.admin.js(t)
	for _, st := range s.everyStream() {
		for _, n := range s.consumerNames(t, st) {
			if strings.HasPrefix(n, "probe-") {
				require.NoError(t, js.DeleteConsumer(s.ctx, st, n))
			}
		}
	}
	for _, name := range []string{wire.StreamDLQ, wire.StreamLog, "KV_" + wire.BucketWitness} {
		st, err := js.Stream(s.ctx, name)
		require.NoError(t, err)
		if cfg := st.CachedInfo().Config; cfg.RePublish != nil {
			cfg.RePublish = nil
			_, err := js.UpdateStream(s.ctx, cfg)
			require.NoError(t, err)
		}
	}
	if err := js.DeleteStream(s.ctx, "KV_"+projector.RebuildBucket); err != nil {
		require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	}
}

// The ingest's credential may create consumers on every inbox stream, and
// a push consumer delivers in its stream's account, beside the other
// inboxes, to any subject its creator names: one on worker-b's inbox could
// deliver worker-b's events onto worker-a's subjects. The server delivers
// only where someone subscribes (a stream's own subjects do not count), and
// no user is in LEDGER, which exports the inbox subjects as a service only:
// nothing lands, with the ingest stopped, its consumers deleted and an
// operator subscribed to ledger.in.>. The same consumer delivering to a
// subject that LEDGER exports to a subscriber does deliver, so the
// consumer is no dud.
func (s *authStack) noPushBetweenInboxes(t *testing.T) {
	from, into := s.inStreamOf(s.b.principal), s.inStreamOf(s.a.principal)
	s.ingest.Stop()
	for len(s.ingestNC.errs) > 0 { // the refusals of the probes before
		<-s.ingestNC.errs
	}
	js := s.ingestNC.js(t)
	for _, n := range s.consumerNames(t, from) {
		require.NoError(t, js.DeleteConsumer(s.ctx, from, n), "the ingest deletes its consumer %s", n)
	}
	watch, err := s.admin.SubscribeSync(wire.Subjects{}.InAll())
	require.NoError(t, err)
	s.admin.requireNoErrors(t)

	_, m := rawEvent(s.b.holder, s.b.lease.Partition(), s.b.task, s.b.lease.Generation(), 1000, `{"moved":true}`)
	_, err = s.b.conn.js(t).PublishMsg(s.ctx, m)
	require.NoError(t, err)
	before := s.lastSeq(t, into)
	push := func(name, deliver string) jetstream.Consumer {
		c, err := js.CreateConsumer(s.ctx, from, jetstream.ConsumerConfig{Name: name, DeliverSubject: deliver,
			AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
		require.NoError(t, err, "the ingest's credential may create a consumer on an inbox")
		return c
	}
	c := push("probe-move", wire.Subjects{}.In(s.a.holder, s.a.lease.Partition(), s.a.task))
	s.settle(t)
	require.Equal(t, before, s.lastSeq(t, into), "the ingest's push consumer moved worker-b's event into %s: %s", into,
		s.landed(t, into, before, s.lastSeq(t, into)))
	n, _, err := watch.Pending()
	require.NoError(t, err)
	require.Zero(t, n, "the push consumer's delivery reached the operator")
	info, err := c.Info(s.ctx)
	require.NoError(t, err)
	require.False(t, info.PushBound, "someone in LEDGER subscribes to worker-a's subjects")

	// The control: to the operators' inbox, which LEDGER exports to them.
	require.NoError(t, js.DeleteConsumer(s.ctx, from, "probe-move"))
	control := inboxOf("ledgerctl", "ledgerctl") + ".probe"
	got, err := s.admin.SubscribeSync(control)
	require.NoError(t, err)
	require.NoError(t, s.admin.Flush())
	push("probe-control", control)
	delivered, err := got.NextMsgWithContext(s.ctx)
	require.NoError(t, err, "a push consumer on %s delivered nothing where someone subscribes", from)
	require.JSONEq(t, `{"moved":true}`, string(delivered.Data))
	s.ingestNC.requireNoErrors(t)
}
