package benchreport

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// WorkerOptions configure one worker process of an external run (the
// hidden "ledgerlab bench worker"), which RunExternal starts.
type WorkerOptions struct {
	// NATSURL is the deployment's NATS server.
	NATSURL string
	// Run is the run's id: the tasks are bench-<run>-<i>, the holder
	// bench-<run>.w<worker>.
	Run string
	// Worker is this worker's number, 0..Workers-1; it holds the
	// partitions p with p mod Workers == Worker and publishes the run's
	// events of the tasks on them.
	Worker, Workers int
	// Events is the whole run's event count, over every worker, and Tasks
	// the new tasks they are spread over; default taskCount(Events).
	Events, Tasks int
	// Raw publishes raw JetStream messages with the contract's headers
	// instead of going through the Go SDK; default the SDK.
	Raw bool
	// Rate, when above 0, paces the run: the workers publish Rate events a
	// second in all (each its share's part of it), and each measures every
	// event's publish → receipt latency. 0 publishes at full speed.
	Rate int
	// Bare makes the worker the bare pipeline of a paced run instead: it
	// publishes its events into the bare stream and consumes them itself
	// with the set-based fenced insert into ledger_bench (DatabaseURL),
	// which the coordinator created, and measures publish → commit.
	Bare        bool
	DatabaseURL string
	// SDKBatchMax is the SDK clients' worker.Config.BatchMax: 1 sends
	// every event alone; default 0, the SDK's default (batches on).
	SDKBatchMax int

	// Logger receives the SDK's logs; default discards them.
	Logger *slog.Logger
}

func (o WorkerOptions) validate() error {
	switch {
	case o.NATSURL == "":
		return errors.New("benchreport: worker: no NATS URL")
	case !wire.ValidID("bench-" + o.Run):
		return fmt.Errorf("benchreport: worker: run id %q is not [A-Za-z0-9_-]", o.Run)
	case o.Workers < 1 || o.Workers > partitions || o.Worker < 0 || o.Worker >= o.Workers:
		return fmt.Errorf("benchreport: worker %d of %d: want 0 <= worker < workers <= %d", o.Worker, o.Workers, partitions)
	case o.Events < 1:
		return fmt.Errorf("benchreport: worker: events must be at least 1, got %d", o.Events)
	case o.Tasks < 0 || o.Tasks > MaxTasks:
		return fmt.Errorf("benchreport: worker: tasks must be 0 (the default) to %d, got %d", MaxTasks, o.Tasks)
	case o.Rate < 0:
		return fmt.Errorf("benchreport: worker: rate must be 0 (full speed) or more, got %d", o.Rate)
	case o.Bare && (o.Rate == 0 || o.Raw || o.DatabaseURL == ""):
		return errors.New("benchreport: worker: the bare pipeline is paced (-rate), not raw, and needs a database URL")
	}
	return nil
}

func (o WorkerOptions) holder() string {
	return wire.Holder("bench-"+o.Run, fmt.Sprintf("w%d", o.Worker))
}

// share is this worker's part of the run's load: the tasks on its
// partitions, and how many events each gets (as spread over every task of
// the run).
func (o WorkerOptions) share() (*load, []int) {
	all := newLoad("bench-"+o.Run+"-", cmp.Or(o.Tasks, taskCount(o.Events)))
	counts := spread(o.Events, len(all.tasks))
	mine := all.only(func(p int) bool { return p%o.Workers == o.Worker })
	out := make([]int, len(mine.tasks))
	for i, task := range mine.tasks {
		out[i] = counts[all.index[task]]
	}
	return mine, out
}

// The states a worker reports on its stdout, one JSON line each.
const (
	workerReady = "ready"
	workerDone  = "done"
)

