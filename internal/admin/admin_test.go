package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/admin"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// An ingest whose database goes away turns unready, and ready again when the
// database is back; it stays alive throughout.
func TestReadyzFollowsThePostgresConnection(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	proxy := faultproxy.Start(t, "127.0.0.1:5432")
	pool := db.PoolVia(t, proxy.Addr())
	store, err := fence.New(pool, fence.Config{})
	require.NoError(t, err)
	ns := natstest.Start(t)
	nc := ns.Conn(t)
	reg := admin.NewRegistry()
	svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: nc, Store: store, Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)

	srv, err := admin.Start("127.0.0.1:0", reg, admin.ServiceChecks(pool, nc, svc.CheckConsumer), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	base := "http://" + srv.Addr()

	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code, body)

	proxy.Cut()
	require.Eventually(t, func() bool {
		code, body := get(t, base+"/readyz")
		var r struct {
			Status string   `json:"status"`
			Failed []string `json:"failed"`
		}
		_ = json.Unmarshal([]byte(body), &r)
		return code == http.StatusServiceUnavailable && r.Status == "unready" && slices.Contains(r.Failed, "postgres")
	}, 10*time.Second, 100*time.Millisecond, "readyz did not report the database")
	code, _ = get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code, "the process stays alive")

	proxy.Restore()
	require.Eventually(t, func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	}, 10*time.Second, 100*time.Millisecond, "readyz did not recover")

	code, body = get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, series := range []string{"ledger_ingest_batch_size", "ledger_ingest_batch_seconds", "ledger_lease_takeovers_total", "go_goroutines"} {
		require.Contains(t, body, series)
	}
}

// A check's error can carry what an outsider must not read (a connection
// string with its password, a host name): /readyz names the failed checks
// and nothing else, and the error goes to the service's log, once.
func TestReadyzNamesFailedChecksWithoutTheirErrors(t *testing.T) {
	t.Parallel()
	const secret = "postgres://ingest_svc:hunter2-s3cr3t@db.internal:5432/ledger"
	var logged ledgertest.Buffer
	srv, err := admin.Start("127.0.0.1:0", prometheus.NewRegistry(), []admin.Check{
		{Name: "postgres", Func: func(context.Context) error { return fmt.Errorf("connect to %s: %w", secret, io.ErrUnexpectedEOF) }},
		{Name: "ok", Func: func(context.Context) error { return nil }},
		{Name: "nats", Func: func(context.Context) error { return errors.New("nats: authorization violation for user " + secret) }},
	}, slog.New(slog.NewJSONHandler(&logged, nil)))
	require.NoError(t, err)
	defer srv.Stop()

	for range 3 {
		code, body := get(t, "http://"+srv.Addr()+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.JSONEq(t, `{"status":"unready","failed":["postgres","nats"]}`, body)
		require.NotContains(t, body, "hunter2")
		require.NotContains(t, body, "db.internal")
	}

	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	require.Len(t, lines, 2, "each failure is logged once, not at every probe:\n%s", logged.String())
	for i, check := range []string{"postgres", "nats"} {
		var rec struct {
			Msg, Check, Error string
		}
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &rec))
		require.Equal(t, check, rec.Check)
		require.Contains(t, rec.Error, secret, "the operator reads the cause in the log")
	}
}
