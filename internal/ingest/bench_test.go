package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

const (
	benchPartitions = 16
	benchTasks      = 2000
)

// benchLoad publishes n events over 16 partitions and 2000 tasks.
type benchLoad struct {
	gens     [benchPartitions]int64
	versions [benchTasks]int64
	filler   string
}

func newBenchLoad(e *env) *benchLoad {
	l := &benchLoad{filler: strings.Repeat("x", 150)}
	for p := range benchPartitions {
		l.gens[p] = e.acquire(p, "bench", 300000).Generation
	}
	return l
}

func (l *benchLoad) next(i int, prefix string) *nats.Msg {
	task := i % benchTasks
	l.versions[task]++
	p := task % benchPartitions
	return wire.Subjects{Prefix: prefix}.InboundMsg(wire.Inbound{ID: newID(), Partition: p, Task: "task-" + strconv.Itoa(task),
		Holder: "bench.1", Generation: l.gens[p], Version: l.versions[task], Type: "progress",
		Payload: []byte(fmt.Sprintf(`{"step":%d,"note":%q}`, l.versions[task], l.filler))})
}

// publisher is a JetStream context for bulk publishing: at most 2000 publishes
// in flight, waiting (rather than failing) while the window is full.
func publisher(b *testing.B, e *env) jetstream.JetStream {
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(2000))
	require.NoError(b, err)
	return js
}

func publishAll(b *testing.B, js jetstream.JetStream, msgs []*nats.Msg) {
	for _, m := range msgs {
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		b.Fatal("publishes not acknowledged")
	}
}

// benchEvents is how many events one round of a throughput run publishes,
// and benchRounds how many rounds each pipeline runs per benchmark iteration.
const (
	benchEvents = 40000
	benchRounds = 5
)

// BenchmarkPipeline measures, in one run: the full ingest (publish → fenced
// append → LEDGER_LOG copy → receipt → ack) and a bare pipeline on the same
// machine (fetch, one set-based fenced insert per batch, ack; nothing else),
// and reports both rates and their ratio.
//
// The two run in alternating rounds and the medians are reported: a shared
// 2-core machine drifts by ±15% within a minute, and measuring one pipeline
// after the other would put that drift into the ratio.
//
// Both pipelines are CPU-bound on such a machine, so it also reports the CPU
// time the whole machine spent per event in each (every process: NATS and
// the Go code in this one, PostgreSQL beside it; read from /proc/stat), and
// their ratio: a figure that drifts far less than the rates.
func BenchmarkPipeline(b *testing.B) {
	full, bare := newFullPipeline(b), newBarePipeline(b)
	var fullRates, bareRates, ratios, fullCPU, bareCPU []float64
	for range b.N {
		for range benchRounds {
			c0 := machineCPU()
			f := full.throughput(benchEvents)
			c1 := machineCPU()
			r := bare.throughput(benchEvents)
			c2 := machineCPU()
			fullRates, bareRates, ratios = append(fullRates, f), append(bareRates, r), append(ratios, f/r)
			fullCPU, bareCPU = append(fullCPU, (c1-c0)/benchEvents*1e6), append(bareCPU, (c2-c1)/benchEvents*1e6)
			b.Logf("round: full %.0f events/s, bare %.0f events/s, ratio %.2f; CPU per event: full %.0f µs, bare %.0f µs",
				f, r, f/r, fullCPU[len(fullCPU)-1], bareCPU[len(bareCPU)-1])
		}
	}
	b.ReportMetric(median(fullRates), "full_events/s")
	b.ReportMetric(median(bareRates), "bare_events/s")
	b.ReportMetric(median(ratios), "ratio")
	if fc, bc := median(fullCPU), median(bareCPU); fc > 0 && bc > 0 {
		b.ReportMetric(fc, "full_cpu_µs/event")
		b.ReportMetric(bc, "bare_cpu_µs/event")
		b.ReportMetric(bc/fc, "cpu_ratio")
	}
}

// machineCPU is the CPU time, in seconds, the machine has spent busy (every
// state of /proc/stat's cpu line but idle and iowait), or 0 where there is
// no /proc/stat.
func machineCPU() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0
	}
	var ticks float64
	for i, f := range fields[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return 0
		}
		ticks += v
	}
	return ticks / 100 // USER_HZ, 100 on Linux
}

