package console

import (
	"fmt"
	"strings"
)

// series counts events per second (Unix seconds), over a bounded window.
type series map[int64]int64

// add counts n events in second s.
func (s series) add(sec, n int64) { s[sec] += n }

// trim forgets the seconds before from.
func (s series) trim(from int64) {
	for sec := range s {
		if sec < from {
			delete(s, sec)
		}
	}
}

// sum counts the events of seconds from..to, both included.
func (s series) sum(from, to int64) int64 {
	var n int64
	for sec, c := range s {
		if sec >= from && sec <= to {
			n += c
		}
	}
	return n
}

// chartWidth and chartHeight are the size of a flow chart's drawing, in
// the SVG's own units (the page scales it).
const (
	chartWidth  = 600
	chartHeight = 60
)

// points draws the seconds from..to of the sum of ss as the points of an
// SVG polyline, scaled so that the busiest second touches the top, and
// returns that second's count.
func points(from, to int64, ss ...series) (string, int64) {
	n := to - from + 1
	if n < 2 {
		return "", 0
	}
	vals := make([]int64, n)
	var peak int64
	for i := range vals {
		for _, s := range ss {
			vals[i] += s[from+int64(i)]
		}
		peak = max(peak, vals[i])
	}
	var b strings.Builder
	for i, v := range vals {
		x := float64(i) * chartWidth / float64(n-1)
		y := float64(chartHeight)
		if peak > 0 {
			y -= float64(v) * (chartHeight - 2) / float64(peak)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", x, y)
	}
	return b.String(), peak
}
