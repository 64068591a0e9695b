package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// webFS holds the templates and the static files: the console needs
// nothing from the network.
//
//go:embed web
var webFS embed.FS

// pages are the parsed templates: one set per page, each the layout with
// the page's own content.
type pages struct{ byName map[string]*template.Template }

// pageNames are the pages, each web/<name>.html defining "content".
var pageNames = []string{"partitions", "flow", "dlq", "letter", "replay", "task", "error"}

var funcs = template.FuncMap{
	"ago":       ago,
	"left":      left,
	"path":      url.PathEscape,
	"nonneg":    func(n int64) int64 { return max(n, 0) },
	"minutes":   func(d time.Duration) string { return strings.TrimSuffix(d.Round(time.Second).String(), "0s") },
	"rate":      func(f float64) string { return fmt.Sprintf("%.1f", f) },
	"holderGen": holderGen,
	"verdicts":  func() []string { return dlqVerdicts },
	"part": func(p *int) string {
		if p == nil {
			return "-"
		}
		return strconv.Itoa(*p)
	},
}

func loadPages() (*pages, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(webFS, "web/layout.html", "web/fragments.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse the layout: %w", err)
	}
	p := &pages{byName: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(webFS, "web/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse page %s: %w", name, err)
		}
		p.byName[name] = t
	}
	return p, nil
}

// page is what the layout needs besides a view's own data.
type page struct {
	Title string
	// Nav is the menu entry to mark: partitions, flow, dlq or task.
	Nav         string
	AllowReplay bool
	// View and Query name the page's live view ("/live/<view>?<query>"
	// streams it, "/frag/<view>?<query>" polls it); empty for a page that
	// does not change. A page with a view reloads itself every 5 s when
	// scripts do not run (layout.html).
	View, Query string
	// CSRF is the replay form's token.
	CSRF string
	Data any
}

// render writes a page.
func (s *Server) render(w http.ResponseWriter, status int, name string, p page) {
	p.AllowReplay = s.cfg.AllowReplay
	var buf bytes.Buffer
	if err := s.pages.byName[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		s.deps.Logger.Error("console: render", slog.String("page", name), slog.String("error", err.Error()))
		http.Error(w, "the page could not be drawn (the console's log says why)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fragmentHTML renders a view's live part.
func (s *Server) fragmentHTML(view string, data any) (string, error) {
	var buf bytes.Buffer
	if err := s.pages.byName["partitions"].ExecuteTemplate(&buf, view+"-live", data); err != nil {
		return "", fmt.Errorf("render %s: %w", view, err)
	}
	return buf.String(), nil
}

// fail writes an error page.
func (s *Server) fail(w http.ResponseWriter, status int, msg string) {
	s.render(w, status, "error", page{Title: http.StatusText(status), Data: msg})
}

// ago shows a duration in ms as people read ages: 350ms, 4.2s, 3m10s.
func ago(ms int64) string {
	d := time.Duration(max(ms, 0)) * time.Millisecond
	switch {
	case d < time.Second:
		return d.String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

// left shows a lease's time left, or how long ago it expired.
func left(ms int64) string {
	if ms > 0 {
		return ago(ms) + " left"
	}
	return "expired " + ago(-ms) + " ago"
}

func holderGen(holder string, gen int64) string {
	if holder == "" && gen == 0 {
		return "-"
	}
	if holder == "" {
		holder = "-"
	}
	return fmt.Sprintf("%s/%d", holder, gen)
}