// BenchmarkLatency measures publish-to-receipt latency of the full ingest at
// a paced 10,000 events/s, and, in alternating rounds on the same machine,
// the bare pipeline's publish-to-commit latency at the same load.
func BenchmarkLatency(b *testing.B) {
	const rate, seconds = 10000, 3
	full, bare := newFullPipeline(b), newBarePipeline(b)
	var fullLat, bareLat []time.Duration
	for range b.N {
		for range 2 {
			fullLat = append(fullLat, full.latency(rate, seconds)...)
			bareLat = append(bareLat, bare.latency(rate, seconds)...)
		}
	}
	b.ReportMetric(percentileMS(fullLat, 50), "p50_ms")
	b.ReportMetric(percentileMS(fullLat, 99), "p99_ms")
	b.ReportMetric(percentileMS(bareLat, 50), "bare_p50_ms")
	b.ReportMetric(percentileMS(bareLat, 99), "bare_p99_ms")
}

// source publishes the benchmark's load into one pipeline and, while a
// latency run is on, times each event from its publish to its arrival.
type source struct {
	b      *testing.B
	e      *env
	load   *benchLoad
	pub    jetstream.JetStream
	prefix string
	total  int // events published so far

	mu   sync.Mutex
	sent map[string]time.Time // event id → publish time, while timing
	lat  []time.Duration
}

func newSource(b *testing.B, e *env, prefix string) *source {
	return &source{b: b, e: e, load: newBenchLoad(e), pub: publisher(b, e), prefix: prefix}
}

func (s *source) next(n int) []*nats.Msg {
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		msgs[i] = s.load.next(s.total+i, s.prefix)
	}
	s.total += n
	return msgs
}

// arrived records when the events ids arrived, if they are being timed.
func (s *source) arrived(now time.Time, ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if t0, ok := s.sent[id]; ok {
			s.lat = append(s.lat, now.Sub(t0))
			delete(s.sent, id)
		}
	}
}

// timing reports whether a latency run is on.
func (s *source) timing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent != nil
}

// paced publishes rate events a second for seconds, through run (which
// calls the publishing function it is given), and returns each event's time
// from publish to arrival once all have arrived.
func (s *source) paced(rate, seconds int, run func(publish func())) []time.Duration {
	s.mu.Lock()
	s.sent, s.lat = map[string]time.Time{}, nil
	s.mu.Unlock()
	run(func() {
		pace(s.b, rate, seconds, func() {
			m := s.next(1)[0]
			s.mu.Lock()
			s.sent[m.Header.Get(wire.HeaderMsgID)] = time.Now()
			s.mu.Unlock()
			if _, err := s.pub.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
				s.b.Fatal(err)
			}
		})
	})
	n := rate * seconds
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		lat, left := slices.Clone(s.lat), len(s.sent)
		if len(lat) == n {
			s.sent = nil
		}
		s.mu.Unlock()
		if len(lat) == n {
			return lat
		}
		if time.Now().After(deadline) {
			s.b.Fatalf("%d of %d events timed; %d never arrived", len(lat), n, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fullPipeline is an ingest service with its publisher.
type fullPipeline struct{ *source }

// newFullPipeline runs the ingest with its defaults.
func newFullPipeline(b *testing.B) *fullPipeline {
	return &fullPipeline{newSource(b, newBenchEnv(b, ingest.Config{}), "ledger")}
}

// throughput publishes n events and returns the rate at which they were
// published, committed, copied to LEDGER_LOG and acked.
func (p *fullPipeline) throughput(n int) float64 {
	msgs := p.next(n)
	start := time.Now()
	publishAll(p.b, p.pub, msgs)
	// Done when every inbound message is acked: LEDGER_IN is a work queue,
	// so it is empty then. (Receipts are sent too; nobody subscribes to them
	// here.)
	for p.e.streamPending(wire.StreamIn) > 0 {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	if got := p.e.count(`SELECT count(*) FROM ledger.events`); got != p.total {
		p.b.Fatalf("%d events committed, want %d", got, p.total)
	}
	return float64(n) / elapsed.Seconds()
}

// latency publishes at rate for seconds and returns each event's
// publish-to-receipt time. Only here does the benchmark subscribe to the
// receipts: in a deployment they are read by the workers, on their own
// machines, and the throughput runs leave that work out (as they leave out
// nothing the bare pipeline does).
func (p *fullPipeline) latency(rate, seconds int) []time.Duration {
	sub, err := p.e.nc.Subscribe(p.e.subj.Receipt("bench"), func(m *nats.Msg) {
		now := time.Now()
		var r wire.Receipt
		if err := json.Unmarshal(m.Data, &r); err != nil {
			p.b.Errorf("receipt: %v", err)
			return
		}
		p.arrived(now, r.EventID)
	})
	require.NoError(p.b, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(p.b, p.e.nc.Flush())
	return p.paced(rate, seconds, func(publish func()) { publish() })
}

// barePipeline is the baseline: 4 consumers that fetch up to 500 messages,
// insert them with one set-based fenced insert, and ack them.
type barePipeline struct {
	*source
	cons jetstream.Consumer
}

func newBarePipeline(b *testing.B) *barePipeline {
	e := newBenchEnv(b, ingest.Config{Lanes: 1})
	p := &barePipeline{source: newSource(b, e, "bare")}
	e.svc.Stop() // only the leases are used
	ctx := context.Background()
	_, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "BARE_IN", Subjects: []string{"bare.in.>"}, Retention: jetstream.WorkQueuePolicy})
	require.NoError(b, err)
	p.cons, err = e.js.CreateOrUpdateConsumer(ctx, "BARE_IN", jetstream.ConsumerConfig{Durable: "bare", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 20000})
	require.NoError(b, err)
	return p
}

// run runs the consumers until n events are committed, while publish
// publishes them, and returns the time from the start to the last ack.
func (p *barePipeline) run(n int, publish func()) time.Duration {
	ctx := context.Background()
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < int64(n) {
				batch, err := p.cons.Fetch(500, jetstream.FetchMaxWait(5*time.Millisecond))
				if err != nil {
					continue
				}
				var got []jetstream.Msg
				for m := range batch.Messages() {
					got = append(got, m)
				}
				if len(got) == 0 {
					continue
				}
				if err := bareInsert(ctx, p.e.db.Pool, got); err != nil {
					p.b.Error(err)
					return
				}
				if p.timing() {
					now := time.Now()
					ids := make([]string, len(got))
					for i, m := range got {
						ids[i] = m.Headers().Get(wire.HeaderMsgID)
					}
					p.arrived(now, ids...)
				}
				for _, m := range got {
					_ = m.Ack()
				}
				done.Add(int64(len(got)))
			}
		}()
	}
	publish()
	wg.Wait()
	return time.Since(start)
}

