package fence_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/fence"
)

const goodArchiveLine = `{"seq":7,"event_id":"01JD0000000000000000000001","partition":3,"task_id":"report-7","version":2,` +
	`"type":"running","holder":"reports.pod-a","generation":4,"committed_at":"2026-11-30T20:00:00.123456Z","payload":{"a": [1, 2]}}`

// The cases of an archive row that the decoder must refuse: each says
// what is wrong, none panics.
var badArchiveLines = []string{
	``,
	`null`,
	`[]`,
	`{}`,
	`{"seq":7}`,
	strings.Replace(goodArchiveLine, `"seq":7`, `"seq":0`, 1),
	strings.Replace(goodArchiveLine, `"seq":7`, `"seq":-1`, 1),
	strings.Replace(goodArchiveLine, `"seq":7`, `"seq":"7"`, 1),
	strings.Replace(goodArchiveLine, `"seq":7`, `"seq":1e400`, 1),
	strings.Replace(goodArchiveLine, `"version":2`, `"version":0`, 1),
	strings.Replace(goodArchiveLine, `"generation":4`, `"generation":0`, 1),
	strings.Replace(goodArchiveLine, `"partition":3`, `"partition":-3`, 1),
	strings.Replace(goodArchiveLine, `01JD0000000000000000000001`, `not-a-ulid`, 1),
	strings.Replace(goodArchiveLine, `01JD0000000000000000000001`, `81JD0000000000000000000001`, 1), // time overflows
	strings.Replace(goodArchiveLine, `report-7`, `report.7`, 1),
	strings.Replace(goodArchiveLine, `"type":"running"`, `"type":""`, 1),
	strings.Replace(goodArchiveLine, `"holder":"reports.pod-a"`, `"holder":""`, 1),
	strings.Replace(goodArchiveLine, `2026-11-30T20:00:00.123456Z`, `yesterday`, 1),
	strings.Replace(goodArchiveLine, `,"payload":{"a": [1, 2]}`, ``, 1),
	strings.Replace(goodArchiveLine, `{"a": [1, 2]}`, `{"a": [1, 2]`, 1),
	strings.Replace(goodArchiveLine, `"seq":7,`, `"seq":7,"seq":8,`, 1),
	strings.Replace(goodArchiveLine, `"seq":7,`, `"seq":7,"extra":1,`, 1),
	strings.Replace(goodArchiveLine, `"seq":7,`, `"SEQ":7,`, 1),
	strings.Replace(goodArchiveLine, `"seq":7,`, `"seq":7,"Seq":8,`, 1),
	goodArchiveLine + `{}`,
	goodArchiveLine + ` x`,
}

func TestDecodeArchiveLine(t *testing.T) {
	t.Parallel()
	c, err := fence.DecodeArchiveLine([]byte(goodArchiveLine))
	require.NoError(t, err)
	require.EqualValues(t, 7, c.Seq)
	require.Equal(t, "report-7", c.Task)
	require.JSONEq(t, `{"a":[1,2]}`, string(c.Payload))
	require.Equal(t, time.Date(2026, 11, 30, 20, 0, 0, 123456000, time.UTC), c.CommittedAt)
	null, err := fence.DecodeArchiveLine([]byte(strings.Replace(goodArchiveLine, `{"a": [1, 2]}`, `null`, 1)))
	require.NoError(t, err, "a null payload is a payload")
	require.Equal(t, "null", string(null.Payload))
	for _, bad := range badArchiveLines {
		_, err := fence.DecodeArchiveLine([]byte(bad))
		require.Error(t, err, "%s", bad)
		require.Less(t, len(err.Error()), 300)
	}
}

// A file's rows must rise in seq.
func TestArchiveReaderRefusesRowsOutOfOrder(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	_, _ = gz.Write([]byte(goodArchiveLine + "\n" + goodArchiveLine + "\n"))
	require.NoError(t, gz.Close())
	r, err := fence.NewArchiveReader(&buf)
	require.NoError(t, err)
	_, err = r.Next()
	require.NoError(t, err)
	_, err = r.Next()
	require.ErrorContains(t, err, "seq 7 after seq 7")
}

const goodManifest = `{"format":"ledger-archive/1","horizon":{"below_seq":201,"id_floor":"01JD000000","id_floor_at":"2026-11-30T20:00:00Z"},
"files":[{"file":"events-0000000000000000001-0000000000000000100.jsonl.gz","from_seq":1,"below_seq":101,"rows":100,"bytes":10,
"sha256":"0000000000000000000000000000000000000000000000000000000000000000","first_committed_at":"2026-11-30T20:00:00Z",
"last_committed_at":"2026-11-30T20:00:00Z","archived_at":"2026-11-30T20:00:00Z"}]}`

