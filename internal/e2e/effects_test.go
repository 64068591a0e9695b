package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/fencecheck"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
	"github.com/flowness/ledger/pkg/worker/effect"
)

// chargeService is the test's own downstream: an HTTP service on a
// PostgreSQL database of its own that charges orders. Direct calls of a
// holder go through the fence middleware; effects of the runner are
// deduplicated by their idempotency key.
type chargeService struct {
	pool *pgxpool.Pool
	srv  *httptest.Server

	mu    sync.Mutex
	calls map[string]int // calls per idempotency key, applied or not
}

func newChargeService(t *testing.T, log *slog.Logger) *chargeService {
	t.Helper()
	ctx := context.Background()
	db := dbtest.New(t) // a database of its own, not the ledger's
	require.NoError(t, fencecheck.Apply(ctx, db.Pool))
	_, err := db.Pool.Exec(ctx, `CREATE TABLE charges (
		idempotency_key text PRIMARY KEY, order_id text NOT NULL, holder text NOT NULL,
		generation bigint NOT NULL, path text NOT NULL)`)
	require.NoError(t, err)
	s := &chargeService{pool: db.Pool, calls: map[string]int{}}
	mux := http.NewServeMux()
	// A holder's own call: fenced per resource "charges".
	mux.Handle("POST /direct/{order}", fencecheck.Middleware(fencecheck.MiddlewareConfig{
		Store:    fencecheck.PostgresStore{Pool: db.Pool},
		Resource: func(*http.Request) string { return "charges" },
		Logger:   log,
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := fencecheck.Tx(r.Context())
		if !ok {
			http.Error(w, "no fenced transaction", http.StatusInternalServerError)
			return
		}
		s.charge(w, r, tx.Exec, "direct")
	})))
	// A committed intent, from the effect runner: the ledger fenced it.
	mux.HandleFunc("POST /effects/{order}", func(w http.ResponseWriter, r *http.Request) {
		s.charge(w, r, db.Pool.Exec, "log")
	})
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

