package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	m := nats.NewMsg(prefix + ".in." + strconv.Itoa(p) + ".task-" + strconv.Itoa(task))
	m.Header.Set(wire.HeaderMsgID, newID())
	m.Header.Set(wire.HeaderHolder, "bench")
	m.Header.Set(wire.HeaderGeneration, strconv.FormatInt(l.gens[p], 10))
	m.Header.Set(wire.HeaderVersion, strconv.FormatInt(l.versions[task], 10))
	m.Header.Set(wire.HeaderType, "progress")
	m.Data = []byte(fmt.Sprintf(`{"step":%d,"note":%q}`, l.versions[task], l.filler))
	return m
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
	benchRounds = 3
)

// BenchmarkPipeline measures, in one run: the full ingest (publish → fenced
// append → LEDGER_LOG copy → receipt → ack) and a bare pipeline on the same
// machine (fetch, one set-based fenced insert per batch, ack; nothing else),
// and reports both rates and their ratio.
//
// The two run in alternating rounds and the medians are reported: a shared
// 2-core machine drifts by ±15% within a minute, and measuring one pipeline
// after the other would put that drift into the ratio.
func BenchmarkPipeline(b *testing.B) {
	full, bare := newFullPipeline(b), newBarePipeline(b)
	var fullRates, bareRates, ratios []float64
	for range b.N {
		for range benchRounds {
			f := full.throughput(benchEvents)
			r := bare.throughput(benchEvents)
			fullRates, bareRates, ratios = append(fullRates, f), append(bareRates, r), append(ratios, f/r)
			b.Logf("round: full %.0f events/s, bare %.0f events/s, ratio %.2f", f, r, f/r)
		}
	}
	b.ReportMetric(median(fullRates), "full_events/s")
	b.ReportMetric(median(bareRates), "bare_events/s")
	b.ReportMetric(median(ratios), "ratio")
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

// fullPipeline is an ingest service with its publisher.
type fullPipeline struct {
	b     *testing.B
	e     *env
	load  *benchLoad
	pub   jetstream.JetStream
	total int // events published so far

	mu   sync.Mutex
	sent map[string]time.Time // event id → publish time, while timing latency
	lat  []time.Duration
}

// newFullPipeline runs the ingest with its defaults.
func newFullPipeline(b *testing.B) *fullPipeline {
	e := newBenchEnv(b, ingest.Config{})
	p := &fullPipeline{b: b, e: e, load: newBenchLoad(e), pub: publisher(b, e)}
	sub, err := e.nc.Subscribe(e.subj.Receipt("bench"), func(m *nats.Msg) {
		now := time.Now()
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.sent == nil {
			return
		}
		var r wire.Receipt
		if err := json.Unmarshal(m.Data, &r); err != nil {
			b.Errorf("receipt: %v", err)
			return
		}
		if t0, ok := p.sent[r.EventID]; ok {
			p.lat = append(p.lat, now.Sub(t0))
			delete(p.sent, r.EventID)
		}
	})
	require.NoError(b, err)
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	return p
}

// throughput publishes n events and returns the rate at which they were
// published, committed, copied to LEDGER_LOG and acked.
func (p *fullPipeline) throughput(n int) float64 {
	msgs := p.next(n)
	start := time.Now()
	publishAll(p.b, p.pub, msgs)
	// Done when every inbound message is acked: LEDGER_IN is a work queue,
	// so it is empty then. (Receipts are sent too; the benchmark subscribes
	// to them but does not time them here.)
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
// publish-to-receipt time.
func (p *fullPipeline) latency(rate, seconds int) []time.Duration {
	p.mu.Lock()
	p.sent, p.lat = map[string]time.Time{}, nil
	p.mu.Unlock()
	pace(p.b, rate, seconds, func() {
		m := p.next(1)[0]
		p.mu.Lock()
		p.sent[m.Header.Get(wire.HeaderMsgID)] = time.Now()
		p.mu.Unlock()
		if _, err := p.pub.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			p.b.Fatal(err)
		}
	})
	n := rate * seconds
	lat := waitFor(p.b, &p.mu, func() ([]time.Duration, bool) { return p.lat, len(p.lat) == n })
	p.mu.Lock()
	p.sent = nil
	p.mu.Unlock()
	return lat
}

func (p *fullPipeline) next(n int) []*nats.Msg {
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		msgs[i] = p.load.next(p.total+i, "ledger")
	}
	p.total += n
	return msgs
}