// workerLine is one line a worker writes on its stdout.
type workerLine struct {
	State string `json:"state"`
	// Events, FirstPublish and LastReceipt are set when done: the events
	// it published, when it published the first (Unix ns) and when the
	// last receipt arrived.
	Events       int   `json:"events,omitempty"`
	FirstPublish int64 `json:"first_publish_ns,omitempty"`
	LastReceipt  int64 `json:"last_receipt_ns,omitempty"`
	// InFirstWindow is how many receipts arrived within FirstWindow of the
	// first publish: the run's start, against its steady rate.
	InFirstWindow int `json:"in_first_window,omitempty"`
	// Latency is set by a paced run: its events' latencies as the
	// non-empty [bucket, count] pairs of a histogram (histogram.go).
	Latency [][]int64 `json:"latency,omitempty"`
}

// maxWorkerLine bounds a line from a worker: a few dozen bytes, or with
// latencies at most histBuckets pairs of about 20 bytes.
const maxWorkerLine = 64 << 10

// decodeWorkerLine reads a line of a worker's stdout, refusing anything a
// worker does not write.
func decodeWorkerLine(b []byte) (workerLine, error) {
	if len(b) > maxWorkerLine {
		return workerLine{}, fmt.Errorf("a worker line of %d bytes", len(b))
	}
	var l workerLine
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.DisallowUnknownFields()
	if err := d.Decode(&l); err != nil {
		return workerLine{}, fmt.Errorf("a worker line that does not decode: %w", err)
	}
	// More is false before a stray '}' or ']': only the end of the line
	// ends it.
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return workerLine{}, errors.New("a worker line with more than one value")
	}
	switch l.State {
	case workerReady:
		if l.Events != 0 || l.FirstPublish != 0 || l.LastReceipt != 0 || l.InFirstWindow != 0 || l.Latency != nil {
			return workerLine{}, errors.New("a ready line with results")
		}
	case workerDone:
		switch {
		case l.Events < 0 || l.FirstPublish < 0 || l.LastReceipt < 0 || l.InFirstWindow < 0:
			return workerLine{}, errors.New("a done line with negative figures")
		case l.InFirstWindow > l.Events:
			return workerLine{}, errors.New("a done line with more receipts in the first window than events")
		case l.Events > 0 && (l.FirstPublish == 0 || l.LastReceipt < l.FirstPublish):
			return workerLine{}, errors.New("a done line whose last receipt is not after its first publish")
		case l.Events == 0 && (l.FirstPublish != 0 || l.LastReceipt != 0):
			return workerLine{}, errors.New("a done line with times but no events")
		case l.Latency != nil:
			if err := checkBuckets(l.Latency, l.Events); err != nil {
				return workerLine{}, fmt.Errorf("a done line with %w", err)
			}
		}
	default:
		return workerLine{}, fmt.Errorf("a worker line of state %q", l.State)
	}
	return l, nil
}

// publisher is how a worker publishes its share: through the SDK or raw.
type publisher interface {
	// publish publishes counts[i] events of each task of the share, new
	// tasks whose versions start at 1, and returns once every one has its
	// commit receipt: when the first was published and when the last
	// receipt arrived (Unix ns), and how many receipts arrived within
	// FirstWindow of the first publish. It fails on any other verdict.
	// With a rate above 0 it publishes that many events a second and
	// measures each event's latency.
	publish(ctx context.Context, counts []int, rate float64) (runTimes, error)
	// close gives the leases back and closes the connection.
	close()
}