func (p *barePipeline) throughput(n int) float64 {
	msgs := p.next(n)
	// The consumers run while the events are published, as the ingest
	// does in the full run, so both are timed the same way.
	elapsed := p.run(n, func() { publishAll(p.b, p.pub, msgs) })
	return float64(n) / elapsed.Seconds()
}

// latency publishes at rate for seconds and returns each event's
// publish-to-commit time.
func (p *barePipeline) latency(rate, seconds int) []time.Duration {
	return p.paced(rate, seconds, func(publish func()) { p.run(rate*seconds, publish) })
}

// pace calls publish rate times a second for seconds, in 1 ms ticks.
func pace(b *testing.B, rate, seconds int, publish func()) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for i := 0; i < rate*seconds; {
		<-tick.C
		due := min(int(time.Since(start).Seconds()*float64(rate)), rate*seconds) - i
		for ; due > 0; due-- {
			publish()
			i++
		}
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func percentileMS(lat []time.Duration, pct int) float64 {
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[(len(s)-1)*pct/100].Microseconds()) / 1000
}

// bareInsert is the baseline: the fence predicate in one set-based insert,
// and nothing else (no duplicate, conflict or version checks, no copies).
func bareInsert(ctx context.Context, pool *pgxpool.Pool, msgs []jetstream.Msg) error {
	n := len(msgs)
	ids, tasks, types, payloads, holders := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	parts, versions, gens := make([]int32, n), make([]int64, n), make([]int64, n)
	for i, m := range msgs {
		d, _ := wire.Subjects{Prefix: "bare"}.DecodeInbound(m.Subject(), m.Headers(), m.Data())
		parts[i], tasks[i], ids[i], holders[i], types[i] = int32(d.Partition), d.Task, d.ID, d.Holder, d.Type
		versions[i], gens[i], payloads[i] = d.Version, d.Generation, string(d.Payload)
	}
	_, err := pool.Exec(ctx, `
INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
SELECT i.event_id, i.partition, i.task_id, i.version, i.type, i.payload::jsonb, i.holder, i.generation, clock_timestamp()
FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::bigint[])
     AS i(event_id, partition, task_id, version, type, payload, holder, generation)
JOIN ledger.leases l ON l.partition = i.partition
WHERE l.holder = i.holder AND l.generation = i.generation AND l.expires_at > clock_timestamp()`,
		ids, parts, tasks, versions, types, payloads, holders, gens)
	return err
}
