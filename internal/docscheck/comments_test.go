package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// The limits of CONTRIBUTING.md that a program can check.
const (
	// maxDocLines bounds a package's doc.go: an overview, a state diagram and
	// one rule a bullet fit in it; the mechanics sit beside their code.
	maxDocLines = 120
	// maxDocWidth bounds a prose line of a doc.go, as godoc shows it.
	maxDocWidth = 80
	// maxCommentWidth bounds any comment line of the tree, a tab counted as
	// four columns.
	maxCommentWidth = 100
	// maxSentenceWords bounds a sentence of the package docs written in
	// river's shape (shapedDocs). The house aims at about 25; a rule that
	// names its tests runs longer.
	maxSentenceWords = 40
)

// shapedDocs are the package docs held to maxSentenceWords.
var shapedDocs = []string{"pkg/fence/doc.go", "pkg/worker/doc.go", "internal/ingest/doc.go", "internal/projector/doc.go"}

// commentText returns the text of a // comment line and whether it is
// prose: a code block (a tab after //) and a directive are not.
func commentText(line string) (string, bool) {
	s := strings.TrimLeft(line, " \t")
	if !strings.HasPrefix(s, "//") || strings.HasPrefix(s, "//go:") || strings.HasPrefix(s, "//\t") {
		return "", false
	}
	return strings.TrimSpace(s[2:]), true
}

// width is how many columns line takes, a tab counted as four.
func width(line string) int {
	return utf8.RuneCountInString(strings.ReplaceAll(line, "\t", "    "))
}

// docProblems lists what breaks the doc.go rules in the file's text.
func docProblems(name, text string, shaped bool) []string {
	var out []string
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > maxDocLines {
		out = append(out, name+": "+itoa(len(lines))+" lines, more than "+itoa(maxDocLines)+
			": keep the rules here and move the mechanics beside their code")
	}
	for i, l := range lines {
		if t, prose := commentText(l); prose && width(l) > maxDocWidth && strings.ContainsRune(t, ' ') {
			out = append(out, name+":"+itoa(i+1)+": "+itoa(width(l))+" columns, more than "+itoa(maxDocWidth))
		}
	}
	if shaped {
		for _, s := range sentences(lines) {
			if n := len(strings.Fields(s)); n > maxSentenceWords {
				out = append(out, name+": a sentence of "+itoa(n)+" words, more than "+
					itoa(maxSentenceWords)+": "+s)
			}
		}
	}
	return out
}

// sentenceEnd splits prose after a full stop, a question mark or a
// semicolon that is followed by what starts a sentence.
var sentenceEnd = regexp.MustCompile(`[.;?]\s+[A-Z(` + "`" + `"]`)

// sentences joins the prose lines of a doc comment into paragraphs (a blank
// comment line, a code block or a list bullet ends one) and splits them.
func sentences(lines []string) []string {
	var out, para []string
	flush := func() {
		p := strings.Join(para, " ")
		para = para[:0]
		for p != "" {
			loc := sentenceEnd.FindStringIndex(p)
			if loc == nil {
				out = append(out, p)
				break
			}
			out = append(out, p[:loc[0]+1])
			p = p[loc[1]-1:]
		}
	}
	for _, l := range lines {
		t, prose := commentText(l)
		if !prose || t == "" || strings.HasPrefix(t, "- ") || strings.HasPrefix(t, "# ") {
			flush()
			t = strings.TrimPrefix(t, "- ")
		}
		if prose && t != "" && !strings.HasPrefix(t, "# ") {
			para = append(para, t)
		}
	}
	flush()
	return out
}

// Every package doc is short enough to read in one pass: at most
// maxDocLines lines of prose at most maxDocWidth wide, and the docs in
// river's shape keep their sentences short.
func TestPackageDocsAreShort(t *testing.T) {
	shaped := map[string]bool{}
	for _, p := range shapedDocs {
		shaped[filepath.Join(repoRoot, p)] = true
	}
	docs := 0
	for _, f := range treeFiles(t, repoRoot, ".go") {
		if filepath.Base(f) != "doc.go" {
			continue
		}
		docs++
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range docProblems(rel(f), string(b), shaped[f]) {
			t.Error(p)
		}
		delete(shaped, f)
	}
	if docs < 10 {
		t.Fatalf("found %d doc.go files; the walk is broken", docs)
	}
	for f := range shaped {
		t.Errorf("%s: listed in shapedDocs but not found", rel(f))
	}
}

// No comment line of the tree runs past maxCommentWidth columns, code
// blocks in comments aside.
func TestCommentLinesFitTheWidth(t *testing.T) {
	files := treeFiles(t, repoRoot, ".go")
	if len(files) < 100 {
		t.Fatalf("found %d Go files; the walk is broken", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			if t2, prose := commentText(l); prose && width(l) > maxCommentWidth && strings.ContainsRune(t2, ' ') {
				t.Errorf("%s:%d: comment line of %d columns, more than %d", rel(f), i+1, width(l), maxCommentWidth)
			}
		}
	}
}

// The checks find what they look for: a doc.go one line too long, a prose
// line one column too wide and a long sentence are each reported, and the
// same text within the limits is not.
func TestDocChecksReportWhatTheyLookFor(t *testing.T) {
	within := "// Package p does one thing.\n//\n//\tcode blocks may run as wide as they need to, as wide as this line is\npackage p\n"
	if p := docProblems("ok.go", within, true); len(p) != 0 {
		t.Fatalf("within the limits, got %q", p)
	}
	long := strings.Repeat("// A line.\n", maxDocLines) + "package p\n"
	if p := docProblems("long.go", long, false); len(p) != 1 || !strings.Contains(p[0], "121 lines") {
		t.Errorf("a doc.go of %d lines: got %q", maxDocLines+1, p)
	}
	wide := "// " + strings.Repeat("word ", (maxDocWidth-3)/5) + "wid\npackage p\n"
	if width(strings.Split(wide, "\n")[0]) != maxDocWidth+1 {
		t.Fatalf("the wide line is %d columns", width(strings.Split(wide, "\n")[0]))
	}
	if p := docProblems("wide.go", wide, false); len(p) != 1 || !strings.Contains(p[0], "81 columns") {
		t.Errorf("a prose line of %d columns: got %q", maxDocWidth+1, p)
	}
	words := "// " + strings.Repeat("word ", maxSentenceWords) + "more. Short one.\npackage p\n"
	words = strings.ReplaceAll(words, "word word word word word ", "word word word word word\n// ")
	if p := docProblems("words.go", words, true); len(p) != 1 || !strings.Contains(p[0], "41 words") {
		t.Errorf("a sentence of %d words: got %q", maxSentenceWords+1, p)
	}
	if p := docProblems("words.go", words, false); len(p) != 0 {
		t.Errorf("sentences of a doc not in river's shape are not counted: got %q", p)
	}
}
