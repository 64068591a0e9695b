package chaos

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// aLog is a writer log as a writer writes it.
func aLog(t testing.TB) []byte {
	var b bytes.Buffer
	lw := newLogWriter(&b)
	p := 3
	lw.add(Record{Kind: KindStart, T: 1, Holder: "c1.p3-w0", Partition: &p, Tasks: []string{"c1-p3-t0", "c1-p3-t1"}, TTLMillis: 1000})
	lw.add(Record{Kind: KindHeld, T: 2, Sent: 1, Holder: "c1.p3-w1", Gen: 4, ExpiresAt: "2026-01-02T03:04:05.1Z"})
	lw.add(Record{Kind: KindGrant, T: 3, Sent: 2, Gen: 5, ExpiresAt: "2026-01-02T03:04:06Z"})
	lw.add(Record{Kind: KindHead, T: 4, Gen: 5, Task: "c1-p3-t0", Version: 7})
	lw.add(Record{Kind: KindPub, T: 5, ID: "01JD0000000000000000000001", Task: "c1-p3-t0", Version: 8, Gen: 5, Type: "running", Try: 1})
	lw.add(Record{Kind: KindAck, T: 6, ID: "01JD0000000000000000000001", Seq: 42, Dup: true})
	lw.add(Record{Kind: KindNack, T: 7, ID: "01JD0000000000000000000002", Err: "timeout"})
	lw.add(Record{Kind: KindReceipt, T: 8, ID: "01JD0000000000000000000001", Verdict: "committed", Seq: 9})
	lw.add(Record{Kind: KindWoke, T: 9, PausedMillis: 2500, Gen: 5, Zombie: true})
	lw.add(Record{Kind: KindEffect, T: 9, ID: "01JD0000000000000000000001", Gen: 5, Zombie: true})
	lw.add(Record{Kind: KindEffectDone, T: 9, ID: "01JD0000000000000000000001", Verdict: "refused"})
	lw.add(Record{Kind: KindLost, T: 10, Gen: 5, Why: "renewal refused"})
	lw.add(Record{Kind: KindStop, T: 11})
	require.NoError(t, lw.flush())
	return b.Bytes()
}

func TestReadLogReadsWhatAWriterWrites(t *testing.T) {
	t.Parallel()
	wl, err := ReadLog("w.jsonl", bytes.NewReader(aLog(t)))
	require.NoError(t, err)
	assert.Equal(t, "c1.p3-w0", wl.Holder)
	assert.Equal(t, 3, wl.Partition)
	assert.Equal(t, []string{"c1-p3-t0", "c1-p3-t1"}, wl.Tasks)
	require.Len(t, wl.Records, 13)
	assert.Equal(t, uint64(42), wl.Records[5].Seq)
	assert.False(t, wl.Truncated)
}

