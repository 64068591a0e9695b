package deploytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// TestAuthorizedDeployments runs the ledger in each deployment `ledgerctl
// auth` writes (static nkey users; operator mode with JWTs), on an embedded
// server loaded from the generated files: the real ingest and projector
// (PostgreSQL LOGIN users in their group roles), worker SDK clients of two
// principals, two readers and the operators' ledgerctl user. Honest flows
// must work end to end, and every attack of the authorization issue, tried
// from the worker's (or reader's) side, must be refused, by a permissions
// violation from the server or by the ledger's verdict. docs/security.md
// names the subtest that refuses each attack. Operator mode runs with an
// inbox stream per principal (`ledgerctl auth jwt -inboxes`, `streams apply
// -principals`), static mode with the one LEDGER_IN: the permissions are
// the same code in both, so each stack tests one of the two.
// Switch: leave the inboxes out of the ingest's permissions (roles.go,
// inStreams returning LEDGER_IN only); in operator mode the ingest is
// refused its consumers and nothing commits.
func TestAuthorizedDeployments(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{modeStatic, modeJWT} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := startAuthStack(t, mode, mode == modeJWT)
			// Honest flows first: the attacks below look at what they wrote.
			t.Run("honest_flows_work_end_to_end", s.honestFlows)
			t.Run("attack_1_events_as_another_principal", s.eventsAsAnother)
			t.Run("attack_2_lease_ops_as_another_principal", s.leaseOpsAsAnother)
			t.Run("attack_3_login_as_another_principal", s.loginAsAnother)
			t.Run("attack_4_reading_inboxes_and_service_deliveries", s.readingInboxes)
			t.Run("attack_5_reader_consumers_delivering_elsewhere", s.readerConsumers)
			t.Run("reply_subjects_stay_in_the_requesters_account", s.replySubjects)
			t.Run("workers_and_services_are_confined", s.confined)
			t.Run("readers_see_what_repair_writes", s.readersSeeRepairs)
			t.Run("operators_list_and_apply_every_stream_and_bucket", s.operatorsListAndApply)
			t.Run("projector_reads_the_witnessed_timeline", s.projectorReadsTheWitnessedTimeline)
			if mode == modeJWT {
				t.Run("minted_worker_gets_its_principals_permissions", s.mintedWorker)
			}
			// Last: its pull requests take deliveries from the services.
			t.Run("no_reply_aimed_into_the_ledger", s.noReplyIntoTheLedger)
			if s.inboxes {
				// After everything: it stops the ingest.
				t.Run("ingest_cannot_move_events_between_inboxes", s.noPushBetweenInboxes)
			}
		})
	}
}

// gapWindow is the stack's ingest gap window.
const gapWindow = time.Second

// authStack is a running ledger under a generated authorization.
type authStack struct {
	*authDeployment
	root        *testing.T // what outlives a subtest is cleaned up with it
	ctx         context.Context
	db          *dbtest.DB
	log         *slog.Logger
	store       *fence.Store
	ingestNC    *userConn
	projectorNC *userConn
	ingest      *ingest.Service
	admin       *userConn // the ledgerctl user
	a, b        *workerSide
	reader      *userConn // reader dashboards
	audit       *userConn // reader audit
}

// workerSide is one principal's worker: an SDK client holding a lease,
// and the raw connection under it for what the SDK would never send.
type workerSide struct {
	principal, holder string
	conn              *userConn
	client            *worker.Client
	lease             *worker.Lease
	task              string
	receipts          *nats.Subscription // the holder's receipts, raw
	seen              map[string]wire.Receipt
}

func startAuthStack(t *testing.T, mode string, inboxes bool) *authStack {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	d := newAuthDeployment(t, mode, inboxes)
	db := dbtest.New(t)
	s := &authStack{authDeployment: d, root: t, ctx: ctx, db: db, log: ledgertest.Logger()}
	var err error
	s.store, err = fence.New(openPool(t, loginUser(t, db, roleIngest)), fence.Config{})
	require.NoError(t, err)
	s.ingestNC = d.connect(t, "ingest", "ingest")
	s.startIngest(t)
	if inboxes {
		// An operator moves the running ledger to inboxes, as
		// docs/operations.md says: the empty LEDGER_IN, which the ingest
		// made with its partitions, gives way to an inbox per principal
		// with the same partitions. The ingest finds them within a beat.
		runLedgerctl(t, d.ledgerctl, d.env("ledgerctl", "ledgerctl"), "streams", "apply",
			"-principals", strings.Join(authWorkers, ","))
	}

	s.projectorNC = d.connect(t, "projector", "projector")
	proj, err := projector.New(projector.Config{}, projector.Deps{NC: s.projectorNC.Conn,
		Pool: openPool(t, loginUser(t, db, roleProjector)), Logger: s.log})
	require.NoError(t, err)
	// As `projector -rebuild` does: it builds in a scratch bucket, swaps
	// it into ledger_tasks and recreates its consumer.
	require.NoError(t, proj.Rebuild(ctx, nil))
	require.NoError(t, proj.Start(ctx))
	t.Cleanup(proj.Stop)

	s.admin = d.connect(t, "ledgerctl", "ledgerctl")
	s.reader = d.connect(t, "reader", "dashboards")
	s.audit = d.connect(t, "reader", "audit")
	s.a = s.newWorker(t, "worker-a", "report")
	s.b = s.newWorker(t, "worker-b", "invoice", s.a.lease.Partition())
	return s
}

