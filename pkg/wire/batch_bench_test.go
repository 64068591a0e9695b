package wire

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
)

// benchBatch is a batch as a busy worker sends it: 256 events of 64 tasks,
// each with a payload of about 100 bytes.
func benchBatch(b testing.TB) *nats.Msg {
	events := make([]Inbound, 256)
	for i := range events {
		events[i] = Inbound{
			ID: fmt.Sprintf("01JD%022d", i), Partition: 3, Task: fmt.Sprintf("report-%d", i%64),
			Holder: "reports.pod-7f9c", Generation: 42, Version: int64(i/64 + 1), Type: "progress",
			Payload: fmt.Appendf(nil, `{"step":%d,"pct":%d.5,"note":"chunk %d of 256 parsed","rows":%d,"ok":true}`,
				i, i*100/256, i, 1000+i*37),
		}
	}
	m, err := Subjects{}.BatchMsg(events)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkDecodeBatch measures the batch decoder against the reflection
// reference it replaced, in one run: compare the two with benchstat.
func BenchmarkDecodeBatch(b *testing.B) {
	m := benchBatch(b)
	s := Subjects{}
	for _, impl := range []struct {
		name   string
		decode func(string, nats.Header, []byte) (DecodedBatch, *Invalid)
	}{
		{"impl=reference", s.decodeBatchReference},
		{"impl=scanner", s.DecodeBatch},
	} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(m.Data)))
			for b.Loop() {
				if d, bad := impl.decode(m.Subject, m.Header, m.Data); bad != nil || len(d.Events) != 256 {
					b.Fatalf("%v, %d events", bad, len(d.Events))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/event")
		})
	}
}