// barePipeline is the baseline: 4 consumers that fetch up to 500 messages,
// insert them with one set-based fenced insert, and ack them.
type barePipeline struct {
	b     *testing.B
	e     *env
	load  *benchLoad
	pub   jetstream.JetStream
	cons  jetstream.Consumer
	total int

	mu   sync.Mutex
	sent map[string]time.Time
	lat  []time.Duration
}

func newBarePipeline(b *testing.B) *barePipeline {
	e := newBenchEnv(b, ingest.Config{Lanes: 1})
	p := &barePipeline{b: b, e: e, load: newBenchLoad(e), pub: publisher(b, e)}
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
				p.committed(got)
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

// committed records the publish-to-commit time of msgs, while timing.
func (p *barePipeline) committed(msgs []jetstream.Msg) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent == nil {
		return
	}
	for _, m := range msgs {
		if t0, ok := p.sent[m.Headers().Get(wire.HeaderMsgID)]; ok {
			p.lat = append(p.lat, now.Sub(t0))
		}
	}
}

func (p *barePipeline) throughput(n int) float64 {
	msgs := p.next(n)
	// The consumers run while the events are published, as the ingest
	// does in the full run, so both are timed the same way.
	elapsed := p.run(n, func() { publishAll(p.b, p.pub, msgs) })
	return float64(n) / elapsed.Seconds()
}

func (p *barePipeline) latency(rate, seconds int) []time.Duration {
	p.mu.Lock()
	p.sent, p.lat = map[string]time.Time{}, nil
	p.mu.Unlock()
	n := rate * seconds
	p.run(n, func() {
		pace(p.b, rate, seconds, func() {
			m := p.next(1)[0]
			p.mu.Lock()
			p.sent[m.Header.Get(wire.HeaderMsgID)] = time.Now()
			p.mu.Unlock()
			if _, err := p.pub.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
				p.b.Fatal(err)
			}
		})
	})
	lat := waitFor(p.b, &p.mu, func() ([]time.Duration, bool) { return p.lat, len(p.lat) == n })
	p.mu.Lock()
	p.sent = nil
	p.mu.Unlock()
	return lat
}

func (p *barePipeline) next(n int) []*nats.Msg {
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		msgs[i] = p.load.next(p.total+i, "bare")
	}
	p.total += n
	return msgs
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

// waitFor polls get (under mu) for up to 30 s until it reports done, and
// returns a copy of what it returned.
func waitFor(b *testing.B, mu *sync.Mutex, get func() ([]time.Duration, bool)) []time.Duration {
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		lat, done := get()
		out := slices.Clone(lat)
		mu.Unlock()
		if done {
			return out
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d events timed; the rest never arrived", len(out))
		}
		time.Sleep(10 * time.Millisecond)
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
		s := strings.Split(m.Subject(), ".")
		p, _ := strconv.Atoi(s[2])
		h := m.Headers()
		parts[i], tasks[i] = int32(p), s[3]
		ids[i], holders[i], types[i] = h.Get(wire.HeaderMsgID), h.Get(wire.HeaderHolder), h.Get(wire.HeaderType)
		versions[i], _ = strconv.ParseInt(h.Get(wire.HeaderVersion), 10, 64)
		gens[i], _ = strconv.ParseInt(h.Get(wire.HeaderGeneration), 10, 64)
		payloads[i] = string(m.Data())
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
