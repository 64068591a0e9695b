package benchreport

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// progress keeps one line on its writer up to date while a phase runs:
// "bench: pipeline 23,000/50,000 events (46%) 21,400 ev/s", rewritten in
// place with "\r". Every write to the writer goes through its mutex.
type progress struct {
	w io.Writer

	mu    sync.Mutex
	width int // runes of the line on screen; 0 when none is
	stop  chan struct{}
	done  chan struct{}
}

func newProgress(w io.Writer) *progress { return &progress{w: w} }

// say writes a line of its own (a setup step), above the progress line.
func (p *progress) say(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintf(p.w, "bench: %s\n", fmt.Sprintf(format, args...))
}

// begin shows phase's progress until end: count reports the events done
// so far, of total.
func (p *progress) begin(phase string, total int, count func() int64) {
	p.end()
	start := time.Now()
	show := func() {
		n := count()
		rate := float64(n) / max(time.Since(start).Seconds(), 1e-9)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.lineLocked(fmt.Sprintf("bench: %s %s/%s events (%d%%) %s ev/s",
			phase, group(n), group(int64(total)), n*100/int64(max(total, 1)), group(int64(rate))))
	}
	stop, done := make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.stop, p.done = stop, done
	p.mu.Unlock()
	go func() {
		defer close(done)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				show() // the phase's final state, so that every phase shows at least once
				return
			case <-t.C:
				show()
			}
		}
	}()
}

// end stops the current phase's updates, leaving its last line shown.
func (p *progress) end() {
	p.mu.Lock()
	stop, done := p.stop, p.done
	p.stop, p.done = nil, nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

// close stops the updates and clears the line.
func (p *progress) close() {
	p.end()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
}

func (p *progress) lineLocked(s string) {
	n := utf8.RuneCountInString(s)
	pad := ""
	if p.width > n {
		pad = strings.Repeat(" ", p.width-n)
	}
	fmt.Fprintf(p.w, "\r%s%s", s, pad)
	p.width = n
}

func (p *progress) clearLocked() {
	if p.width > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
		p.width = 0
	}
}

// group writes n with thousands separators: 1234567 → "1,234,567".
func group(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
