package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// maxBodyShown bounds the body a letter's page shows: a dead letter holds
// up to 1 MiB.
const maxBodyShown = 64 << 10

// openLetter reads one dead letter, headers and body.
func (s *Server) openLetter(ctx context.Context, seq uint64) (DeadLetter, error) {
	st, err := s.deps.JS.Stream(ctx, wire.StreamDLQ)
	if err != nil {
		return DeadLetter{}, err
	}
	m, err := st.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, err
	}
	return s.deps.Ledger.DeadLetter(m.Sequence, m.Subject, m.Header, m.Data), nil
}

// newLetterView lays a dead letter out for its page.
func newLetterView(d DeadLetter) letterView {
	v := letterView{Letter: d}
	for _, name := range slices.Sorted(maps.Keys(d.Header)) {
		v.Headers = append(v.Headers, headerRow{Name: name, Values: d.Header[name]})
	}
	v.Body, v.Binary = showBody(d.Body)
	return v
}

// showBody is a body as a page shows it: JSON indented, other text as it
// is, anything else quoted; cut at maxBodyShown.
func showBody(b []byte) (text string, binary bool) {
	cut := ""
	if len(b) > maxBodyShown {
		b, cut = b[:maxBodyShown], "\n… ("+strconv.Itoa(len(b)-maxBodyShown)+" more bytes)"
	}
	var pretty bytes.Buffer
	if json.Valid(b) && json.Indent(&pretty, b, "", "  ") == nil {
		return pretty.String() + cut, false
	}
	if utf8.Valid(b) {
		return string(b) + cut, false
	}
	return strconv.Quote(string(b)) + cut, true
}

func (s *Server) letterPage(w http.ResponseWriter, r *http.Request) {
	seq, err := parseSeq(r.PathValue("seq"))
	if err != nil {
		s.fail(w, http.StatusNotFound, err.Error())
		return
	}
	d, err := s.openLetter(r.Context(), seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		s.fail(w, http.StatusNotFound, wire.StreamDLQ+" holds no message "+strconv.FormatUint(seq, 10)+" (deleted, purged or never stored)")
		return
	case err != nil:
		s.fail(w, http.StatusBadGateway, s.hub.problem("read a dead letter", wire.StreamDLQ+" could not be read (the console's log says why)", err))
		return
	}
	s.render(w, http.StatusOK, "letter", page{Title: "Dead letter " + strconv.FormatUint(seq, 10), Nav: "dlq",
		CSRF: s.replayToken(w, r), Data: newLetterView(d)})
}

// maxFormBytes bounds a replay form: a token and two fields.
const maxFormBytes = 4 << 10

// replay re-submits one dead letter, as "ledgerctl dlq replay -seq N".
func (s *Server) replay(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.AllowReplay {
		s.fail(w, http.StatusForbidden, "replay is disabled: this console is read-only (start it with -allow-replay to allow replays)")
		return
	}
	if err := sameOrigin(r); err != nil {
		s.fail(w, http.StatusForbidden, "replay refused: "+err.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		s.fail(w, http.StatusBadRequest, "replay refused: the form could not be read")
		return
	}
	if err := s.csrf.check(r); err != nil {
		s.fail(w, http.StatusForbidden, "replay refused: "+err.Error())
		return
	}
	seq, err := parseSeq(r.PathValue("seq"))
	if err != nil {
		s.fail(w, http.StatusNotFound, err.Error())
		return
	}
	newID := r.PostFormValue("new_id") == "1"
	res, err := s.deps.Ledger.Replay(r.Context(), seq, newID, s.cfg.ReplayWait)
	s.deps.Logger.Info("console: replay", slog.Uint64("seq", seq), slog.Bool("new_id", newID),
		slog.String("result", res.Result), slog.String("verdict", res.Verdict), slog.String("reason", res.Reason),
		slog.String("remote", r.RemoteAddr))
	switch {
	case errors.Is(err, ErrNotFound):
		s.fail(w, http.StatusNotFound, wire.StreamDLQ+" holds no message "+strconv.FormatUint(seq, 10))
		return
	case err != nil:
		s.fail(w, http.StatusBadGateway, s.hub.problem("replay", "the replay failed (the console's log says why)", err))
		return
	}
	status := http.StatusOK
	if res.Result != "submitted" {
		status = http.StatusConflict
	}
	s.render(w, status, "replay", page{Title: "Replay of " + strconv.FormatUint(seq, 10), Nav: "dlq", Data: res})
}