func (s *authStack) startIngest(t *testing.T) {
	// A short gap window, so that a version that never gets its
	// predecessor is judged within the test.
	in, err := ingest.New(ingest.Config{GapWindow: gapWindow}, ingest.Deps{NC: s.ingestNC.Conn, Store: s.store, Logger: s.log})
	require.NoError(t, err)
	require.NoError(t, in.Start(s.ctx))
	s.root.Cleanup(in.Stop)
	s.ingest = in
}

// newWorker starts principal's worker on a task of a partition none of the
// other workers holds.
func (s *authStack) newWorker(t *testing.T, principal, taskPrefix string, avoid ...int) *workerSide {
	return s.newWorkerInstance(t, principal, "1", taskPrefix, avoid...)
}

// newWorkerInstance is newWorker with the holder's instance.
func (s *authStack) newWorkerInstance(t *testing.T, principal, instance, taskPrefix string, avoid ...int) *workerSide {
	w := &workerSide{principal: principal, holder: wire.Holder(principal, instance), conn: s.connect(t, "worker", principal),
		seen: map[string]wire.Receipt{}}
	for i := 0; ; i++ {
		w.task = fmt.Sprintf("%s-%d", taskPrefix, i)
		if !slices.Contains(avoid, wire.PartitionOf(w.task, wire.PartitionsDefault)) {
			break
		}
	}
	var err error
	w.receipts, err = w.conn.SubscribeSync(wire.Subjects{}.Receipt(w.holder))
	require.NoError(t, err)
	w.client, err = worker.New(w.conn.Conn, worker.Config{Holder: w.holder, Logger: s.log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.client.Close() })
	w.lease, err = w.client.Acquire(s.ctx, w.client.PartitionOf(w.task))
	require.NoError(t, err)
	return w
}

// requireServicesUnrefused fails at once, with the server's words, when
// the server refused the ingest or the projector anything: a permission
// the generator forgot would otherwise show only as a wait that never ends.
func (s *authStack) requireServicesUnrefused(t *testing.T) {
	t.Helper()
	for name, uc := range map[string]*userConn{"ingest": s.ingestNC, "projector": s.projectorNC} {
		select {
		case err := <-uc.errs:
			t.Fatalf("the server refused the %s: %v", name, err)
		default:
		}
	}
}

// commit publishes through the SDK and requires the event committed.
func (s *authStack) commit(t *testing.T, w *workerSide, typ, payload string) wire.Receipt {
	t.Helper()
	p, err := w.lease.Publish(s.ctx, w.task, typ, []byte(payload))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	r, err := p.Receipt(ctx)
	if err != nil {
		s.requireServicesUnrefused(t)
	}
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, r.Verdict, "receipt %+v", r)
	return r
}

// rawEvent is an event as any NATS client would publish it.
func rawEvent(holder string, partition int, task string, gen, version int64, payload string) (string, *nats.Msg) {
	id := ledgertest.NewID()
	return id, wire.Subjects{}.InboundMsg(wire.Inbound{ID: id, Partition: partition, Task: task, Holder: holder,
		Generation: gen, Version: version, Type: "raw", Payload: []byte(payload)})
}

// awaitReceipt waits on the worker's raw receipt subscription for the
// event's receipt. Receipts come in any order: the others are kept for
// their own wait.
func (s *authStack) awaitReceipt(t *testing.T, w *workerSide, eventID string) wire.Receipt {
	t.Helper()
	for {
		if r, ok := w.seen[eventID]; ok {
			return r
		}
		s.requireServicesUnrefused(t)
		m, err := w.receipts.NextMsg(250 * time.Millisecond)
		if errors.Is(err, nats.ErrTimeout) && s.ctx.Err() == nil {
			continue
		}
		require.NoError(t, err, "no receipt for %s", eventID)
		rs, err := wire.ReceiptsOf(m.Header, m.Data)
		require.NoError(t, err)
		for _, r := range rs {
			w.seen[r.EventID] = r
		}
	}
}

// request sends a JSON request and returns the reply's body.
func (s *authStack) request(t *testing.T, uc *userConn, subject, body string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	m, err := uc.RequestWithContext(ctx, subject, []byte(body))
	require.NoError(t, err, "request %s", subject)
	return m.Data
}

// lease is the current lease of a partition, asked by worker w.
func (s *authStack) lease(t *testing.T, w *workerSide, partition int) (holder string, generation int64, valid bool) {
	t.Helper()
	var r struct {
		Holder     string `json:"holder"`
		Generation int64  `json:"generation"`
		Valid      bool   `json:"valid"`
	}
	require.NoError(t, json.Unmarshal(s.request(t, w.conn, "ledger.lease.get", fmt.Sprintf(`{"partition":%d}`, partition)), &r))
	return r.Holder, r.Generation, r.Valid
}

// head is a task's committed version.
func (s *authStack) head(t *testing.T, w *workerSide, task string) int64 {
	t.Helper()
	var r wire.TaskHeadReply
	require.NoError(t, json.Unmarshal(s.request(t, w.conn, "ledger.task.head", `{"task":"`+task+`"}`), &r))
	return r.Version
}

