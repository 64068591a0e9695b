// Package conformance reads the contract's conformance cases
// (conformance/cases/*.json in the repository) and judges a client's
// observations against them. The cases are raw protocol: subjects, headers
// and bodies a client sends, and the replies, acks, receipts and projections
// the ledger must answer. Every client runs the same files: the Go runner
// in this package's tests, the TypeScript one in sdk/typescript/test, and a
// third client brings its own runner of a few hundred lines.
//
// A case is a list of steps, run in order against a fresh ledger (16
// partitions, a gap window of 2 s):
//
//   - request: send body to subject as a NATS request; the reply's headers
//     and JSON body must match expect.headers and expect.body.
//   - publish: send body with headers to subject as a request, so LEDGER_IN's
//     ack is the reply (expect.ack); when expect.receipt is given, wait for the
//     first receipt, after the publish, of the message's event id (its
//     Nats-Msg-Id up to the first ':', EventID) on ledger.receipt.<holder>.
//   - receipt: wait for the first receipt of event_id, an earlier publish's.
//     A receipt message whose body is a JSON array (a batch's receipts,
//     docs/contract.md §3) counts as each receipt in it.
//   - projection: read task's value in ledger_tasks by direct get until it
//     matches expect.value (10 s at most).
//   - sleep: wait ms milliseconds.
//
// Strings "${id_NAME}" are replaced by a fresh ULID, the same for NAME
// throughout the case. Expected values match as a subset: an object names
// the fields that must be there, with these special strings: "$any" (present),
// "$absent" (missing, null or false), "$positive" (a number above 0),
// "$contains:TEXT" (a string containing TEXT), "$inbox" (the name of a
// stream that takes workers' events: LEDGER_IN, or a principal's own
// LEDGER_IN_<principal> where the ledger gives principals inboxes). null
// matches null or missing.
package conformance

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/oklog/ulid/v2"
)

// EventID is the event id of a Nats-Msg-Id: the text before its first ':'
// (docs/contract.md §2).
func EventID(msgID string) string {
	id, _, _ := strings.Cut(msgID, ":")
	return id
}

// GapWindowMillis is the ingest's gap window the cases are written for.
const GapWindowMillis = 2000

// Case is one file of cases.
type Case struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Steps       []Step `json:"steps"`
}

// Step is one action of a case and what the ledger must answer.
type Step struct {
	Step    string            `json:"step"`
	Note    string            `json:"note"`
	Subject string            `json:"subject"`
	Headers map[string]string `json:"headers"`
	// Body is a request's JSON body, or a publish's body as a string.
	Body    json.RawMessage `json:"body"`
	EventID string          `json:"event_id"`
	Task    string          `json:"task"`
	Millis  int             `json:"ms"`
	Expect  Expect          `json:"expect"`
}

// Expect is what a step's answers must match.
type Expect struct {
	Headers map[string]string `json:"headers"`
	Body    any               `json:"body"`
	Ack     any               `json:"ack"`
	Receipt any               `json:"receipt"`
	Value   any               `json:"value"`
}

// Load reads every case file in dir, in name order. Each case's ids are
// fresh ULIDs.
func Load(dir string) ([]Case, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var cases []Case
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		b = WithIDs(b)
		var c Case
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("conformance: %s: %w", filepath.Base(f), err)
		}
		for i, s := range c.Steps {
			if !slices.Contains([]string{"request", "publish", "receipt", "projection", "sleep"}, s.Step) {
				return nil, fmt.Errorf("conformance: %s: step %d: unknown step %q", filepath.Base(f), i+1, s.Step)
			}
		}
		cases = append(cases, c)
	}
	if len(cases) == 0 {
		return nil, fmt.Errorf("conformance: no cases in %s", dir)
	}
	return cases, nil
}

var idRef = regexp.MustCompile(`\$\{id_[A-Za-z0-9_]+\}`)

// WithIDs replaces every ${id_NAME} in a case file with a ULID, one per NAME.
func WithIDs(b []byte) []byte {
	ids := map[string]string{}
	return idRef.ReplaceAllFunc(b, func(ref []byte) []byte {
		id, ok := ids[string(ref)]
		if !ok {
			id = ulid.MustNew(ulid.Now(), rand.Reader).String()
			ids[string(ref)] = id
		}
		return []byte(id)
	})
}

// PublishBody is a publish step's body: the JSON string's text.
func (s Step) PublishBody() ([]byte, error) {
	if len(s.Body) == 0 {
		return nil, nil
	}
	var text string
	if err := json.Unmarshal(s.Body, &text); err != nil {
		return nil, fmt.Errorf("a publish body is a JSON string of the bytes to send: %w", err)
	}
	return []byte(text), nil
}

// inboxName is LEDGER_IN or a principal's inbox (docs/operations.md,
// "Inboxes per principal").
var inboxName = regexp.MustCompile(`^LEDGER_IN(_[A-Za-z0-9_-]{1,64})?$`)

// Match reports where got (decoded JSON) differs from want, or "" when it
// matches; path names the place for the message.
func Match(path string, want, got any) string {
	switch w := want.(type) {
	case string:
		switch {
		case w == "$any":
			if got == nil {
				return path + ": missing"
			}
			return ""
		case w == "$absent":
			if got != nil && got != false {
				return fmt.Sprintf("%s: want absent, got %v", path, got)
			}
			return ""
		case w == "$positive":
			if n, ok := got.(float64); !ok || n <= 0 {
				return fmt.Sprintf("%s: want a positive number, got %v", path, got)
			}
			return ""
		case w == "$inbox":
			if name, ok := got.(string); !ok || !inboxName.MatchString(name) {
				return fmt.Sprintf("%s: want LEDGER_IN or LEDGER_IN_<principal>, got %v", path, got)
			}
			return ""
		case strings.HasPrefix(w, "$contains:"):
			if s, ok := got.(string); !ok || !strings.Contains(s, strings.TrimPrefix(w, "$contains:")) {
				return fmt.Sprintf("%s: want a string containing %q, got %v", path, strings.TrimPrefix(w, "$contains:"), got)
			}
			return ""
		}
		if got != w {
			return fmt.Sprintf("%s: want %q, got %v", path, w, got)
		}
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: want an object, got %v", path, got)
		}
		for _, k := range slices.Sorted(maps.Keys(w)) {
			if d := Match(path+"."+k, w[k], g[k]); d != "" {
				return d
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: want an array of %d, got %v", path, len(w), got)
		}
		for i := range w {
			if d := Match(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); d != "" {
				return d
			}
		}
	default: // numbers, booleans, null
		if got != want {
			return fmt.Sprintf("%s: want %v, got %v", path, want, got)
		}
	}
	return ""
}
