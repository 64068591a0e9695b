package console

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// A view that changes is a source: its data now, and a wait for the next
// change. A page draws it once; /live/<view> streams it as server-sent
// events, one "fragment" event of HTML each time it changes; /frag/<view>
// draws it once for a page whose browser cannot keep a stream open.

type source interface {
	// data is the view's data now.
	data(ctx context.Context) any
	// changed is ready once the view may have changed since data was
	// called.
	changed() <-chan struct{}
	close()
}

// source returns the source of a view, for the request's query.
func (s *Server) source(ctx context.Context, r *http.Request, view string) (source, error) {
	switch view {
	case "partitions", "flow":
		return &snapSource{hub: s.hub, flow: view == "flow"}, nil
	case "dlq":
		q, err := parseDLQQuery(r.URL.Query())
		if err != nil {
			return nil, err
		}
		return s.dlqSource(ctx, q), nil
	case "task":
		id := r.URL.Query().Get("id")
		if err := checkTaskID(id); err != nil {
			return nil, err
		}
		return &taskSource{s: s, id: id}, nil
	}
	return nil, fmt.Errorf("no view %q", view)
}

// snapSource is the partitions or the flow view of the hub's snapshots.
type snapSource struct {
	hub  *hub
	flow bool
	next <-chan struct{}
}

func (v *snapSource) data(context.Context) any {
	snap, next := v.hub.current()
	v.next = next
	if v.flow {
		return snap.Flow
	}
	return snap.Partitions
}

func (v *snapSource) changed() <-chan struct{} { return v.next }

func (v *snapSource) close() {}

// keepAlive is how often a quiet stream sends a comment, so that a
// browser that went away is noticed and a proxy keeps the stream open.
const keepAlive = 15 * time.Second

// live streams a view as server-sent events.
func (s *Server) live(w http.ResponseWriter, r *http.Request) {
	view := r.PathValue("view")
	// The request's context ends when the console stops (Server.cancel).
	ctx := r.Context()
	src, err := s.source(ctx, r, view)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer src.close()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// Reconnect quickly after a console restart.
	fmt.Fprint(w, "retry: 2000\n\n")

	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	last := ""
	for {
		html, err := s.fragmentHTML(view, src.data(ctx))
		if err != nil {
			return
		}
		if html != last {
			if writeEvent(w, "fragment", html) != nil || rc.Flush() != nil {
				return
			}
			last = html
		}
		if !s.awaitChange(ctx, w, rc, src.changed(), tick.C) {
			return
		}
	}
}

// awaitChange waits for the next change of a streamed view, keeping the
// stream alive meanwhile; false when the stream is over.
func (s *Server) awaitChange(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController,
	changed <-chan struct{}, keep <-chan time.Time) bool {
	for {
		select {
		case <-changed:
			return true
		case <-keep:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
}

// writeEvent writes one server-sent event. Its data lines end at any CR
// or LF, so a CR in the HTML (from a worker's string) is written as the
// character reference the browser reads back as CR.
func writeEvent(w http.ResponseWriter, event, data string) error {
	data = strings.ReplaceAll(data, "\r", "&#13;")
	var b strings.Builder
	b.WriteString("event: " + event + "\n")
	for line := range strings.SplitSeq(data, "\n") {
		b.WriteString("data: " + line + "\n")
	}
	b.WriteString("\n")
	_, err := fmt.Fprint(w, b.String())
	return err
}

// fragment draws a view's live part once.
func (s *Server) fragment(w http.ResponseWriter, r *http.Request) {
	view := r.PathValue("view")
	src, err := s.source(r.Context(), r, view)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer src.close()
	html, err := s.fragmentHTML(view, src.data(r.Context()))
	if err != nil {
		http.Error(w, "the view could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = fmt.Fprint(w, html)
}

// livePage writes a page whose main part is a live view.
func (s *Server) livePage(w http.ResponseWriter, r *http.Request, name, title, nav, view string, data any) {
	s.render(w, http.StatusOK, name, page{Title: title, Nav: nav, View: view, Query: r.URL.RawQuery,
		CSRF: s.replayToken(w, r), Data: data})
}

func (s *Server) partitionsPage(w http.ResponseWriter, r *http.Request) {
	snap, _ := s.hub.current()
	s.livePage(w, r, "partitions", "Partitions", "partitions", "partitions", snap.Partitions)
}

func (s *Server) flowPage(w http.ResponseWriter, r *http.Request) {
	snap, _ := s.hub.current()
	s.livePage(w, r, "flow", "Flow", "flow", "flow", snap.Flow)
}

// replayToken is the replay form's token, when replays are allowed.
func (s *Server) replayToken(w http.ResponseWriter, r *http.Request) string {
	if !s.cfg.AllowReplay {
		return ""
	}
	return s.csrf.issue(w, r)
}
