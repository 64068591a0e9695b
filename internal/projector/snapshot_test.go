package projector_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// history appends rounds of one version to each of the tasks, through the
// fence, as the ingest would.
type history struct {
	t      *testing.T
	s      *fence.Store
	leases []fence.Lease
	heads  map[string]int64
}

func (h *history) rounds(tasks []string, n int) {
	for range n {
		batch := make([]fence.Event, 0, len(tasks))
		for i, task := range tasks {
			h.heads[task]++
			v := h.heads[task]
			l := h.leases[i%len(h.leases)]
			typ := "progress"
			if v%5 == 0 {
				typ = "checkpoint"
			}
			batch = append(batch, fence.Event{ID: newULID(), Partition: l.Partition, Task: task, Version: v, Type: typ,
				Payload: fmt.Appendf(nil, `{"step":%d,"k%d":%q,"last":%s}`, v, v%3, task, map[bool]string{true: "null", false: "1"}[v%4 == 0]),
				Holder:  l.Holder, Generation: l.Generation})
		}
		res, err := h.s.Append(context.Background(), batch)
		require.NoError(h.t, err)
		for _, r := range res {
			require.Equal(h.t, wire.VerdictCommitted, r.Verdict)
		}
	}
}

func newULID() string { return ledgertest.NewID() }

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func copyFile(t *testing.T, from, to, name string) {
	data, err := os.ReadFile(filepath.Join(from, name))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(to, name), data, 0o644))
}

func writeManifest(t *testing.T, dir string, m fence.Manifest) {
	data, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, fence.ManifestName), data, 0o644))
}

// The bucket the projector keeps from a snapshot and the hot log equals the
// one a full rebuild makes; so does a rebuild from the archive's files. A
// rebuild from the hot log alone refuses to run once history is archived,
// and, made to run, differs: the comparison can fail.
func TestRebuildFromSnapshotAndHotLogEqualsAFullRebuild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	s := ledgertest.SmallPartitions(t, e.db.Pool, fence.Config{}, 100)
	h := &history{t: t, s: s, heads: map[string]int64{}}
	for p := range 4 {
		l, err := s.Acquire(ctx, p, fmt.Sprintf("writer.%d", p), fence.TTLMax)
		require.NoError(t, err)
		h.leases = append(h.leases, l)
	}
	var old, young []string
	for i := range 40 {
		old = append(old, fmt.Sprintf("old-%d", i))
	}
	for i := range 8 {
		young = append(young, fmt.Sprintf("young-%d", i))
	}
	h.rounds(old, 15) // 600 events

	rebuild := func(src projector.RebuildSource) (map[string]projection.State, error) {
		p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(t), Pool: e.db.Pool, Logger: discard()})
		require.NoError(t, err)
		err = p.RebuildFrom(ctx, src, nil)
		return e.snapshot(), err
	}
	_, err := rebuild(projector.RebuildSource{})
	require.NoError(t, err)
	var snap bytes.Buffer
	hdr, tasks, skipped, err := projector.WriteSnapshot(ctx, e.js, e.db.Pool, &snap)
	require.NoError(t, err)
	require.EqualValues(t, 40, tasks)
	require.Zero(t, skipped)
	require.EqualValues(t, 1, hdr.BelowSeq, "nothing archived when the snapshot was taken")

	h.rounds(old, 10)
	h.rounds(append(young, old[:4]...), 6)
	full, err := rebuild(projector.RebuildSource{})
	require.NoError(t, err)
	require.Len(t, full, 48)

	rep, err := s.Archive(ctx, fence.ArchiveOptions{Dir: t.TempDir(), BeforeSeq: 501})
	require.NoError(t, err)
	require.EqualValues(t, 501, rep.Horizon.BelowSeq)

	untouched, err := rebuild(projector.RebuildSource{})
	require.ErrorIs(t, err, projector.ErrHistoryArchived)
	sameProjections(t, full, untouched) // refused before it changed anything

	fromSnapshot, err := rebuild(projector.RebuildSource{Snapshot: bytes.NewReader(snap.Bytes())})
	require.NoError(t, err)
	sameProjections(t, full, fromSnapshot)

	hotOnly, err := rebuild(projector.RebuildSource{HotOnly: true})
	require.ErrorIs(t, err, projector.ErrHistoryArchived, "tasks wait for archived versions, and the rebuild says so")
	require.ErrorContains(t, err, "40 tasks wait for versions that are archived")
	differ := 0
	for task, want := range full {
		if got := hotOnly[task]; got.Version != want.Version || got.Gap != nil {
			differ++
		}
	}
	require.Equal(t, 40, differ, "from the hot log alone, every old task lacks its archived versions")
}

