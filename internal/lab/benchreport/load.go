package benchreport

import (
	"crypto/rand"
	"strconv"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// eventType is the type of every benchmark event.
const eventType = "progress"

// filler pads each payload to about 200 bytes.
var filler = strings.Repeat("x", 170)

// payload is the JSON of a task's step'th event: ~200 bytes.
func payload(step int64) []byte {
	b := make([]byte, 0, 224)
	b = append(b, `{"step":`...)
	b = strconv.AppendInt(b, step, 10)
	b = append(b, `,"note":"`...)
	b = append(b, filler...)
	return append(b, `"}`...)
}

// load is a set of tasks, each on its default partition (the SDK's
// fnv1a32(task) mod 16), that every phase spreads its events over.
type load struct {
	tasks []string
	parts []int // parts[i] is the partition of tasks[i]
	index map[string]int
}

func newLoad(prefix string, n int) *load {
	l := &load{tasks: make([]string, n), parts: make([]int, n), index: make(map[string]int, n)}
	for i := range n {
		l.tasks[i] = prefix + strconv.Itoa(i)
		l.parts[i] = wire.PartitionOf(l.tasks[i], partitions)
		l.index[l.tasks[i]] = i
	}
	return l
}

// events returns n events, tasks taken round robin, each task's versions
// counting from 1, all under one holder whose generation on partition p is
// gens[p].
func (l *load) events(n int, holder string, gens [partitions]int64) []fence.Event {
	out := make([]fence.Event, n)
	versions := make([]int64, len(l.tasks))
	for j := range out {
		t := j % len(l.tasks)
		versions[t]++
		p := l.parts[t]
		out[j] = fence.Event{ID: ulid.Make().String(), Partition: p, Task: l.tasks[t], Version: versions[t],
			Type: eventType, Payload: payload(versions[t]), Holder: holder, Generation: gens[p]}
	}
	return out
}

// hotLoad is one task on each partition: every event of a phase on 16
// tasks, so each task takes hundreds of versions a second.
func hotLoad(prefix string) *load {
	l := &load{index: map[string]int{}}
	have := map[int]bool{}
	for i := 0; len(have) < partitions; i++ {
		task := prefix + strconv.Itoa(i)
		p := wire.PartitionOf(task, partitions)
		if have[p] {
			continue
		}
		have[p] = true
		l.index[task] = len(l.tasks)
		l.tasks, l.parts = append(l.tasks, task), append(l.parts, p)
	}
	return l
}

// runID is a short random id that keeps one run's tasks and holders apart
// from any earlier run's on the same database.
func runID() string { return strings.ToLower(rand.Text()[:8]) }

// only is the part of l whose tasks are on the partitions keep accepts, in
// l's order.
func (l *load) only(keep func(partition int) bool) *load {
	out := &load{index: map[string]int{}}
	for i, task := range l.tasks {
		if keep(l.parts[i]) {
			out.index[task] = len(out.tasks)
			out.tasks = append(out.tasks, task)
			out.parts = append(out.parts, l.parts[i])
		}
	}
	return out
}