// charge applies one charge at most once per idempotency key, and
// answers a repeated key as the first time.
func (s *chargeService) charge(w http.ResponseWriter, r *http.Request, exec func(context.Context, string, ...any) (pgconn.CommandTag, error), path string) {
	key := r.Header.Get("Idempotency-Key")
	f, err := wire.ParseFence(r.Header.Get(wire.HeaderFence))
	if key == "" || err != nil {
		http.Error(w, "an Idempotency-Key and a Ledger-Fence are required", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.calls[key]++
	s.mu.Unlock()
	if _, err := exec(r.Context(), `INSERT INTO charges (idempotency_key, order_id, holder, generation, path)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING`,
		key, r.PathValue("order"), f.Holder, f.Generation, path); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// appliedCharge is one row of the downstream's charges.
type appliedCharge struct {
	Key, Order, Holder, Path string
	Generation               int64
}

func (s *chargeService) applied(t *testing.T) []appliedCharge {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), `SELECT idempotency_key, order_id, holder, generation, path FROM charges ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var out []appliedCharge
	for rows.Next() {
		var c appliedCharge
		require.NoError(t, rows.Scan(&c.Key, &c.Order, &c.Holder, &c.Generation, &c.Path))
		out = append(out, c)
	}
	require.NoError(t, rows.Err())
	return out
}

func (s *chargeService) callsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[key]
}

// post sends one charge and returns the status and body. It may run in a
// runner's handler, so it returns its errors rather than failing the test.
func post(ctx context.Context, hc *http.Client, url, key string, fence *wire.Fence) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		return 0, "", fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Idempotency-Key", key)
	if fence != nil {
		worker.SetFence(req.Header, *fence)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("post %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// The story, end to end. Worker A holds partition 2 and records a
// charge intent; then A is paused past its TTL (its renewals stop) and B
// takes over. B charges order-1 both ways: directly, with its lease's fence,
// and through the log, as a committed intent. A wakes up and charges
// order-1 both ways too, with its old fence. The ledger refuses A's intent
// (stale), so it never reaches LEDGER_LOG and the runner never runs it; the
// downstream's fence check refuses A's direct call. The runner that runs
// B's intent crashes between the handler and its ack; the standby runner
// calls again with the same key, and the downstream absorbs the repeat.
func TestZombieActsNeitherInTheLedgerNorOutsideIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	db := dbtest.New(t)
	ns := natstest.Start(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: ns.Conn(t), Store: store, Logger: log})
	require.NoError(t, err)
	require.NoError(t, in.Start(ctx))
	t.Cleanup(in.Stop)
	down := newChargeService(t, log)

	// Two processes of one effect runner. Whichever runs B's intent first
	// dies after the handler returned, before its ack.
	const partition, intent = 2, "charge.requested"
	var handled sync.Map // event id -> *atomic.Int64, its calls
	var crashOnce sync.Once
	crashedKey := make(chan string, 1)
	startRunner := func(name string) {
		js := ns.JetStream(t)
		cfg := effect.Config{Name: "charges", Types: []string{intent}, PinnedTTL: 2 * time.Second,
			AckWait: 2 * time.Second, RetryDelay: 100 * time.Millisecond, Logger: log}
		cfg.BeforeAck = func(_ context.Context, e effect.Effect) error {
			var crash error
			if e.Fence.Holder == "payments.b" {
				crashOnce.Do(func() {
					js.Conn().Close()
					crashedKey <- e.ID
					crash = fmt.Errorf("runner %s crashed before its ack", name)
				})
			}
			return crash
		}
		r, err := effect.New(js, cfg, func(ctx context.Context, e effect.Effect) error {
			n, _ := handled.LoadOrStore(e.ID, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			status, body, err := post(ctx, http.DefaultClient, down.srv.URL+"/effects/"+e.Task, e.ID, &e.Fence)
			if err != nil {
				return err
			}
			if status != http.StatusCreated {
				return fmt.Errorf("downstream answered %d: %s", status, body)
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		t.Cleanup(r.Stop)
	}
	startRunner("one")

	// A holds the partition and records an intent, which runs.
	a, err := worker.New(ns.Conn(t, worker.InboxOption("payments.a")), worker.Config{Holder: "payments.a",
		TTL: time.Second, Logger: log})
	require.NoError(t, err)
	la, err := a.Acquire(ctx, partition)
	require.NoError(t, err)
	pa, err := la.PublishJSON(ctx, "order-0", intent, map[string]int{"amount": 100})
	require.NoError(t, err)
	require.NoError(t, pa.Wait(ctx))
	require.Eventually(t, func() bool { return down.callsOf(pa.ID()) == 1 }, 20*time.Second, 10*time.Millisecond)
	startRunner("two") // stands by: the first one is pinned

	// A is paused past its TTL: its renewals stop, and B takes over when
	// the lease has expired by the database's clock.
	oldFence := la.Fence()
	require.NoError(t, a.Close())
	b, err := worker.New(ns.Conn(t, worker.InboxOption("payments.b")), worker.Config{Holder: "payments.b", Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	lb, err := b.AcquireWait(ctx, partition)
	require.NoError(t, err)
	require.Greater(t, lb.Generation(), oldFence.Generation)

	// B charges order-1 directly, with its fence, and through the log.
	bClient := &http.Client{Transport: &worker.FenceTransport{Source: lb}}
	status, body, err := post(ctx, bClient, down.srv.URL+"/direct/order-1", "direct-b-order-1", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, body)
	pb, err := lb.PublishJSON(ctx, "order-1", intent, map[string]int{"amount": 100})
	require.NoError(t, err)
	require.NoError(t, pb.Wait(ctx))

	// A wakes up and charges order-1 both ways with its old fence.
	zombieID := ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
	_, err = ns.JetStream(t).PublishMsg(ctx, wire.Subjects{}.InboundMsg(wire.Inbound{ID: zombieID,
		Partition: partition, Task: "order-1", Holder: oldFence.Holder, Generation: oldFence.Generation,
		Version: 2, Type: intent, Payload: []byte(`{"amount":100}`)}))
	require.NoError(t, err)
	status, body, err = post(ctx, http.DefaultClient, down.srv.URL+"/direct/order-1", "direct-a-order-1", &oldFence)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, status, body)
	var refusal fencecheck.Refusal
	require.NoError(t, json.Unmarshal([]byte(body), &refusal))
	require.Equal(t, "superseded", refusal.Error)
	require.Equal(t, lb.Generation(), refusal.HighestGeneration)

	// The ledger judged A's intent stale: it never reaches the log.
	var verdict, reason string
	require.Eventually(t, func() bool {
		return db.Pool.QueryRow(ctx, `SELECT verdict, reason FROM ledger.rejections WHERE event_id = $1`, zombieID).
			Scan(&verdict, &reason) == nil
	}, 20*time.Second, 20*time.Millisecond, "A's intent gets a verdict")
	require.Equal(t, string(wire.VerdictStale), verdict)
	require.Equal(t, string(wire.ReasonSuperseded), reason)
	requireNotInLog(ctx, t, ns.JetStream(t), zombieID)

	// B's intent: the first runner died after the handler; the standby
	// called again with the same key, and the downstream applied it once.
	var crashed string
	select {
	case crashed = <-crashedKey:
	case <-ctx.Done():
		t.Fatal("no runner ran B's intent")
	}
	require.Equal(t, pb.ID(), crashed)
	require.Eventually(t, func() bool { return down.callsOf(pb.ID()) == 2 }, 30*time.Second, 20*time.Millisecond,
		"the standby calls B's intent again")
	time.Sleep(2 * time.Second) // past another AckWait: nothing more is called

	// The runner ran each committed intent, and none of the zombie's.
	calls := map[string]int{}
	handled.Range(func(k, v any) bool { calls[k.(string)] = int(v.(*atomic.Int64).Load()); return true })
	require.Equal(t, map[string]int{pa.ID(): 1, pb.ID(): 2}, calls)
	require.Equal(t, 0, down.callsOf(zombieID))

	// The downstream applied A's charge of order-0 (committed while A held
	// the lease) and only B's charges of order-1, each once.
	require.ElementsMatch(t, []appliedCharge{
		{Key: pa.ID(), Order: "order-0", Holder: "payments.a", Generation: oldFence.Generation, Path: "log"},
		{Key: pb.ID(), Order: "order-1", Holder: "payments.b", Generation: lb.Generation(), Path: "log"},
		{Key: "direct-b-order-1", Order: "order-1", Holder: "payments.b", Generation: lb.Generation(), Path: "direct"},
	}, down.applied(t))
}

// requireNotInLog checks that LEDGER_LOG holds no copy of event id.
func requireNotInLog(ctx context.Context, t *testing.T, js jetstream.JetStream, id string) {
	t.Helper()
	stream, err := js.Stream(ctx, wire.StreamLog)
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err)
		require.NotEqual(t, id, m.Header.Get(wire.HeaderMsgID), "the zombie's intent is in LEDGER_LOG at seq %d", seq)
	}
}

// A zombie that calls before its successor's first call: the downstream
// has seen no later generation, so only the leases view can tell it. With
// FollowLeases the takeover raises the downstream's mark, and the zombie's
// call is refused; a resource the follower does not cover still admits it
// (the check knows only what it has seen).
func TestZombieCallingFirstIsRefusedWhenTheDownstreamFollowsTheLeasesView(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	db := dbtest.New(t)
	ns := natstest.Start(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: ns.Conn(t), Store: store, Logger: log})
	require.NoError(t, err)
	require.NoError(t, in.Start(ctx))
	t.Cleanup(in.Stop)
	down := newChargeService(t, log)
	kv, err := ns.JetStream(t).KeyValue(ctx, wire.BucketLeases)
	require.NoError(t, err)
	fctx, stopFollow := context.WithCancel(ctx)
	followed := make(chan error, 1)
	go func() {
		followed <- fencecheck.FollowLeases(fctx, kv, fencecheck.FollowConfig{
			Store: fencecheck.PostgresStore{Pool: down.pool}, Resources: []string{"charges"}, Logger: log})
	}()
	t.Cleanup(func() { stopFollow(); require.ErrorIs(t, <-followed, context.Canceled) })

	const partition = 4
	a, err := worker.New(ns.Conn(t, worker.InboxOption("payments.a")), worker.Config{Holder: "payments.a",
		TTL: time.Second, Logger: log})
	require.NoError(t, err)
	la, err := a.Acquire(ctx, partition)
	require.NoError(t, err)
	oldFence := la.Fence()
	require.NoError(t, a.Close()) // paused: no renewals
	b, err := worker.New(ns.Conn(t, worker.InboxOption("payments.b")), worker.Config{Holder: "payments.b", Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	lb, err := b.AcquireWait(ctx, partition)
	require.NoError(t, err)

	// B has called nobody; the view alone raises the mark.
	require.Eventually(t, func() bool {
		var g int64
		err := down.pool.QueryRow(ctx, `SELECT generation FROM ledger_fence.high_water WHERE resource = 'charges' AND partition = $1`,
			partition).Scan(&g)
		return err == nil && g == lb.Generation()
	}, 10*time.Second, 10*time.Millisecond)
	status, body, err := post(ctx, http.DefaultClient, down.srv.URL+"/direct/order-9", "direct-a-order-9", &oldFence)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, status, body)
	require.Empty(t, down.applied(t))

	// A resource nobody follows has seen no later generation: admitted.
	tx, err := down.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	require.NoError(t, fencecheck.Admit(ctx, tx, "refunds", oldFence))
}
