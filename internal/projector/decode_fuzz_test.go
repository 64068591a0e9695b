package projector

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// decodeOne reads a per-event LEDGER_LOG copy as the projector does
// (offerBatch): its one event and commit time.
func decodeOne(subj wire.Subjects, subject string, h nats.Header, data []byte) (projection.Event, time.Time, error) {
	copies, err := subj.DecodeLogCopies(subject, h, data)
	if err != nil {
		return projection.Event{}, time.Time{}, err
	}
	if len(copies) != 1 {
		return projection.Event{}, time.Time{}, fmt.Errorf("%d copies in a per-event copy", len(copies))
	}
	return eventOf(&copies[0]), copies[0].CommittedAt, nil
}

// FuzzDecodeLog: whatever a LEDGER_LOG message holds, the projector's
// reading never panics; it accepts exactly the copies the contract's codec
// accepts with a version of 1 or more, and an accepted copy, written again
// with the codec, reads back as the same event at the same commit time.
func FuzzDecodeLog(f *testing.F) {
	good := []string{"ledger.log.3.report-7", "01JD0000000000000000000001", "812", "report-7", "3", "2", "running",
		"worker-a", "1", "2026-03-01T12:00:00.000000005Z"}
	f.Add(good[0], good[1], good[2], good[3], good[4], good[5], good[6], good[7], good[8], good[9], []byte(`{"step":2}`))
	variant := func(i int, v string) {
		s := append([]string(nil), good...)
		s[i] = v
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], []byte(`{}`))
	}
	for _, c := range []struct {
		field int
		value string
	}{
		{5, "0"}, {5, "-1"}, {5, "+2"}, {5, " 2"}, {5, "9223372036854775808"}, {2, "-5"}, {2, ""},
		{3, ""}, {3, "report-8"}, {4, "03"}, {4, "4"}, {9, "yesterday"}, {9, ""}, {7, ""}, {8, "x"}, {1, ""}, {6, ""},
		{0, "ledger.log.03.report-7"}, {0, "ledger.in.3.report-7"}, {0, "other.log.3.report-7"}, {0, "ledger.log.3.a.b"},
	} {
		variant(c.field, c.value)
	}
	// The copy the projector's tests used to publish: no task, partition,
	// holder or generation headers.
	f.Add(good[0], good[1], good[2], "", "", good[5], good[6], "", "", good[9], []byte(`null`))
	subj := wire.Subjects{}
	f.Fuzz(func(t *testing.T, subject, id, seq, task, partition, version, typ, holder, gen, at string, payload []byte) {
		h := nats.Header{}
		for name, v := range map[string]string{wire.HeaderMsgID: id, wire.HeaderSeq: seq, wire.HeaderTask: task,
			wire.HeaderPartition: partition, wire.HeaderVersion: version, wire.HeaderType: typ, wire.HeaderHolder: holder,
			wire.HeaderGeneration: gen, wire.HeaderCommittedAt: at} {
			if v != "" {
				h.Set(name, v)
			}
		}
		ev, committedAt, err := decodeOne(subj, subject, h, payload)
		c, cerr := subj.DecodeLog(subject, h, payload)
		if cerr != nil || c.Version < 1 {
			require.Error(t, err, "decodeLog accepts what the codec refuses")
			return
		}
		require.NoError(t, err)
		require.GreaterOrEqual(t, ev.Version, int64(1))
		require.Equal(t, c.Task, ev.Task)
		require.Equal(t, c.Partition, ev.Partition)

		m := subj.LogMsg(&c)
		again, againAt, err := decodeOne(subj, m.Subject, m.Header, m.Data)
		require.NoError(t, err, "the codec's own copy of an accepted one")
		require.Equal(t, ev, again)
		require.True(t, committedAt.Equal(againAt), "%v != %v", committedAt, againAt)
	})
}
