package console

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Server is a running console.
type Server struct {
	cfg   Config
	deps  Deps
	hub   *hub
	csrf  *csrf
	pages *pages
	srv   *http.Server
	ln    net.Listener
	// hosts are the Host values served; nil serves any.
	hosts map[string]bool
	// cancel ends the server's context, and with it every request's (the
	// live streams too): requests' contexts derive from it (BaseContext).
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New checks cfg and prepares a console; Start serves it.
func New(cfg Config, deps Deps) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deps.Ledger == nil || deps.Pool == nil || deps.NC == nil || deps.JS == nil {
		return nil, errors.New("console: Ledger, Pool, NC and JS are required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := newCSRF()
	if err != nil {
		return nil, fmt.Errorf("console: draw the form secret: %w", err)
	}
	p, err := loadPages()
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, deps: deps, hub: newHub(cfg, deps), csrf: c, pages: p}, nil
}

// Start listens on Config.Listen and serves until Stop or until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("console: listen on %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	s.hosts = allowedHosts(ln.Addr().(*net.TCPAddr), s.cfg.Hosts)
	ctx, s.cancel = context.WithCancel(ctx)
	// The first page shows the ledger, not an empty snapshot.
	s.hub.tick(ctx)
	s.srv = &http.Server{Handler: s.handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	s.wg.Go(func() { s.hub.run(ctx) })
	s.wg.Go(func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.deps.Logger.Error("console: serve", slog.String("error", err.Error()))
		}
	})
	s.wg.Go(func() {
		<-ctx.Done()
		s.shutdown()
	})
	return nil
}

// Addr is the address the console listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the console's address as a browser opens it.
func (s *Server) URL() string { return "http://" + s.Addr() + "/" }

// Stop ends the live streams and the server, and waits for them.
func (s *Server) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
}

func (s *Server) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

// allowedHosts are the Host values a console on addr answers to: its
// address, localhost's names when it listens on loopback, and extra. Nil
// (any) when it listens on every interface and no names were given.
func allowedHosts(addr *net.TCPAddr, extra []string) map[string]bool {
	port := fmt.Sprint(addr.Port)
	if addr.IP.IsUnspecified() && len(extra) == 0 {
		return nil
	}
	hosts := map[string]bool{net.JoinHostPort(addr.IP.String(), port): true}
	if addr.IP.IsLoopback() {
		for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
			hosts[net.JoinHostPort(h, port)] = true
		}
	}
	for _, h := range extra {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, port)
		}
		hosts[strings.ToLower(h)] = true
	}
	return hosts
}

// contentSecurityPolicy lets a page load only the console's own scripts,
// styles and images, be framed by nobody, and post forms only to itself.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// guard refuses a request for another host and sets the headers every
// answer carries.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		// same-origin, not no-referrer: under no-referrer a browser sends
		// "Origin: null" with a form's POST, and the replay's origin check
		// needs the real one. Other sites still get no referrer.
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if s.hosts != nil && !s.hosts[strings.ToLower(r.Host)] {
			// A page elsewhere that rebinds its own name to this address
			// reaches the console under that name: refuse it.
			http.Error(w, "this console does not serve the host "+fmt.Sprintf("%q", r.Host)+
				" (start it with -host to add a name)", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFS, "web/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", s.partitionsPage)
	mux.HandleFunc("GET /flow", s.flowPage)
	mux.HandleFunc("GET /dlq", s.dlqPage)
	mux.HandleFunc("GET /dlq/{seq}", s.letterPage)
	mux.HandleFunc("POST /dlq/{seq}/replay", s.replay)
	mux.HandleFunc("GET /task", s.taskForm)
	mux.HandleFunc("GET /task/{id}", s.taskPage)
	mux.HandleFunc("GET /live/{view}", s.live)
	mux.HandleFunc("GET /frag/{view}", s.fragment)
	return s.guard(mux)
}
