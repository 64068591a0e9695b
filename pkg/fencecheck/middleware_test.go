package fencecheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/fencecheck"
	"github.com/flowness/ledger/pkg/wire"
)

// storeCase is one Store implementation under the conformance suite, with
// a way to count the writes its handler made.
type storeCase struct {
	name string
	// newService returns a handler that records one write per admitted
	// request (failing with 500 when the path ends in /fail), and a count
	// of the stored writes.
	newService func(t *testing.T) (http.Handler, func() int)
}

func storeCases() []storeCase {
	return []storeCase{
		{"memory", func(t *testing.T) (http.Handler, func() int) {
			var mu sync.Mutex
			n := 0
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("fail") != "" {
					http.Error(w, "handler failed", http.StatusInternalServerError)
					return
				}
				mu.Lock()
				n++
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
			})
			mw := fencecheck.Middleware(fencecheck.MiddlewareConfig{Store: &fencecheck.MemoryStore{}, Logger: ledgertest.Logger()}, h)
			return mw, func() int { mu.Lock(); defer mu.Unlock(); return n }
		}},
		{"postgres", func(t *testing.T) (http.Handler, func() int) {
			pool := downstream(t)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, ok := fencecheck.Tx(r.Context())
				if !ok {
					http.Error(w, "no transaction", http.StatusInternalServerError)
					return
				}
				f, _ := wire.ParseFence(r.Header.Get(wire.HeaderFence))
				if _, err := tx.Exec(r.Context(), `INSERT INTO charges (account, holder, generation) VALUES ($1, $2, $3)`,
					r.URL.Path, f.Holder, f.Generation); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if r.URL.Query().Get("fail") != "" {
					http.Error(w, "handler failed", http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			mw := fencecheck.Middleware(fencecheck.MiddlewareConfig{Store: fencecheck.PostgresStore{Pool: pool}, Logger: ledgertest.Logger()}, h)
			return mw, func() int { return charges(t, pool) }
		}},
	}
}

// send makes one request to h with fence (none if empty) and returns the
// status and the refusal body, if any.
func send(t *testing.T, h http.Handler, path, fence string) (int, fencecheck.Refusal) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, nil)
	if fence != "" {
		req.Header.Set(wire.HeaderFence, fence)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var body fencecheck.Refusal
	if rec.Code >= 400 && rec.Header().Get("Content-Type") == "application/json" {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	}
	return rec.Code, body
}

