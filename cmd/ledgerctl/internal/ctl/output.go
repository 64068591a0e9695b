package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// table writes aligned columns; call flush at the end.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(anySlice(header)...)
	return t
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func (t *table) row(cols ...any) {
	for i, c := range cols {
		if i > 0 {
			_, _ = io.WriteString(t.tw, "\t")
		}
		// Values come from workers: a tab or newline would break the
		// columns, an escape sequence would drive the operator's terminal.
		_, _ = io.WriteString(t.tw, printable(fmt.Sprint(c)))
	}
	_, _ = io.WriteString(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// writeJSONLines writes each of vs as one line of JSON.
func writeJSONLines[T any](w io.Writer, vs []T) error {
	for _, v := range vs {
		if err := writeJSON(w, v); err != nil {
			return err
		}
	}
	return nil
}

// compactJSON returns b as compact JSON text; an empty body is null (as the
// contract reads it) and a body that is not JSON is returned quoted.
func compactJSON(b []byte) string {
	if len(bytes.TrimSpace(b)) == 0 {
		return "null"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		q, _ := json.Marshal(string(b))
		return string(q)
	}
	return buf.String()
}

// rawJSON is b for embedding in JSON output: as is when it is JSON, null
// when empty, and otherwise ok is false.
func rawJSON(b []byte) (json.RawMessage, bool) {
	if len(bytes.TrimSpace(b)) == 0 {
		return json.RawMessage("null"), true
	}
	if !json.Valid(b) {
		return nil, false
	}
	return json.RawMessage(compactJSON(b)), true
}

// formatTime is the time format of the tables: UTC, milliseconds.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// orDash shows an empty value as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printable returns s for a terminal: every rune that is not printable
// (control characters such as ESC, CR, tab and newline, C1 controls,
// bidirectional overrides, invalid UTF-8) is written as its Go escape
// (\x1b, \r, \u202e), so that a task id, holder, type, reason or payload
// from a worker shows what it holds instead of moving the cursor, clearing
// the screen or reordering the line. Backslashes are left alone: the human
// form is for reading, and -json gives the exact value.
func printable(s string) string { return escape(s, false) }

// printableLines is printable for a block of text laid out in lines (an
// indented JSON document): its newlines stay.
func printableLines(s string) string { return escape(s, true) }

func escape(s string, keepNewlines bool) string {
	shown := func(r rune) bool { return unicode.IsPrint(r) || keepNewlines && r == '\n' }
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !shown(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case shown(r):
			b.WriteString(s[i : i+size])
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\r', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}
