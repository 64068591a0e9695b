package worker

import (
	"context"
	"fmt"
	"net/http"

	"github.com/flowness/ledger/pkg/wire"
)

// FenceSource is what has a fence to send downstream; *Lease is one.
type FenceSource interface {
	Fence() wire.Fence
}

// SetFence sets h's Ledger-Fence header to f, replacing any other value.
func SetFence(h http.Header, f wire.Fence) { h.Set(wire.HeaderFence, f.String()) }

// FenceTransport is an http.RoundTripper that sends Source's fence in the
// Ledger-Fence header of every request, so a downstream service can refuse
// the calls of a superseded holder (package fencecheck of the repository).
// When Source is a *Lease that has ended, it sends nothing and fails with
// the lease's cause (ErrLeaseLost, ErrReleased or ErrClosed): the holder's
// own check comes first, the downstream's backs it.
type FenceTransport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Source gives the fence. Required.
	Source FenceSource
}

// RoundTrip sends a copy of req with the fence set.
func (t *FenceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if l, ok := t.Source.(*Lease); ok && l.Context().Err() != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("worker: %s %s not sent with fence %s: %w", req.Method, req.URL, l.Fence(), context.Cause(l.Context()))
	}
	r := req.Clone(req.Context())
	SetFence(r.Header, t.Source.Fence())
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}
