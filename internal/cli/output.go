package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// WriteJSON writes v as one line of JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// Printable returns s for a terminal: every rune that is not printable
// (control characters such as ESC, CR, tab and newline, C1 controls,
// bidirectional overrides, invalid UTF-8) is written as its Go escape
// (\x1b, \r, \u202e), so that a task id, holder, type, reason or payload
// from a worker shows what it holds instead of moving the cursor, clearing
// the screen or reordering the line. Backslashes are left alone: the human
// form is for reading, and -json gives the exact value.
func Printable(s string) string { return escape(s, false) }

// PrintableLines is Printable for a block of text laid out in lines: its
// newlines stay.
func PrintableLines(s string) string { return escape(s, true) }

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
