package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/flowness/ledger/internal/cli"
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
func writeJSON(w io.Writer, v any) error { return cli.WriteJSON(w, v) }

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

// printable is cli.Printable: what a worker sent, shown without driving
// the terminal.
func printable(s string) string { return cli.Printable(s) }

// printableLines is cli.PrintableLines, for an indented JSON document.
func printableLines(s string) string { return cli.PrintableLines(s) }