func TestReadLogRefusesWhatNoWriterWrites(t *testing.T) {
	t.Parallel()
	good := string(aLog(t))
	start, rest, _ := strings.Cut(good, "\n")
	cases := map[string]struct{ log, want string }{
		"empty":             {"", "is empty"},
		"no start":          {rest, "begins with a \"start\" record"},
		"two starts":        {start + "\n" + good, "a second \"start\""},
		"unknown kind":      {start + "\n" + `{"k":"boom","t":1}` + "\n", `unknown record kind "boom"`},
		"unknown member":    {start + "\n" + `{"k":"stop","t":1,"x":1}` + "\n", `unknown field "x"`},
		"no time":           {start + "\n" + `{"k":"stop"}` + "\n", "without a time"},
		"pub without id":    {start + "\n" + `{"k":"pub","t":1,"task":"a","v":1,"gen":1}` + "\n", "without an event id"},
		"effect outcome":    {start + "\n" + `{"k":"effect_done","t":1,"id":"x","verdict":"maybe"}` + "\n", "an outcome"},
		"not json":          {start + "\n" + "pub 1 2 3\n", "not a record"},
		"two records":       {start + "\n" + `{"k":"stop","t":1}{"k":"stop","t":2}` + "\n", "data after the record"},
		"a stray brace":     {start + "\n" + `{"k":"stop","t":1}}` + "\n", "data after the record"},
		"bad task in start": {`{"k":"start","t":1,"holder":"h.i","partition":0,"tasks":["a.b"]}` + "\n", `task id "a.b"`},
		"long line":         {start + "\n" + `{"k":"stop","t":1,"why":"` + strings.Repeat("x", maxRecordLine) + `"}` + "\n", "longer than"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := ReadLog("w.jsonl", strings.NewReader(tc.log))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadLog), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestReadLogLeavesOutAnUnfinishedLastLine(t *testing.T) {
	t.Parallel()
	good := aLog(t)
	wl, err := ReadLog("w.jsonl", bytes.NewReader(good[:len(good)-5]))
	require.NoError(t, err)
	assert.True(t, wl.Truncated)
	assert.Len(t, wl.Records, 12)
}

// FuzzReadLog: any bytes give a log or ErrBadLog, never a panic; a log that
// is read has a start record first, only records its kind allows, and
// reads the same after writing it out again.
func FuzzReadLog(f *testing.F) {
	good := aLog(f)
	f.Add(good)
	f.Add(good[:len(good)-5])
	f.Add([]byte(`{"k":"start","t":1,"holder":"h.i","partition":0,"tasks":["a"]}` + "\n" + `{"k":"pub","t":2,"id":"x","task":"a","v":1,"gen":1}` + "\n"))
	f.Add([]byte(`{"k":"start","t":1,"holder":"h.i","partition":-1,"tasks":["a"]}` + "\n"))
	f.Add([]byte(`{"k":"start","t":1,"holder":"h.i","partition":0,"tasks":["a"]}` + "\n" + `{"k":"ack","t":1e30,"id":"x","seq":-1}` + "\n"))
	f.Add([]byte("\n\n"))
	f.Add([]byte(`{"k":"start","t":1,"holder":"h.i","partition":0,"tasks":["a"],"k":"stop"}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		wl, err := ReadLog("fuzz", bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrBadLog) {
				t.Fatalf("error %v does not wrap ErrBadLog", err)
			}
			return
		}
		if len(wl.Records) == 0 || wl.Records[0].Kind != KindStart {
			t.Fatalf("log read without a start record: %+v", wl.Records)
		}
		var b bytes.Buffer
		lw := newLogWriter(&b)
		for _, r := range wl.Records {
			if err := r.check(); err != nil {
				t.Fatalf("record read that its kind does not allow: %v", err)
			}
			lw.add(r)
		}
		if err := lw.flush(); err != nil {
			t.Fatal(err)
		}
		again, err := ReadLog("again", &b)
		if err != nil {
			t.Fatalf("a log read does not read again once written: %v", err)
		}
		assert.Equal(t, wl.Records, again.Records)
	})
}

// FuzzParseStreamMessage: LEDGER_LOG and LEDGER_DLQ messages with any
// subject and headers are read without a panic; a copy without Err has a
// valid event id and a subject that names its own task and partition.
func FuzzParseStreamMessage(f *testing.F) {
	f.Add("ledger.log.3.report-7", "01JD0000000000000000000001", "report-7", "3", "2", "17", "1")
	f.Add("ledger.log.3.report-7", "01JD0000000000000000000001", "report-7", "3", "2", "17", "01")
	f.Add("ledger.log.03.report-7", "01JD0000000000000000000001", "report-7", "3", "2", "17", "1")
	f.Add("ledger.log.3.other", "01JD0000000000000000000001", "report-7", "3", "2", "17", "1")
	f.Add("ledger.dlq.3.report-7", "not-a-ulid", "", "-1", "99999999999999999999", "", "x")
	f.Add("ledger.dlq.invalid", "", "", "", "", "", "")
	f.Add("ledger.log.3.~batch", "log-3-1-2", "", "3", "", "", "")
	f.Fuzz(func(t *testing.T, subject, id, task, partition, version, seq, gen string) {
		h := nats.Header{}
		for k, v := range map[string]string{wire.HeaderMsgID: id, wire.HeaderTask: task, wire.HeaderPartition: partition,
			wire.HeaderVersion: version, wire.HeaderSeq: seq, wire.HeaderGeneration: gen, wire.HeaderVerdict: "stale",
			wire.HeaderType: "running", wire.HeaderHolder: "w-a", wire.HeaderCommittedAt: "2026-01-02T03:04:05Z"} {
			h.Set(k, v)
		}
		subj := wire.Subjects{}
		c := parseCopy(subj, 1, subject, h, nil)
		if c.Err == "" {
			p, tk, err := subj.ParseLog(subject)
			if err != nil || tk != c.Task || p != c.Partition || !wire.ValidEventID(c.EventID) || c.Version < 0 || c.Seq < 0 {
				t.Fatalf("copy accepted with subject %q, task %q, partition %d, id %q", subject, c.Task, c.Partition, c.EventID)
			}
		}
		for _, c := range parseCopies(subj, 1, subject, h, nil) { // a batch needs a body: none here
			if c.Err == "" && subj.IsLogBatch(subject) {
				t.Fatalf("a log batch without a body accepted: %+v", c)
			}
		}
		l := parseLetter(subj, 1, subject, h, nil)
		if l.Task != "" {
			if _, tk, err := subj.ParseDLQ(subject); err != nil || tk != l.Task {
				t.Fatalf("letter read task %q from subject %q", l.Task, subject)
			}
		}
	})
}