// A rebuild from the archive's files replays all of history: it equals the
// full rebuild, and refuses files that do not reach the horizon.
func TestRebuildFromTheArchiveEqualsAFullRebuild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	s := ledgertest.SmallPartitions(t, e.db.Pool, fence.Config{}, 100)
	h := &history{t: t, s: s, heads: map[string]int64{}}
	for p := range 4 {
		l, err := s.Acquire(ctx, p, fmt.Sprintf("writer.%d", p), fence.TTLMax)
		require.NoError(t, err)
		h.leases = append(h.leases, l)
	}
	var tasks []string
	for i := range 30 {
		tasks = append(tasks, fmt.Sprintf("t-%d", i))
	}
	h.rounds(tasks, 20)
	rebuild := func(src projector.RebuildSource) (map[string]projection.State, error) {
		p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(t), Pool: e.db.Pool, Logger: discard()})
		require.NoError(t, err)
		err = p.RebuildFrom(ctx, src, nil)
		return e.snapshot(), err
	}
	full, err := rebuild(projector.RebuildSource{})
	require.NoError(t, err)

	first, second := t.TempDir(), t.TempDir()
	_, err = s.Archive(ctx, fence.ArchiveOptions{Dir: first, BeforeSeq: 201})
	require.NoError(t, err)
	_, err = s.Archive(ctx, fence.ArchiveOptions{Dir: second, BeforeSeq: 401})
	require.NoError(t, err)

	_, err = rebuild(projector.RebuildSource{ArchiveDir: first})
	require.ErrorContains(t, err, "end at seq 201, but history below seq 401 is archived")
	_, err = rebuild(projector.RebuildSource{ArchiveDir: second})
	require.ErrorContains(t, err, "the archive lacks seq 1..200, before events-0000000000000000201")

	// The operator gathers both runs' files in one directory, as one
	// manifest lists them.
	all := t.TempDir()
	m := fence.Manifest{Format: fence.ArchiveFormat}
	for _, d := range []string{first, second} {
		dm, err := fence.ReadManifest(d)
		require.NoError(t, err)
		for _, f := range dm.Files {
			copyFile(t, d, all, f.File)
			m.Files = append(m.Files, f)
		}
		m.Horizon = dm.Horizon
	}
	writeManifest(t, all, m)
	fromArchive, err := rebuild(projector.RebuildSource{ArchiveDir: all})
	require.NoError(t, err)
	sameProjections(t, full, fromArchive)
}

func sameProjections(t *testing.T, want, got map[string]projection.State) {
	t.Helper()
	require.Len(t, got, len(want))
	for task, w := range want {
		g, ok := got[task]
		require.True(t, ok, task)
		require.Equal(t, w.Version, g.Version, task)
		require.Equal(t, w.Status, g.Status, task)
		require.Equal(t, w.Seq, g.Seq, task)
		require.Equal(t, w.Partition, g.Partition, task)
		require.JSONEq(t, string(w.Data), string(g.Data), task)
		require.Nil(t, g.Gap, task)
	}
}