// projection is a task's value in ledger_tasks, as a reader reads it: a
// direct get of the key, with the stock NATS request/reply.
type projectionValue struct {
	Task    string          `json:"task"`
	Version int64           `json:"version"`
	Status  string          `json:"status"`
	Data    json.RawMessage `json:"data"`
	Seq     uint64          // the bucket stream's sequence of the value
}

func (s *authStack) directGet(t *testing.T, uc *userConn, key string) (projectionValue, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	m, err := uc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_ledger_tasks.$KV.ledger_tasks."+key, nil)
	require.NoError(t, err)
	if m.Header.Get("Status") == "404" {
		return projectionValue{}, false
	}
	require.Empty(t, m.Header.Get("Status"), "direct get of %s: %s %s", key, m.Header.Get("Status"), m.Header.Get("Description"))
	var v projectionValue
	require.NoError(t, json.Unmarshal(m.Data, &v))
	v.Seq, err = strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
	require.NoError(t, err)
	return v, true
}

// waitProjection polls a reader's direct get until the task's projection
// reaches version.
func (s *authStack) waitProjection(t *testing.T, uc *userConn, task string, version int64) projectionValue {
	t.Helper()
	for {
		if v, ok := s.directGet(t, uc, task); ok && v.Version >= version {
			return v
		}
		s.requireServicesUnrefused(t)
		select {
		case <-s.ctx.Done():
			t.Fatalf("the projection of %s did not reach version %d", task, version)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// lastSeq is the last sequence of a stream, as the operators' user sees it.
func (s *authStack) lastSeq(t *testing.T, stream string) uint64 {
	t.Helper()
	st, err := s.admin.js(t).Stream(s.ctx, stream)
	require.NoError(t, err)
	return st.CachedInfo().State.LastSeq
}

func (s *authStack) honestFlows(t *testing.T) {
	// Readers follow changes on the bucket's subjects from the start.
	changes, err := s.reader.SubscribeSync("$KV.ledger_tasks.>")
	require.NoError(t, err)
	s.reader.requireNoErrors(t)

	// With inboxes, each principal's events wait in its own stream.
	aIn, bIn := s.inStreamOf(s.a.principal), s.inStreamOf(s.b.principal)
	aSeq, bSeq := s.lastSeq(t, aIn), s.lastSeq(t, bIn)
	first := s.commit(t, s.a, "running", `{"status":"running"}`)
	require.EqualValues(t, 1, first.Version)
	s.commit(t, s.b, "running", `{"status":"billing"}`)
	if s.inboxes {
		require.Equal(t, aSeq+1, s.lastSeq(t, aIn), "%s stored worker-a's event only", aIn)
		require.Equal(t, bSeq+1, s.lastSeq(t, bIn), "%s stored worker-b's event only", bIn)
	}

	// An early version waits at the ingest for the missing one (the ingest
	// looks into LEDGER_IN for it).
	early := "early-" + s.a.task
	gen, p := s.a.lease.Generation(), s.a.lease.Partition()
	id2, m2 := rawEvent(s.a.holder, p, early, gen, 2, `{"step":2}`)
	id1, m1 := rawEvent(s.a.holder, p, early, gen, 1, `{"step":1}`)
	for _, m := range []*nats.Msg{m2, m1} {
		_, err := s.a.conn.js(t).PublishMsg(s.ctx, m)
		require.NoError(t, err)
	}
	require.Equal(t, wire.VerdictCommitted, s.awaitReceipt(t, s.a, id1).Verdict)
	require.Equal(t, wire.VerdictCommitted, s.awaitReceipt(t, s.a, id2).Verdict)

	// A version whose predecessor never comes is judged gap once the
	// window has passed and the ingest has looked into LEDGER_IN for it.
	id, m := rawEvent(s.a.holder, p, "lonely-"+s.a.task, gen, 2, `{"step":2}`)
	_, err = s.a.conn.js(t).PublishMsg(s.ctx, m)
	require.NoError(t, err)
	r := s.awaitReceipt(t, s.a, id)
	require.Equal(t, wire.VerdictGap, r.Verdict, "receipt %+v", r)

	// A gap in the log is marked in the projector's own bucket until it
	// closes (an operator forges the copies: its user may).
	marks := s.lastSeq(t, "KV_ledger_projector")
	gapTask := "gap-" + s.a.task
	copyOf := func(version int64) *nats.Msg {
		return wire.Subjects{}.LogMsg(&wire.LogCopy{Seq: 1_000_000 + version, EventID: ledgertest.NewID(), Partition: p,
			Task: gapTask, Version: version, Type: "forged", Holder: s.a.holder, Generation: gen,
			CommittedAt: time.Now(), Payload: []byte(fmt.Sprintf(`{"v":%d}`, version))})
	}
	_, err = s.admin.js(t).PublishMsg(s.ctx, copyOf(2))
	require.NoError(t, err)
	for s.lastSeq(t, "KV_ledger_projector") == marks {
		s.requireServicesUnrefused(t)
		require.NoError(t, s.ctx.Err(), "no open-gap marker was written")
		time.Sleep(20 * time.Millisecond)
	}
	_, err = s.admin.js(t).PublishMsg(s.ctx, copyOf(1))
	require.NoError(t, err)
	s.waitProjection(t, s.reader, gapTask, 2)
	// The forged copies are of commits the database never had: an ingest
	// would take them for acknowledged commits the database forgot, and
	// commit nothing more. The operator who forged them removes them.
	logStream, err := s.admin.js(t).Stream(s.ctx, wire.StreamLog)
	require.NoError(t, err)
	for _, v := range []int64{1, 2} {
		m, err := logStream.GetLastMsgForSubject(s.ctx, wire.Subjects{}.Log(p, gapTask))
		require.NoError(t, err, "version %d's forged copy", v)
		require.NoError(t, logStream.DeleteMsg(s.ctx, m.Sequence))
	}

	// A restarted ingest finds the last copy of the task in LEDGER_LOG.
	s.ingest.Stop()
	s.startIngest(t)
	s.commit(t, s.a, "completed", `{"status":"completed","url":"s3://reports/7.pdf"}`)

	// A reader gets the projection with a direct get of its key...
	v := s.waitProjection(t, s.reader, s.a.task, 2)
	require.Equal(t, s.a.task, v.Task)
	require.Equal(t, "completed", v.Status)
	require.JSONEq(t, `{"status":"completed","url":"s3://reports/7.pdf"}`, string(v.Data))
	// ...and followed each change on the bucket's subjects.
	for {
		m, err := changes.NextMsgWithContext(s.ctx)
		require.NoError(t, err, "the change to version 2 of %s did not reach the reader", s.a.task)
		var cv projectionValue
		if m.Subject == "$KV.ledger_tasks."+s.a.task && json.Unmarshal(m.Data, &cv) == nil && cv.Version == 2 {
			require.Equal(t, "completed", cv.Status)
			break
		}
	}
	s.reader.requireNoErrors(t)

	// Operators: the lease service answers its inbox, and ledgerctl works
	// with its credentials and default inbox prefix.
	info := s.request(t, s.admin, "$SRV.INFO.ledger", "")
	require.Contains(t, string(info), `"name":"ledger"`)
	out := runLedgerctl(t, s.ledgerctl, s.env("ledgerctl", "ledgerctl"), "streams", "apply", "-json")
	require.Contains(t, out, `"stream":"LEDGER_LOG"`)
	// Through the imports of their account, operators read the dead
	// letters and the log, each in its own account.
	out = runLedgerctl(t, s.ledgerctl, s.env("ledgerctl", "ledgerctl"), "dlq", "list", "-json")
	require.Contains(t, out, "lonely-"+s.a.task)
	out = runLedgerctl(t, s.ledgerctl, s.env("ledgerctl", "ledgerctl"), "tail", "-n", "1", "-task", s.a.task)
	require.Contains(t, out, s.a.task)
	// verify reads the consumers of every inbox: a stream it may not read
	// is an error, and it exits 1 on a finding.
	runLedgerctl(t, s.ledgerctl, append(s.env("ledgerctl", "ledgerctl"), "DATABASE_URL="+loginUser(t, s.db, roleOperator)),
		"verify", "-kinds", "consumer")

	// Nothing the services did on the way was refused by the server.
	s.ingestNC.requireNoErrors(t)
	s.projectorNC.requireNoErrors(t)
	s.a.conn.requireNoErrors(t)
	s.b.conn.requireNoErrors(t)
	s.admin.requireNoErrors(t)
}

// Attack 1: worker-b published an event as worker-a with worker-a's
// generation, and it was committed.
func (s *authStack) eventsAsAnother(t *testing.T) {
	before := s.head(t, s.a, s.a.task)
	gen, p := s.a.lease.Generation(), s.a.lease.Partition()

	// On worker-a's subject: the server refuses the publish.
	_, m := rawEvent(s.a.holder, p, s.a.task, gen, before+1, `{"by":"worker-b"}`)
	require.NoError(t, s.b.conn.PublishMsg(m))
	s.b.conn.requireDenied(t, m.Subject)

	// On its own subject, naming worker-a in Ledger-Holder: invalid.
	id, m := rawEvent(s.b.holder, p, s.a.task, gen, before+1, `{"by":"worker-b"}`)
	m.Header.Set(wire.HeaderHolder, s.a.holder)
	_, err := s.b.conn.js(t).PublishMsg(s.ctx, m)
	require.NoError(t, err)
	r := s.awaitReceipt(t, s.b, id)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	require.Equal(t, wire.ReasonHolderMismatch, r.Reason)

	// On its own subject with worker-a's generation: the task is
	// worker-a's, and the fence refuses it as well.
	require.Positive(t, before, "worker-a's task exists")
	id, m = rawEvent(s.b.holder, p, s.a.task, gen, before+1, `{"by":"worker-b"}`)
	_, err = s.b.conn.js(t).PublishMsg(s.ctx, m)
	require.NoError(t, err)
	r = s.awaitReceipt(t, s.b, id)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	require.Equal(t, wire.ReasonNotOwner, r.Reason)
	// On a task of its own under worker-a's lease: the fence.
	id, m = rawEvent(s.b.holder, p, s.b.task+"-x", gen, 1, `{"by":"worker-b"}`)
	_, err = s.b.conn.js(t).PublishMsg(s.ctx, m)
	require.NoError(t, err)
	r = s.awaitReceipt(t, s.b, id)
	require.Equal(t, wire.VerdictStale, r.Verdict)
	require.Equal(t, wire.ReasonNotHolder, r.Reason)

	require.Equal(t, before, s.head(t, s.a, s.a.task), "nothing of worker-b's was committed to worker-a's task")
}

// Attack 2: worker-b acquired worker-a's valid lease "as worker-a", and
// renew and release took the holder from the body the same way.
func (s *authStack) leaseOpsAsAnother(t *testing.T) {
	p, gen := s.a.lease.Partition(), s.a.lease.Generation()
	bodies := map[string]string{
		wire.LeaseAcquire: fmt.Sprintf(`{"partition":%d}`, p),
		wire.LeaseRenew:   fmt.Sprintf(`{"partition":%d,"generation":%d}`, p, gen),
		wire.LeaseRelease: fmt.Sprintf(`{"partition":%d,"generation":%d}`, p, gen),
	}
	for _, op := range []string{wire.LeaseAcquire, wire.LeaseRenew, wire.LeaseRelease} {
		// On worker-a's subject: the server refuses the request.
		subj := wire.Subjects{}.Lease(op, s.a.holder)
		require.NoError(t, s.b.conn.PublishRequest(subj, s.b.conn.NewRespInbox(), []byte(bodies[op])))
		s.b.conn.requireDenied(t, subj)

		// On its own subject with worker-a in the body: invalid.
		body := bodies[op][:len(bodies[op])-1] + `,"holder":"` + s.a.holder + `"}`
		var reply wire.ErrorReply
		require.NoError(t, json.Unmarshal(s.request(t, s.b.conn, wire.Subjects{}.Lease(op, s.b.holder), body), &reply))
		require.Equalf(t, wire.ErrCodeInvalid, reply.Error, "%s with worker-a in the body: %+v", op, reply)
	}

	holder, now, valid := s.lease(t, s.a, p)
	require.Equal(t, s.a.holder, holder)
	require.Equal(t, gen, now, "the generation did not move")
	require.True(t, valid)
	require.NoError(t, s.a.lease.Context().Err(), "worker-a was not fenced out")
	s.commit(t, s.a, "running", `{"status":"still mine"}`)
}

// Attack 3: worker-b logged in as worker-a (the workers shared a password)
// and read worker-a's receipts.
func (s *authStack) loginAsAnother(t *testing.T) {
	// There are no passwords: no user/password login, shared or not.
	for _, user := range []string{"worker-a", "ingest"} {
		_, err := nats.Connect(s.srv.URL(), nats.UserInfo(user, "worker-test-secret"), nats.MaxReconnects(0))
		require.ErrorIs(t, err, nats.ErrAuthorization, "user/password login as %s", user)
	}
	_, err := nats.Connect(s.srv.URL(), nats.MaxReconnects(0))
	require.ErrorIs(t, err, nats.ErrAuthorization, "anonymous login")

	// A key of worker-b's own making is no one's: as a bare nkey, or with
	// a JWT that claims the name worker-a, signed by a key of its own.
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	signer, err := nkeys.CreateAccount()
	require.NoError(t, err)
	uc := jwt.NewUserClaims(pub)
	uc.Name = "worker-a"
	tok, err := uc.Encode(signer)
	require.NoError(t, err)
	for what, opt := range map[string]nats.Option{
		"a bare nkey":     nats.Nkey(pub, kp.Sign),
		"a self-made JWT": nats.UserJWT(func() (string, error) { return tok, nil }, kp.Sign),
	} {
		_, err = nats.Connect(s.srv.URL(), opt, nats.MaxReconnects(0))
		require.ErrorIs(t, err, nats.ErrAuthorization, "%s of worker-b's making", what)
	}

	// With its own credentials, worker-b cannot read worker-a's receipts.
	var subs []*nats.Subscription
	for _, subj := range []string{"ledger.receipt.worker-a.>", "ledger.receipt.worker-a.1", "ledger.receipt.>"} {
		sub, err := s.b.conn.SubscribeSync(subj)
		require.NoError(t, err)
		s.b.conn.requireDenied(t, subj)
		subs = append(subs, sub)
	}
	r := s.commit(t, s.a, "running", `{"status":"receipt for worker-a only"}`)
	for _, sub := range subs {
		n, _, err := sub.Pending()
		require.NoError(t, err)
		require.Zerof(t, n, "worker-b read worker-a's receipt %+v", r)
	}
}

// Attack 4: worker-b subscribed to _INBOX.> and read worker-a's payloads on
// their way to the ingest (pull deliveries of LEDGER_IN) and to the
// projector (LEDGER_LOG).
func (s *authStack) readingInboxes(t *testing.T) {
	subjects := []string{">", "_INBOX.>", "_INBOX.worker-a.>", "_INBOX_ingest.>", "_INBOX_projector.>", "_INBOX_ledgerctl.>"}
	who := map[string]*userConn{"worker-b": s.b.conn, "reader dashboards": s.reader, "reader audit": s.audit}
	var subs []*nats.Subscription
	for name, uc := range who {
		for _, subj := range subjects {
			sub, err := uc.SubscribeSync(subj)
			require.NoError(t, err)
			uc.requireDenied(t, subj)
			subs = append(subs, sub)
		}
		t.Logf("%s: every inbox but its own refused", name)
	}
	// Not even the operators read the services' deliveries.
	for _, subj := range []string{"_INBOX.>", "_INBOX_ingest.>", "_INBOX_projector.>"} {
		sub, err := s.admin.SubscribeSync(subj)
		require.NoError(t, err)
		s.admin.requireDenied(t, subj)
		subs = append(subs, sub)
	}

	marker := ledgertest.NewID()
	r := s.commit(t, s.a, "running", `{"marker":"`+marker+`"}`)
	s.waitProjection(t, s.reader, s.a.task, r.Version) // the projector got it too
	for _, sub := range subs {
		n, _, err := sub.Pending()
		require.NoError(t, err)
		require.Zerof(t, n, "%s received a message", sub.Subject)
	}
}

// Attack 5: a read-only user created a KV consumer whose deliver subject
// was ledger.receipt.worker-a, and another that delivered to
// ledger.lease.renew.
func (s *authStack) readerConsumers(t *testing.T) {
	for _, deliver := range []string{"ledger.receipt.worker-a.1", "ledger.lease.renew.worker-a.1"} {
		cfg := `{"stream_name":"KV_ledger_tasks","config":{"deliver_subject":"` + deliver + `","ack_policy":"none","deliver_policy":"all"}}`
		for _, subj := range []string{
			"$JS.API.CONSUMER.CREATE.KV_ledger_tasks",
			"$JS.API.CONSUMER.CREATE.KV_ledger_tasks.spy",
			"$JS.API.CONSUMER.CREATE.KV_ledger_tasks.spy.$KV.ledger_tasks.>",
			"$JS.API.CONSUMER.DURABLE.CREATE.KV_ledger_tasks.spy",
		} {
			require.NoError(t, s.reader.PublishRequest(subj, s.reader.NewRespInbox(), []byte(cfg)))
			s.reader.requireDenied(t, subj)
		}
	}

	st, err := s.admin.js(t).Stream(s.ctx, "KV_ledger_tasks")
	require.NoError(t, err)
	require.Zero(t, st.CachedInfo().State.Consumers, "the bucket has a consumer")
}

// A client names any reply subject, and the server (publish acks, direct
// gets) and the lease service answer there without a permission check. In
// one account that let a worker overwrite a projection with its publish ack,
// and a reader copy one projection over another; across accounts the
// answer lands in the requester's own account.
func (s *authStack) replySubjects(t *testing.T) {
	ap, bp := s.a.lease.Partition(), s.b.lease.Partition()
	before, ok := s.directGet(t, s.reader, s.a.task)
	require.True(t, ok)
	bIn, aIn := s.inStreamOf(s.b.principal), s.inStreamOf(s.a.principal)
	kvSeq, logSeq, inSeq, aInSeq := s.lastSeq(t, "KV_ledger_tasks"), s.lastSeq(t, "LEDGER_LOG"), s.lastSeq(t, bIn), s.lastSeq(t, aIn)
	aGen := s.a.lease.Generation()

	// worker-b's own events (stale: a generation it does not hold), each
	// with a reply subject aimed at something of worker-a's.
	targets := []string{
		"$KV.ledger_tasks." + s.a.task,
		wire.Subjects{}.Log(ap, s.a.task),
		wire.Subjects{}.In(s.a.holder, ap, s.a.task),
		wire.Subjects{}.Lease(wire.LeaseRelease, s.a.holder),
	}
	var ids []string
	for _, to := range targets {
		id, m := rawEvent(s.b.holder, bp, s.b.task, s.b.lease.Generation()+1000, 1000, `{"junk":true}`)
		m.Reply = to
		require.NoError(t, s.b.conn.PublishMsg(m))
		ids = append(ids, id)
	}
	// A lease request whose answer is aimed at worker-a's release: the
	// lease reply would be a valid release of worker-a's lease body.
	require.NoError(t, s.b.conn.PublishRequest("ledger.lease.get", wire.Subjects{}.Lease(wire.LeaseRelease, s.a.holder),
		[]byte(fmt.Sprintf(`{"partition":%d}`, ap))))
	for _, id := range ids {
		require.Equal(t, wire.VerdictStale, s.awaitReceipt(t, s.b, id).Verdict)
	}
	// A last event whose ack worker-b receives: everything before it was
	// stored and judged.
	id, m := rawEvent(s.b.holder, bp, s.b.task, s.b.lease.Generation()+1000, 1000, `{"junk":"last"}`)
	ack, err := s.b.conn.js(t).PublishMsg(s.ctx, m)
	require.NoError(t, err)
	s.awaitReceipt(t, s.b, id)

	require.Equal(t, inSeq+uint64(len(targets))+1, ack.Sequence, "%s stored only worker-b's own events", bIn)
	require.Equal(t, ack.Sequence, s.lastSeq(t, bIn))
	if aIn != bIn {
		require.Equal(t, aInSeq, s.lastSeq(t, aIn), "a publish ack reached worker-a's inbox")
	}
	require.Equal(t, logSeq, s.lastSeq(t, "LEDGER_LOG"), "a publish ack reached the committed log")
	require.Equal(t, kvSeq, s.lastSeq(t, "KV_ledger_tasks"), "a publish ack reached the projections")
	after, ok := s.directGet(t, s.reader, s.a.task)
	require.True(t, ok)
	require.Equal(t, before, after, "worker-a's projection changed")
	holder, gen, valid := s.lease(t, s.a, ap)
	require.Equal(t, s.a.holder, holder)
	require.Equal(t, aGen, gen)
	require.True(t, valid, "worker-a's lease was released by a redirected reply")

	// A reader's direct get aimed at another key, watched by the other
	// reader.
	spoofed := "spoofed-" + s.mode
	changes, err := s.audit.SubscribeSync("$KV.ledger_tasks.>")
	require.NoError(t, err)
	s.audit.requireNoErrors(t)
	require.NoError(t, s.reader.PublishRequest("$JS.API.DIRECT.GET.KV_ledger_tasks.$KV.ledger_tasks."+s.a.task,
		"$KV.ledger_tasks."+spoofed, nil))
	s.directGet(t, s.reader, s.a.task) // a round trip after it
	require.Equal(t, kvSeq, s.lastSeq(t, "KV_ledger_tasks"), "a reader wrote into the bucket")
	_, found := s.directGet(t, s.admin, spoofed)
	require.False(t, found, "a reader created a projection")
	// The audit reader's next change is a real one.
	r := s.commit(t, s.a, "running", `{"status":"real change"}`)
	m, err = changes.NextMsgWithContext(s.ctx)
	require.NoError(t, err)
	require.Equal(t, "$KV.ledger_tasks."+s.a.task, m.Subject, "another reader saw a redirected reply")
	var v projectionValue
	require.NoError(t, json.Unmarshal(m.Data, &v))
	require.Equal(t, r.Version, v.Version)
}

// What the static configuration refused before this issue still holds in
// both modes, and the services' JetStream rights are their own streams'.
func (s *authStack) confined(t *testing.T) {
	for _, subj := range []string{"ledger.log.3.t", "ledger.dlq.3.t", "ledger.receipt.worker-b.1", "$KV.ledger_tasks.t",
		"$JS.API.STREAM.PURGE.LEDGER_IN", "$JS.API.STREAM.DELETE.LEDGER_LOG", "$JS.API.CONSUMER.CREATE.LEDGER_IN"} {
		require.NoError(t, s.a.conn.PublishRequest(subj, s.a.conn.NewRespInbox(), []byte(`{}`)))
		s.a.conn.requireDenied(t, subj)
	}
	for _, subj := range []string{"$KV.ledger_tasks.t", "$JS.API.STREAM.INFO.LEDGER_IN", "$JS.API.DIRECT.GET.LEDGER_LOG.ledger.log.3.t"} {
		require.NoError(t, s.reader.PublishRequest(subj, s.reader.NewRespInbox(), []byte(`{}`)))
		s.reader.requireDenied(t, subj)
	}
	// Nor may a worker touch its own inbox's stream.
	for _, st := range s.inStreams() {
		for _, subj := range []string{"$JS.API.STREAM.PURGE." + st, "$JS.API.STREAM.DELETE." + st, "$JS.API.CONSUMER.CREATE." + st + ".spy"} {
			require.NoError(t, s.a.conn.PublishRequest(subj, s.a.conn.NewRespInbox(), []byte(`{}`)))
			s.a.conn.requireDenied(t, subj)
		}
	}
	// Neither service can delete or purge a stream of the ledger, an
	// inbox included, nor the projections (a rebuild builds in a scratch
	// bucket of its own).
	inboxOps := []string{}
	for _, st := range s.inStreams() {
		inboxOps = append(inboxOps, "$JS.API.STREAM.DELETE."+st, "$JS.API.STREAM.PURGE."+st, "$JS.API.STREAM.MSG.DELETE."+st)
	}
	for name, uc := range map[string]*userConn{"ingest": s.ingestNC, "projector": s.projectorNC} {
		for _, subj := range append([]string{"$JS.API.STREAM.DELETE.LEDGER_IN", "$JS.API.STREAM.PURGE.LEDGER_LOG",
			"$JS.API.STREAM.DELETE.LEDGER_DLQ", "$JS.API.STREAM.PURGE.KV_ledger_tasks", "$JS.API.STREAM.DELETE.KV_ledger_tasks",
			"$JS.API.CONSUMER.DELETE.LEDGER_IN.ingest"}, inboxOps...) {
			if name == "ingest" && subj == "$JS.API.CONSUMER.DELETE.LEDGER_IN.ingest" {
				continue
			}
			require.NoError(t, uc.PublishRequest(subj, uc.NewRespInbox(), nil))
			uc.requireDenied(t, subj)
		}
	}
	// Nor update one: an update could make it republish what it stores.
	for name, uc := range map[string]*userConn{"ingest": s.ingestNC, "projector": s.projectorNC} {
		updates := []string{"$JS.API.STREAM.UPDATE.LEDGER_IN", "$JS.API.STREAM.UPDATE.LEDGER_DLQ",
			"$JS.API.STREAM.UPDATE.LEDGER_LOG", "$JS.API.STREAM.UPDATE.KV_ledger_tasks", "$JS.API.STREAM.UPDATE.KV_ledger_witness"}
		for _, st := range s.inStreams() {
			updates = append(updates, "$JS.API.STREAM.UPDATE."+st)
		}
		for _, subj := range updates {
			require.NoError(t, uc.PublishRequest(subj, uc.NewRespInbox(), nil), name)
			uc.requireDenied(t, subj)
		}
	}
	for _, subj := range []string{"ledger.in.worker-a.1.3.t", "ledger.log.3.t", "ledger.receipt.worker-a.1"} {
		require.NoError(t, s.projectorNC.Publish(subj, []byte(`{}`)))
		s.projectorNC.requireDenied(t, subj)
	}
	require.NoError(t, s.ingestNC.Publish("$KV.ledger_tasks.t", []byte(`{}`)))
	s.ingestNC.requireDenied(t, "$KV.ledger_tasks.t")
	for _, stream := range append(s.inStreams(), "LEDGER_LOG", "LEDGER_DLQ", "KV_ledger_tasks") {
		s.lastSeq(t, stream) // still there
	}
}

// A reader follows the bucket's changes whoever writes them: the projector,
// and operators' `ledgerctl repair`, which folds a lost projection again.
// Switch: drop the operators' export of $KV.ledger_tasks.> to the readers;
// the reader never sees the repaired value.
func (s *authStack) readersSeeRepairs(t *testing.T) {
	task, head := s.a.task, s.commit(t, s.a, "running", `{"status":"to be lost"}`).Version
	s.waitProjection(t, s.reader, task, head)
	changes, err := s.audit.SubscribeSync("$KV.ledger_tasks." + task)
	require.NoError(t, err)
	require.NoError(t, s.audit.Flush())

	// The value is lost, as a disk's newest writes can be.
	kv, err := s.admin.js(t).KeyValue(s.ctx, wire.BucketTasks)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(s.ctx, task))
	env := append(s.env("ledgerctl", "ledgerctl"), "DATABASE_URL="+loginUser(t, s.db, roleOperator))
	out := runLedgerctl(t, s.ledgerctl, env, "repair", "-kinds", "projection", "-grace", "0s", "-json")
	require.Contains(t, out, `"task":"`+task+`"`)
	require.Contains(t, out, `"outcome":"folded again"`)

	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	for {
		m, err := changes.NextMsgWithContext(ctx)
		require.NoError(t, err, "the reader did not see the repaired projection of %s", task)
		var v projectionValue
		if m.Header.Get("KV-Operation") == "" && json.Unmarshal(m.Data, &v) == nil && v.Version == head {
			break
		}
	}
	s.audit.requireNoErrors(t)
}

// The ledger's streams and buckets live in three accounts, and an
// account-wide listing ($JS.API.STREAM.LIST) answers for one: ledgerctl
// asks for each by name, which the operators' imports route to its account.
// A bucket setting the projector is given is applied by an operator, since
// the projector may create its buckets but never update them.
// Switch: list through js.ListStreams; LEDGER_LOG and the projector's
// buckets are missing. Switch: leave the buckets out of streams apply; the
// projector with the new size is refused its update and does not start.
func (s *authStack) operatorsListAndApply(t *testing.T) {
	env := s.env("ledgerctl", "ledgerctl")
	listed := func(out string) map[string][]string {
		got := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var r struct {
				Stream    string   `json:"stream"`
				Consumers []string `json:"consumers"`
			}
			require.NoError(t, json.Unmarshal([]byte(line), &r), line)
			got[r.Stream] = r.Consumers
		}
		return got
	}
	got := listed(runLedgerctl(t, s.ledgerctl, env, "streams", "list", "-json"))
	for _, name := range append(s.inStreams(), "LEDGER_DLQ", "LEDGER_LOG", "KV_ledger_tasks", "KV_ledger_projector",
		"KV_ledger_witness", "KV_ledger_leases") {
		require.Contains(t, got, name, "streams list shows every account's streams")
	}
	for _, name := range s.inStreams() {
		require.NotEmpty(t, got[name], "the ingest's consumers on %s", name)
	}
	require.NotEmpty(t, got["LEDGER_LOG"], "the projector's consumers")

	// A bucket setting changed: the operator applies it, the projector
	// given it starts.
	const size = 256 << 20
	got = listed(runLedgerctl(t, s.ledgerctl, env, "streams", "apply", "-tasks-max-bytes", strconv.Itoa(size), "-json"))
	require.Contains(t, got, "KV_ledger_tasks")
	st, err := s.admin.js(t).Stream(s.ctx, "KV_ledger_tasks")
	require.NoError(t, err)
	require.EqualValues(t, size, st.CachedInfo().Config.MaxBytes)
	proj, err := projector.New(projector.Config{TasksMaxBytes: size}, projector.Deps{NC: s.connect(t, "projector", "projector").Conn,
		Pool: openPool(t, loginUser(t, s.db, roleProjector)), Logger: s.log})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, proj.Start(ctx), "a projector with the bucket's new size")
	proj.Stop()
	s.requireServicesUnrefused(t)
}

// In operator mode one more credential of a principal needs nothing else:
// its JWT, signed by the scoped key of the principal's account, carries
// only a name. (A new principal needs an account: auth jwt and a reload.)
func (s *authStack) mintedWorker(t *testing.T) {
	runLedgerctl(t, s.ledgerctl, nil, "auth", "jwt-user", "-out", s.dir, "-role", "worker", "-name", "worker-b")
	c := s.newWorkerInstance(t, "worker-b", "minted", "minted", s.a.lease.Partition(), s.b.lease.Partition())
	s.commit(t, c, "running", `{"by":"worker-b's minted credential"}`)
	_, m := rawEvent(s.a.holder, s.a.lease.Partition(), s.a.task, s.a.lease.Generation(), 1000, `{}`)
	require.NoError(t, c.conn.PublishMsg(m))
	c.conn.requireDenied(t, m.Subject)
	_, err := c.conn.SubscribeSync("ledger.receipt.worker-a.>")
	require.NoError(t, err)
	c.conn.requireDenied(t, "ledger.receipt.worker-a.>")
}
