package ingest_test

import (
	"context"
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

// BenchmarkPipeline measures, in one run: the full ingest (publish → fenced
// append → LEDGER_LOG copy → receipt → ack) and a bare pipeline on the same
// machine (fetch, one set-based fenced insert per batch, ack; nothing else),
// and reports both rates and their ratio.
func BenchmarkPipeline(b *testing.B) {
	full := benchFull(b)
	bare := benchBare(b)
	b.ReportMetric(full, "full_events/s")
	b.ReportMetric(bare, "bare_events/s")
	b.ReportMetric(full/bare, "ratio")
}

// benchEvents is how many events each pipeline run publishes.
const benchEvents = 40000

// benchFull runs the full ingest and returns its events/s.
func benchFull(b *testing.B) float64 {
	const n = benchEvents
	e := newBenchEnv(b, ingest.Config{Lanes: 4, BatchSize: 1000})
	load := newBenchLoad(e)
	pub := publisher(b, e)
	var elapsed time.Duration
	total := 0
	for range b.N {
		msgs := make([]*nats.Msg, n)
		for i := range msgs {
			msgs[i] = load.next(total+i, "ledger")
		}
		start := time.Now()
		publishAll(b, pub, msgs)
		// Done when every inbound message is acked: LEDGER_IN is a work
		// queue, so it is empty then. (Receipts are still sent; the
		// benchmark does not decode them.)
		for e.streamPending(wire.StreamIn) > 0 {
			time.Sleep(time.Millisecond)
		}
		elapsed += time.Since(start)
		total += n
	}
	if got := e.count(`SELECT count(*) FROM ledger.events`); got != total {
		b.Fatalf("%d events committed, want %d", got, total)
	}
	return float64(total) / elapsed.Seconds()
}

// benchBare runs the bare pipeline and returns its events/s.
func benchBare(b *testing.B) float64 {
	const n = benchEvents
	e := newBenchEnv(b, ingest.Config{Lanes: 1})
	load := newBenchLoad(e)
	pub := publisher(b, e)
	e.svc.Stop() // only the streams and the leases are used
	ctx := context.Background()
	_, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "BARE_IN", Subjects: []string{"bare.in.>"}, Retention: jetstream.WorkQueuePolicy})
	require.NoError(b, err)
	cons, err := e.js.CreateOrUpdateConsumer(ctx, "BARE_IN", jetstream.ConsumerConfig{Durable: "bare", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 20000})
	require.NoError(b, err)
	var elapsed time.Duration
	total := 0
	for range b.N {
		msgs := make([]*nats.Msg, n)
		for i := range msgs {
			msgs[i] = load.next(total+i, "bare")
		}
		// Consumers run while the events are published, as the ingest
		// does in the full run, so both are timed the same way.
		var done atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done.Load() < int64(n) {
					batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Millisecond))
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
					if err := bareInsert(ctx, e.db.Pool, got); err != nil {
						b.Error(err)
						return
					}
					for _, m := range got {
						_ = m.Ack()
					}
					done.Add(int64(len(got)))
				}
			}()
		}
		publishAll(b, pub, msgs)
		wg.Wait()
		elapsed += time.Since(start)
		total += n
	}
	return float64(total) / elapsed.Seconds()
}

// BenchmarkLatency measures publish-to-receipt latency at a paced 10,000
// events/s.
func BenchmarkLatency(b *testing.B) {
	e := newBenchEnv(b, ingest.Config{Lanes: 4})
	load := newBenchLoad(e)
	pub := publisher(b, e)
	var mu sync.Mutex
	sent := map[string]time.Time{}
	var lat []time.Duration
	sub, err := e.nc.Subscribe(e.subj.Receipt("bench"), func(m *nats.Msg) {
		now := time.Now()
		id := strings.SplitN(strings.SplitN(string(m.Data), `"event_id":"`, 2)[1], `"`, 2)[0]
		mu.Lock()
		if t0, ok := sent[id]; ok {
			lat = append(lat, now.Sub(t0))
			delete(sent, id)
		}
		mu.Unlock()
	})
	require.NoError(b, err)
	defer sub.Unsubscribe()
	const rate, seconds = 10000, 3
	total := 0
	for range b.N {
		tick := time.NewTicker(time.Millisecond)
		start := time.Now()
		for i := 0; i < rate*seconds; {
			<-tick.C
			due := min(int(time.Since(start).Seconds()*rate), rate*seconds) - i
			for ; due > 0; due-- {
				m := load.next(total+i, "ledger")
				mu.Lock()
				sent[m.Header.Get(wire.HeaderMsgID)] = time.Now()
				mu.Unlock()
				if _, err := pub.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
					b.Fatal(err)
				}
				i++
			}
		}
		tick.Stop()
		total += rate * seconds
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			left := len(sent)
			mu.Unlock()
			if left == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lat) != total {
		b.Fatalf("%d of %d events got their receipt", len(lat), total)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
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