// A snapshot is read whole or not at all.
func TestReadSnapshotRefusesWhatIsNotAWholeSnapshot(t *testing.T) {
	t.Parallel()
	whole := snapshotBytes(t, goodSnapshotLines...)
	var got []projection.State
	h, err := projector.ReadSnapshot(bytes.NewReader(whole), func(st projection.State) error {
		got = append(got, st)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, projector.SnapshotFormat, h.Format)
	require.Len(t, got, 2)
	require.Equal(t, "report-7", got[0].Task)

	for name, lines := range map[string][]string{
		"truncated":            goodSnapshotLines[:3],
		"count wrong":          append(append([]string{}, goodSnapshotLines[:3]...), `{"end":true,"tasks":3}`),
		"after the end":        append(append([]string{}, goodSnapshotLines...), goodSnapshotLines[1]),
		"no header":            goodSnapshotLines[1:],
		"a value with a field": {goodSnapshotLines[0], `{"task":"a","partition":1,"version":1,"status":"","data":null,"seq":1,"updated_at":"2026-01-01T00:00:00Z","gap":null,"x":1}`, `{"end":true,"tasks":1}`},
		"a bad task id":        {goodSnapshotLines[0], `{"task":"a.b","partition":1,"version":1,"status":"","data":null,"seq":1,"updated_at":"2026-01-01T00:00:00Z","gap":null}`, `{"end":true,"tasks":1}`},
	} {
		_, err := projector.ReadSnapshot(bytes.NewReader(snapshotBytes(t, lines...)), func(projection.State) error { return nil })
		require.Error(t, err, name)
	}
	_, err = projector.ReadSnapshot(strings.NewReader("not gzip"), func(projection.State) error { return nil })
	require.Error(t, err)
	stop := errors.New("stop")
	_, err = projector.ReadSnapshot(bytes.NewReader(whole), func(projection.State) error { return stop })
	require.ErrorIs(t, err, stop)
}

var goodSnapshotLines = []string{
	`{"format":"ledger-snapshot/1","taken_at":"2026-11-30T20:00:00Z","bucket":"ledger_tasks","below_seq":1}`,
	`{"task":"report-7","partition":3,"version":2,"status":"done","data":{"a":1},"seq":9,"updated_at":"2026-11-30T20:00:00Z","gap":null}`,
	`{"task":"job","partition":1,"version":4,"status":"x","data":null,"seq":12,"updated_at":"2026-11-30T20:00:00Z","gap":{"next_version":5,"buffered":2,"since":"2026-11-30T20:00:00Z"}}`,
	`{"end":true,"tasks":2}`,
}

func snapshotBytes(t testing.TB, lines ...string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	_, err := gz.Write([]byte(strings.Join(lines, "\n") + "\n"))
	require.NoError(t, err)
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

// A snapshot line says one thing: a key in another case, or given twice,
// at the top or inside the gap, is refused (encoding/json would take it and
// keep the last).
func TestDecodeSnapshotValueTakesOnlyExactKeysOnce(t *testing.T) {
	t.Parallel()
	good := goodSnapshotLines[2]
	_, err := projector.DecodeSnapshotValue([]byte(good))
	require.NoError(t, err)
	for _, bad := range []string{
		strings.Replace(good, `"version":4`, `"Version":4`, 1),
		strings.Replace(good, `"version":4`, `"version":4,"version":9`, 1),
		strings.Replace(good, `"version":4`, `"version":4,"VERSION":9`, 1),
		strings.Replace(good, `"next_version":5`, `"Next_Version":5`, 1),
		strings.Replace(good, `"next_version":5`, `"next_version":5,"next_version":6`, 1),
	} {
		_, err := projector.DecodeSnapshotValue([]byte(bad))
		require.Error(t, err, bad)
	}
}

func FuzzDecodeSnapshotValue(f *testing.F) {
	for _, l := range goodSnapshotLines {
		f.Add([]byte(l))
	}
	f.Add([]byte(`{"task":"a.b","version":1}`))
	f.Add([]byte(`{"task":"a","version":-1}`))
	f.Add([]byte(`{"task":"a","data":{"x":`))
	f.Add([]byte(`{"task":"a","gap":{"next_version":1,"buffered":-1}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		st, err := projector.DecodeSnapshotValue(line)
		if err != nil {
			return
		}
		if !wire.ValidID(st.Task) || st.Version < 0 || st.Seq < 0 {
			t.Fatalf("accepted %+v", st)
		}
	})
}

// FuzzReadSnapshot: a snapshot file is an operator's input, and any bytes
// may be handed in, compressed or not. Reading never panics; what it takes
// is whole: each projection passes the value checks, and the same text
// without its last line (the end line) is refused.
func FuzzReadSnapshot(f *testing.F) {
	whole := strings.Join(goodSnapshotLines, "\n") + "\n"
	f.Add([]byte(whole), true)
	f.Add([]byte(strings.Join(goodSnapshotLines[:3], "\n")), true)
	f.Add([]byte(whole+"\n"), true)
	f.Add([]byte(goodSnapshotLines[0]+"\n"+`{"end":true,"tasks":0}`), true)
	f.Add(snapshotBytes(f, goodSnapshotLines...), false)
	f.Add([]byte("\x1f\x8b\x08\x00"), false)
	f.Fuzz(func(t *testing.T, data []byte, compress bool) {
		input := data
		if compress {
			input = ledgertest.GzipStored(data)
		}
		n := 0
		h, err := projector.ReadSnapshot(bytes.NewReader(input), func(st projection.State) error {
			n++
			if !wire.ValidID(st.Task) || st.Version < 0 || st.Seq < 0 || st.Partition < 0 {
				t.Fatalf("handed on %+v", st)
			}
			return nil
		})
		if err != nil || !compress {
			return
		}
		if h.Format != projector.SnapshotFormat || h.Bucket == "" {
			t.Fatalf("took a snapshot with header %+v", h)
		}
		text := strings.TrimSuffix(string(data), "\n")
		cut := strings.LastIndexByte(text, '\n')
		if cut < 0 {
			t.Fatalf("took a snapshot of one line (%d projections): %q", n, data)
		}
		if _, err := projector.ReadSnapshot(bytes.NewReader(snapshotBytes(t, text[:cut])), func(projection.State) error { return nil }); err == nil {
			t.Fatalf("took the snapshot without its last line too: %q", data)
		}
	})
}

// A rebuild from the archive checks every file before it changes anything:
// a file altered after its manifest was written, and a file altered with a
// manifest rewritten to fit it, are refused, and the bucket keeps every
// projection it had. The second is caught only by the sums the ledger
// recorded as it archived (ledger.event_partitions).
func TestRebuildRefusesATamperedArchiveBeforeChangingAnything(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	s := ledgertest.SmallPartitions(t, e.db.Pool, fence.Config{}, 100)
	h := &history{t: t, s: s, heads: map[string]int64{}}
	for p := range 4 {
		l, err := s.Acquire(ctx, p, fmt.Sprintf("writer.%d", p), fence.TTLMax)
		require.NoError(t, err)
		h.leases = append(h.leases, l)
	}
	var tasks []string
	for i := range 30 {
		tasks = append(tasks, fmt.Sprintf("t-%d", i))
	}
	h.rounds(tasks, 20)
	rebuild := func(src projector.RebuildSource) (map[string]projection.State, error) {
		p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(t), Pool: e.db.Pool, Logger: discard()})
		require.NoError(t, err)
		err = p.RebuildFrom(ctx, src, nil)
		return e.snapshot(), err
	}
	dir := t.TempDir()
	_, err := s.Archive(ctx, fence.ArchiveOptions{Dir: dir, BeforeSeq: 201})
	require.NoError(t, err)
	good, err := rebuild(projector.RebuildSource{ArchiveDir: dir})
	require.NoError(t, err)
	m, err := fence.ReadManifest(dir)
	require.NoError(t, err)
	require.Len(t, m.Files, 2)
	last := m.Files[1] // the first file's rows come before it

	appended := t.TempDir()
	for _, f := range m.Files {
		copyFile(t, dir, appended, f.File)
	}
	writeManifest(t, appended, m)
	fh, err := os.OpenFile(filepath.Join(appended, last.File), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = fh.WriteString("tampered")
	require.NoError(t, err)
	require.NoError(t, fh.Close())
	got, err := rebuild(projector.RebuildSource{ArchiveDir: appended})
	require.ErrorContains(t, err, last.File)
	sameProjections(t, good, got)

	// The last file loses its last row; its manifest entry is made to fit.
	refitted := t.TempDir()
	for _, f := range m.Files {
		copyFile(t, dir, refitted, f.File)
	}
	data := gunzip(t, filepath.Join(dir, last.File))
	lines := bytes.SplitAfter(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, err = zw.Write(bytes.Join(lines[:len(lines)-1], nil))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.NoError(t, os.WriteFile(filepath.Join(refitted, last.File), zipped.Bytes(), 0o644))
	sum := sha256.Sum256(zipped.Bytes())
	m.Files[1].SHA256, m.Files[1].Rows, m.Files[1].Bytes = hex.EncodeToString(sum[:]), last.Rows-1, int64(zipped.Len())
	writeManifest(t, refitted, m)
	_, err = fence.VerifyArchive(refitted)
	require.NoError(t, err, "the files fit the rewritten manifest")
	got, err = rebuild(projector.RebuildSource{ArchiveDir: refitted})
	require.ErrorContains(t, err, "the ledger archived")
	sameProjections(t, good, got)
}

func gunzip(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	require.NoError(t, err)
	var out bytes.Buffer
	_, err = out.ReadFrom(zr)
	require.NoError(t, err)
	return out.Bytes()
}
