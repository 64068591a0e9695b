package main

import (
	"strings"
	"testing"
	"unicode"
)

// FuzzDescribe feeds any change of the bucket (key, operation header and
// value) to the line the watcher prints: it never panics, prints only
// printable runes, and never prints a version that does not move forward.
func FuzzDescribe(f *testing.F) {
	for _, seed := range []struct{ task, op, data string }{
		{"report-1", "", `{"task":"report-1","partition":9,"version":3,"status":"running","data":{"step":3},"seq":12,"updated_at":"2026-03-01T12:00:00Z","gap":null}`},
		{"report-1", "", `{"task":"report-1","version":5,"status":"running","data":null,"gap":{"next_version":4,"buffered":1,"since":"2026-03-01T12:00:00Z"}}`},
		{"report-1", "", `{"version":2,"status":"running","data":"\u009b31m red \u202e"}`},
		{"report-1", "", "{\"version\":2,\"status\":\"running\",\"data\":\"\u009b31m red \u202e\"}"}, // raw UTF-8 C1 control and bidi override
		{"report-1", "", "{\"version\":2,\"data\":\"\x1b[2J\"}"},
		{"report-1", "DEL", ``},
		{"report-1", "PURGE", ``},
		{"report-1", "", `not json`},
		{"report-1", "", `{"version":"7"}`},
		{"report-1", "", `{"version":1e400}`},
		{"\x1b[2J", "", `{"version":1}`},
		{"report-1", "", "\xff\xfe"},
	} {
		f.Add(seed.task, seed.op, []byte(seed.data))
	}
	f.Fuzz(func(t *testing.T, task, op string, data []byte) {
		seen := map[string]int64{}
		for i := 0; i < 2; i++ { // the same change twice: printed at most once
			line, ok := describe(seen, task, op, data)
			if !ok {
				if i == 0 {
					t.Fatalf("a first change printed nothing")
				}
				continue
			}
			for _, r := range line {
				if !unicode.IsPrint(r) && !strings.ContainsRune("\t", r) {
					t.Fatalf("line %q carries %U", line, r)
				}
			}
			if i == 1 && op != "DEL" && op != "PURGE" && strings.Contains(line, ": version ") {
				t.Fatalf("the same version printed twice: %q", line)
			}
		}
	})
}
