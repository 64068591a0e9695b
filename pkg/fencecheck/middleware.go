package fencecheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/flowness/ledger/pkg/wire"
)

// Refusal is the JSON body of a refused request.
type Refusal struct {
	// Error is "superseded", "holder_mismatch", "malformed_fence" or
	// "unavailable".
	Error string `json:"error"`
	// Message says why, in words.
	Message string `json:"message"`
	// Fence is the request's Ledger-Fence, when it had one.
	Fence string `json:"fence,omitempty"`
	// HighestGeneration is the highest generation seen, for "superseded".
	HighestGeneration int64 `json:"highest_generation,omitempty"`
}

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Store keeps the high-water marks. Required.
	Store Store
	// Resource names what a request writes, the unit fences are compared
	// on (an account, a mailbox). Default: the request's URL path.
	Resource func(*http.Request) string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Middleware refuses a request whose Ledger-Fence is superseded for its
// resource: 409 with a Refusal body for a lower generation or another
// holder's generation, 400 for a missing or malformed fence. An admitted
// request runs next inside its admission: next's response is held back
// until the admission is committed (status below 400) or rolled back
// (otherwise, or a panic), so a client never sees a success whose check
// was not stored. A store that cannot answer gives 503.
func Middleware(cfg MiddlewareConfig, next http.Handler) http.Handler {
	if cfg.Store == nil {
		panic("fencecheck: Middleware needs a Store")
	}
	if cfg.Resource == nil {
		cfg.Resource = func(r *http.Request) string { return r.URL.Path }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.Header.Values(wire.HeaderFence)
		if len(raw) != 1 {
			refuse(w, http.StatusBadRequest, Refusal{Error: "malformed_fence",
				Message: fmt.Sprintf("exactly one %s header is required, got %d", wire.HeaderFence, len(raw))})
			return
		}
		f, err := wire.ParseFence(raw[0])
		if err != nil {
			refuse(w, http.StatusBadRequest, Refusal{Error: "malformed_fence", Message: err.Error()})
			return
		}
		resource := cfg.Resource(r)
		ctx, finish, err := cfg.Store.Admit(r.Context(), resource, f)
		if err != nil {
			refuseAdmit(w, cfg.Logger, resource, f, err)
			return
		}
		buf := &bufferedWriter{header: http.Header{}, status: http.StatusOK}
		committed := false
		defer func() {
			if !committed {
				_ = finish(false)
			}
		}()
		next.ServeHTTP(buf, r.WithContext(ctx))
		if buf.status >= 400 {
			buf.flush(w)
			return
		}
		committed = true
		if err := finish(true); err != nil {
			cfg.Logger.Warn("fenced write not committed", slog.String("resource", resource),
				slog.String("fence", f.String()), slog.String("error", err.Error()))
			refuse(w, http.StatusServiceUnavailable, Refusal{Error: "unavailable", Fence: f.String(),
				Message: "the write could not be committed; retry"})
			return
		}
		buf.flush(w)
	})
}

func refuseAdmit(w http.ResponseWriter, log *slog.Logger, resource string, f wire.Fence, err error) {
	var refused *RefusedError
	if !errors.As(err, &refused) {
		log.Warn("fence check failed", slog.String("resource", resource), slog.String("fence", f.String()),
			slog.String("error", err.Error()))
		refuse(w, http.StatusServiceUnavailable, Refusal{Error: "unavailable", Fence: f.String(),
			Message: "the fence could not be checked; retry"})
		return
	}
	body := Refusal{Fence: f.String(), Message: refused.Error(), HighestGeneration: refused.Highest}
	status := http.StatusConflict
	switch {
	case errors.Is(err, ErrSuperseded):
		body.Error = "superseded"
	case errors.Is(err, ErrHolderMismatch):
		body.Error = "holder_mismatch"
	default:
		body.Error, status = "malformed_fence", http.StatusBadRequest
	}
	refuse(w, status, body)
}

func refuse(w http.ResponseWriter, status int, body Refusal) {
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// bufferedWriter holds a handler's response until its admission is
// settled.
type bufferedWriter struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(status int) {
	if !b.wrote {
		b.status, b.wrote = status, true
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	b.wrote = true
	return b.body.Write(p)
}

func (b *bufferedWriter) flush(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}