// The conformance suite of Store, through the middleware: each case runs
// against every implementation.
func TestMiddlewareRefusesSupersededHolders(t *testing.T) {
	t.Parallel()
	for _, sc := range storeCases() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			t.Run("stale holder's late write is refused with 409", func(t *testing.T) {
				h, writes := sc.newService(t)
				code, _ := send(t, h, "/acct-1", "3:pay.a:1")
				require.Equal(t, http.StatusCreated, code)
				code, _ = send(t, h, "/acct-1", "3:pay.b:2")
				require.Equal(t, http.StatusCreated, code)
				code, body := send(t, h, "/acct-1", "3:pay.a:1")
				require.Equal(t, http.StatusConflict, code)
				require.Equal(t, "superseded", body.Error)
				require.Equal(t, int64(2), body.HighestGeneration)
				require.Equal(t, "3:pay.a:1", body.Fence)
				require.Contains(t, body.Message, "superseded")
				require.Equal(t, 2, writes())
			})
			t.Run("current holder keeps writing", func(t *testing.T) {
				h, writes := sc.newService(t)
				for range 3 {
					code, _ := send(t, h, "/acct-1", "0:pay.a:7")
					require.Equal(t, http.StatusCreated, code)
				}
				require.Equal(t, 3, writes())
			})
			t.Run("same generation of another holder is refused", func(t *testing.T) {
				h, writes := sc.newService(t)
				code, _ := send(t, h, "/acct-1", "0:pay.a:7")
				require.Equal(t, http.StatusCreated, code)
				code, body := send(t, h, "/acct-1", "0:pay.b:7")
				require.Equal(t, http.StatusConflict, code)
				require.Equal(t, "holder_mismatch", body.Error)
				require.Equal(t, 1, writes())
			})
			t.Run("missing or malformed fence is refused with 400", func(t *testing.T) {
				h, writes := sc.newService(t)
				for _, f := range []string{"", "3:pay.a", "03:pay.a:1", "3:pay.a:+1", "3:pay:1"} {
					code, body := send(t, h, "/acct-1", f)
					require.Equal(t, http.StatusBadRequest, code, "%q", f)
					require.Equal(t, "malformed_fence", body.Error)
				}
				require.Zero(t, writes())
			})
			t.Run("failed write fences nobody", func(t *testing.T) {
				h, writes := sc.newService(t)
				code, _ := send(t, h, "/acct-1", "1:pay.a:1")
				require.Equal(t, http.StatusCreated, code)
				code, _ = send(t, h, "/acct-1?fail=1", "1:pay.b:2")
				require.Equal(t, http.StatusInternalServerError, code)
				code, _ = send(t, h, "/acct-1", "1:pay.a:1")
				require.Equal(t, http.StatusCreated, code, "the failed request's generation was not kept")
				require.Equal(t, 2, writes())
			})
			t.Run("resources are fenced apart", func(t *testing.T) {
				h, _ := sc.newService(t)
				code, _ := send(t, h, "/acct-1", "1:pay.b:5")
				require.Equal(t, http.StatusCreated, code)
				code, _ = send(t, h, "/acct-2", "1:pay.a:4")
				require.Equal(t, http.StatusCreated, code)
			})
			t.Run("concurrent holders: none below the highest committed gets through after it", func(t *testing.T) {
				h, _ := sc.newService(t)
				var wg sync.WaitGroup
				results := make(chan struct {
					gen  int64
					code int
				}, 40)
				for i := range 40 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						g := int64(i%8 + 1)
						code, _ := send(t, h, "/acct-1", fmt.Sprintf("2:pay.h%d:%d", g, g))
						results <- struct {
							gen  int64
							code int
						}{g, code}
					}()
				}
				wg.Wait()
				close(results)
				for r := range results {
					require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, r.code)
				}
				code, _ := send(t, h, "/acct-1", "2:pay.h8:8")
				require.Equal(t, http.StatusCreated, code, "the highest generation is always admitted")
				code, _ = send(t, h, "/acct-1", "2:pay.h7:7")
				require.Equal(t, http.StatusConflict, code)
			})
		})
	}
}

// The middleware waits for a store that holds the key, and gives up with
// the request's context.
func TestMemoryStoreAdmissionWaitsForTheHolderOfTheKey(t *testing.T) {
	t.Parallel()
	var s fencecheck.MemoryStore
	ctx := context.Background()
	_, finish, err := s.Admit(ctx, "r", wire.Fence{Partition: 0, Holder: "p.a", Generation: 1})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, _, err = s.Admit(wctx, "r", wire.Fence{Partition: 0, Holder: "p.b", Generation: 2})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, finish(true))
	_, finish2, err := s.Admit(ctx, "r", wire.Fence{Partition: 0, Holder: "p.b", Generation: 2})
	require.NoError(t, err)
	require.NoError(t, finish2(true))
	_, _, err = s.Admit(ctx, "r", wire.Fence{Partition: 0, Holder: "p.a", Generation: 1})
	require.ErrorIs(t, err, fencecheck.ErrSuperseded)
}

// Requests through a real server: the response of an admitted request is
// whole, as the handler wrote it.
func TestMiddlewareKeepsTheHandlersResponse(t *testing.T) {
	t.Parallel()
	h := fencecheck.Middleware(fencecheck.MiddlewareConfig{Store: &fencecheck.MemoryStore{}},
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-Charge", "c-1")
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, "charged")
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/acct", nil)
	require.NoError(t, err)
	req.Header.Set(wire.HeaderFence, "1:pay.a:1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Equal(t, "c-1", resp.Header.Get("X-Charge"))
	require.Equal(t, "charged", string(b))
}