// RunWorker runs one worker of an external run: it connects, takes the
// leases of its partitions, writes a "ready" line on stdout and waits for
// a "go" line on stdin; then it publishes its share at full speed, waits
// for every receipt, and writes a "done" line with its times. It releases
// its leases and returns when stdin ends (RunExternal closes it once it has
// read every process's CPU time).
func RunWorker(ctx context.Context, o WorkerOptions, stdin io.Reader, stdout io.Writer) error {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := o.validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := make(chan struct{})
	go readControl(stdin, start, cancel)

	share, counts := o.share()
	nc, err := nats.Connect(o.NATSURL, nats.Name("bench-"+o.holder()), nats.CustomInboxPrefix(wire.InboxPrefix(wire.Principal(o.holder()))))
	if err != nil {
		return fmt.Errorf("benchreport: worker %d: connect: %w", o.Worker, err)
	}
	var p publisher
	switch {
	case o.Bare:
		p, err = newBarePublisher(ctx, nc, o, share)
	case o.Raw:
		p, err = newRawPublisher(ctx, nc, o, share)
	default:
		p, err = newSDKPublisher(ctx, nc, o, share)
	}
	if err != nil {
		nc.Close()
		return fmt.Errorf("benchreport: worker %d: %w", o.Worker, err)
	}
	defer p.close()
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(workerLine{State: workerReady}); err != nil {
		return fmt.Errorf("benchreport: worker %d: %w", o.Worker, err)
	}
	select {
	case <-start:
	case <-ctx.Done():
		return fmt.Errorf("benchreport: worker %d: stopped before it was told to go: %w", o.Worker, ctx.Err())
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	rt, err := p.publish(ctx, counts, o.rateOf(total))
	if err != nil {
		return fmt.Errorf("benchreport: worker %d: %w", o.Worker, err)
	}
	done := workerLine{State: workerDone, Events: total, FirstPublish: rt.first, LastReceipt: rt.last, InFirstWindow: rt.inFirst}
	if rt.lat != nil {
		done.Latency = rt.lat.buckets()
	}
	if err := enc.Encode(done); err != nil {
		return fmt.Errorf("benchreport: worker %d: %w", o.Worker, err)
	}
	<-ctx.Done() // stdin ended: the coordinator has read the CPU times
	return nil
}

// rateOf is this worker's part of the run's rate: its events' share of the
// run's, so that the workers finish together; 0 at full speed.
func (o WorkerOptions) rateOf(events int) float64 {
	if o.Rate == 0 {
		return 0
	}
	return float64(o.Rate) * float64(events) / float64(o.Events)
}

// readControl closes start on a "go" line and calls stop when stdin ends:
// a worker whose coordinator is gone stops too.
func readControl(stdin io.Reader, start chan struct{}, stop func()) {
	defer stop()
	s := bufio.NewScanner(stdin)
	once := sync.OnceFunc(func() { close(start) })
	for s.Scan() {
		if strings.TrimSpace(s.Text()) == "go" {
			once()
		}
	}
}

// noteTimes records the first publish and the receipts of a worker, from
// several goroutines.
type noteTimes struct {
	mu sync.Mutex
	runTimes
}

// runTimes are a worker's first publish and last receipt (Unix ns), how
// many receipts arrived within FirstWindow of the first publish, and in a
// paced run its events' latencies.
type runTimes struct {
	first, last int64
	inFirst     int
	lat         *histogram
}

func (n *noteTimes) published(at time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := at.UnixNano(); n.first == 0 || t < n.first {
		n.first = t
	}
}

// inWindow reports whether at, after the first publish, lies within
// FirstWindow of it.
func (n *noteTimes) inWindow(at time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runTimes.inWindow(at)
}

func (r runTimes) inWindow(at time.Time) bool { return at.UnixNano() < r.first+int64(FirstWindow) }

// received notes a receipt that arrived at at.
func (n *noteTimes) received(at time.Time) {
	n.receivedLast(at)
	n.receivedEarly(at)
}

// receivedLast notes a receipt for the run's last, without counting it.
func (n *noteTimes) receivedLast(at time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.last = max(n.last, at.UnixNano())
}

// receivedEarly counts a receipt that arrived at at if that lies within
// FirstWindow of the first publish.
func (n *noteTimes) receivedEarly(at time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runTimes.inWindow(at) {
		n.inFirst++
	}
}

func (n *noteTimes) times() runTimes {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runTimes
}