var badManifests = []string{
	``,
	`{}`,
	`{"format":"other"}`,
	strings.Replace(goodManifest, `"rows":100`, `"rows":101`, 1),
	strings.Replace(goodManifest, `"rows":100`, `"rows":-1`, 1),
	strings.Replace(goodManifest, `"from_seq":1`, `"from_seq":0`, 1),
	strings.Replace(goodManifest, `"below_seq":101`, `"below_seq":1`, 1),
	strings.Replace(goodManifest, `events-0000000000000000001`, `../events-0000000000000000001`, 1),
	strings.Replace(goodManifest, `events-0000000000000000001`, `.events`, 1),
	strings.Replace(goodManifest, `"sha256":"00`, `"sha256":"zz`, 1),
	strings.Replace(goodManifest, `"sha256":"00`, `"sha256":"`, 1),
	strings.Replace(goodManifest, `"format"`, `"unknown":1,"format"`, 1),
	goodManifest + `{}`,
}

func TestDecodeManifest(t *testing.T) {
	t.Parallel()
	m, err := fence.DecodeManifest([]byte(goodManifest))
	require.NoError(t, err)
	require.Len(t, m.Files, 1)
	twice, err := json.Marshal(fence.Manifest{Format: fence.ArchiveFormat, Files: []fence.ManifestFile{m.Files[0], m.Files[0]}})
	require.NoError(t, err)
	for _, bad := range append(badManifests, string(twice)) {
		_, err := fence.DecodeManifest([]byte(bad))
		require.Error(t, err, "%s", bad)
	}
}

func FuzzDecodeArchiveLine(f *testing.F) {
	f.Add([]byte(goodArchiveLine))
	for _, bad := range badArchiveLines {
		f.Add([]byte(bad))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		c, err := fence.DecodeArchiveLine(line)
		if err != nil {
			return
		}
		// What decodes is a row: it encodes again to a line that decodes
		// to the same row.
		if c.Seq < 1 || c.Version < 1 || c.Generation < 1 || c.Partition < 0 || !json.Valid(c.Payload) {
			t.Fatalf("decoded a row out of range: %+v", c)
		}
		again, err := fence.DecodeArchiveLine(fence.EncodeArchiveLine(c))
		if err != nil {
			t.Fatalf("a decoded row does not decode again: %v", err)
		}
		if again.Seq != c.Seq || again.EventID != c.EventID || !again.CommittedAt.Equal(c.CommittedAt) {
			t.Fatalf("the row changed: %+v, then %+v", c, again)
		}
	})
}

func FuzzDecodeManifest(f *testing.F) {
	f.Add([]byte(goodManifest))
	for _, bad := range badManifests {
		f.Add([]byte(bad))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := fence.DecodeManifest(data)
		if err != nil {
			return
		}
		for i, file := range m.Files {
			if strings.ContainsAny(file.File, `/\`) || file.BelowSeq <= file.FromSeq || (i > 0 && file.FromSeq < m.Files[i-1].BelowSeq) {
				t.Fatalf("accepted a manifest with file %+v", file)
			}
		}
	})
}

// FuzzArchiveReader: an archive file is an operator's input, and any bytes
// may be handed in, compressed or not. Reading never panics, and what it
// hands on is rows rising in seq that encode again to themselves.
func FuzzArchiveReader(f *testing.F) {
	second := strings.Replace(goodArchiveLine, `"seq":7`, `"seq":8`, 1)
	f.Add([]byte(goodArchiveLine+"\n"+second+"\n"), true)
	f.Add([]byte(second+"\n"+goodArchiveLine+"\n"), true)
	f.Add([]byte(goodArchiveLine+"\n\n"), true)
	f.Add([]byte(goodArchiveLine), false)
	f.Add([]byte("\x1f\x8b\x08\x00\x00\x00\x00\x00"), false)
	f.Fuzz(func(t *testing.T, data []byte, compress bool) {
		input := data
		if compress {
			input = ledgertest.GzipStored(data)
		}
		r, err := fence.NewArchiveReader(bytes.NewReader(input))
		if err != nil {
			return
		}
		var last int64
		for {
			c, err := r.Next()
			if err != nil {
				return
			}
			if c.Seq <= last {
				t.Fatalf("row with seq %d after seq %d", c.Seq, last)
			}
			last = c.Seq
			again, err := fence.DecodeArchiveLine(fence.EncodeArchiveLine(c))
			if err != nil || again.Seq != c.Seq || again.Task != c.Task || !sameJSON(again.Payload, c.Payload) {
				t.Fatalf("row %+v encodes to one that reads as %+v (%v)", c, again, err)
			}
		}
	})
}

// sameJSON reports whether a and b are the same JSON text but for
// insignificant space (the archive writer compacts payloads).
func sameJSON(a, b []byte) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}
