// Package admin serves a service's operator endpoints: Prometheus metrics,
// liveness and readiness.
//
// The endpoints are for the operator's network only: /metrics and /readyz
// describe the service's dependencies, so the services bind them to
// loopback unless told otherwise (internal/connect, -admin-addr). /readyz
// names the checks that failed and nothing more; why they failed (error
// text that can carry host names, user names or driver detail) goes to the
// service's log.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness condition: nil means satisfied.
type Check struct {
	Name string
	Func func(ctx context.Context) error
}

// Server is the admin HTTP server.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// NewRegistry is a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// readiness is the body of /readyz.
type readiness struct {
	Status string `json:"status"`
	// Failed names the failed checks, in the order they were given.
	Failed []string `json:"failed,omitempty"`
}

// Start listens on addr and serves /metrics, /healthz (the process is alive)
// and /readyz (every check passes; 503 naming the failed checks otherwise,
// with each failure's error written to log, at most once a minute per
// distinct error).
func Start(addr string, reg *prometheus.Registry, checks []Check, log *slog.Logger) (*Server, error) {
	failures := newFailureLog(log, time.Now)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "alive"})
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		var failed []string
		for _, c := range checks {
			if err := c.Func(ctx); err != nil {
				failed = append(failed, c.Name)
				failures.report(c.Name, err)
			}
		}
		if len(failed) > 0 {
			writeJSON(w, http.StatusServiceUnavailable, readiness{Status: "unready", Failed: failed})
			return
		}
		writeJSON(w, http.StatusOK, readiness{Status: "ready"})
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for the admin endpoints on %s: %w", addr, err)
	}
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server", slog.String("error", err.Error()))
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stop shuts the server down.
func (s *Server) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// ServeUntilDone serves the admin endpoints on addr (none when addr is
// empty) until ctx ends, then calls stop (the service's graceful stop) and
// shuts the endpoints down. It is the tail of every service's main.
func ServeUntilDone(ctx context.Context, addr string, reg *prometheus.Registry, checks []Check, stop func(), log *slog.Logger) error {
	if addr != "" {
		srv, err := Start(addr, reg, checks, log)
		if err != nil {
			stop()
			return fmt.Errorf("admin server: %w", err)
		}
		defer srv.Stop()
		log.Info("admin endpoints", slog.String("addr", srv.Addr()))
	}
	<-ctx.Done()
	log.Info("shutting down: stop fetching, finish the batches in hand")
	stop()
	return nil
}
