// Package docscheck holds the checks the project's Markdown must pass: every
// relative link reaches a file, and every anchor a heading.
package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is two levels up from this package.
const repoRoot = "../.."

// link is a Markdown inline link's target: [text](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// heading is an ATX heading line.
var heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// markdownFiles lists the repository's Markdown files, leaving out
// dependencies and build output.
func markdownFiles(t *testing.T) []string { return treeFiles(t, repoRoot, ".md") }

// treeFiles lists the files below root whose names end in suffix, leaving
// out dependencies, build output and test data.
func treeFiles(t *testing.T, root, suffix string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", "bin", "dist", "testdata", "vendor":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, suffix) {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped except '-' and '_', spaces to '-'.
func slug(h string) string {
	h = strings.ToLower(h)
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_':
			b.WriteRune(r)
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the anchors of a Markdown file's headings, numbering
// repeats as GitHub does (name, name-1, ...).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		m := heading.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		// Inline code and links in a heading keep only their text.
		h := strings.NewReplacer("`", "", "[", "", "]", "").Replace(m[1])
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[s+"-"+itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

// withoutCode blanks fenced code blocks and inline code, where a link is
// only text.
func withoutCode(text string) string {
	var b strings.Builder
	fence := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
		}
		if fence {
			b.WriteString("\n")
			continue
		}
		parts := strings.Split(line, "`")
		for i := 1; i < len(parts); i += 2 {
			parts[i] = ""
		}
		b.WriteString(strings.Join(parts, "``") + "\n")
	}
	return b.String()
}

// Every relative link in the repository's Markdown reaches a file or
// folder, and every anchor (#…) a heading of the file it names.
func TestRelativeLinksAndAnchorsResolve(t *testing.T) {
	files := markdownFiles(t)
	if len(files) < 5 {
		t.Fatalf("found %d Markdown files; the walk is broken", len(files))
	}
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := cache[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		cache[path] = anchors(string(b))
		return cache[path]
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(withoutCode(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(target, "#")
			resolved := f
			if path != "" {
				resolved = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s: link %q: no such file", rel(f), target)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(resolved, ".md") && !anchorsOf(resolved)[frag] {
				t.Errorf("%s: link %q: no heading with anchor #%s in %s", rel(f), target, frag, rel(resolved))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d relative links; the link pattern is broken", checked)
	}
}

func rel(p string) string {
	r, err := filepath.Rel(repoRoot, p)
	if err != nil {
		return p
	}
	return r
}

// The anchor rule is GitHub's.
func TestSlugIsGitHubs(t *testing.T) {
	for h, want := range map[string]string{
		"9. Who may do what: an authenticated deployment": "9-who-may-do-what-an-authenticated-deployment",
		"Poolers and managed PostgreSQL":                  "poolers-and-managed-postgresql",
		"`ledgerctl chaos` flags":                         "ledgerctl-chaos-flags",
	} {
		if got := slug(strings.ReplaceAll(h, "`", "")); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}
