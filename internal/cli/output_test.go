package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestPrintableShowsControlsAsEscapes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"worker-a", "worker-a"},
		{"café ✓ 报告", "café ✓ 报告"},
		{"\x1b[2J", `\x1b[2J`},
		{"fake\rreal", `fake\rreal`},
		{"a\tb\nc", `a\tb\nc`},
		{"\x1b]0;owned\x07", `\x1b]0;owned\a`},
		{"\u202eevil", `\u202eevil`},
		{"\u009b2J", `\u009b2J`},
		{"del\x7f", `del\x7f`},
		{"bad\xffutf8", `bad\xffutf8`},
		{"nbsp\u00a0", `nbsp\u00a0`},
	} {
		require.Equal(t, c.want, Printable(c.in), "%q", c.in)
	}
	require.Equal(t, "{\n  \"a\": \"\\u202e\"\n}", PrintableLines("{\n  \"a\": \"\u202e\"\n}"), "an indented document keeps its lines")
}

// The error a command fails with quotes what it was given: it is escaped
// like the tables.
func TestErrorsAreEscaped(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.Equal(t, 1, exitCode("ledgerctl", &cmdError{cmd: "ledgerctl task", err: errors.New("no task \x1b[2J here")}, &out))
	require.Equal(t, "ledgerctl task: no task \\x1b[2J here\n", out.String())
}

// FuzzPrintable: whatever a worker sends, what reaches the terminal holds
// only printable runes (and, for a document, newlines), and what was
// printable already is shown unchanged.
func FuzzPrintable(f *testing.F) {
	for _, seed := range []string{"worker-a", "\x1b[2J", "fake\rreal", "\x1b]0;owned\x07", "\u202eevil", "\u009b2J",
		"del\x7f", "bad\xffutf8", "a\tb\nc", `{"step":1}`, "café ✓", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, lines := range []bool{false, true} {
			got := escape(s, lines)
			if !utf8.ValidString(got) {
				t.Fatalf("escape(%q, %v) = %q: not valid UTF-8", s, lines, got)
			}
			for _, r := range got {
				if !unicode.IsPrint(r) && !(lines && r == '\n') {
					t.Fatalf("escape(%q, %v) = %q holds %U", s, lines, got, r)
				}
			}
			clean := utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool {
				return !unicode.IsPrint(r) && !(lines && r == '\n')
			}) < 0
			if clean && got != s {
				t.Fatalf("escape(%q, %v) = %q: printable text changed", s, lines, got)
			}
		}
	})
}
