package fence

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flowness/ledger/internal/strictjson"
	"github.com/flowness/ledger/pkg/wire"
)

// The archive's files (docs/contract.md §7, "Archived history"): one
// gzip-compressed JSON-lines file per archived partition of ledger.events,
// every committed row of it in seq order, and a manifest that lists the
// files with their seq ranges, row counts and SHA-256 sums.

// ArchiveFormat names the format in every manifest.
const ArchiveFormat = "ledger-archive/1"

// ManifestName is the manifest's file name in an archive directory.
const ManifestName = "manifest.json"

// maxArchiveLine bounds one line of an archive file: a row's payload is at
// most about three times MaxPayload plus 4 KiB as PostgreSQL renders it
// (doc.go, Bounded payloads), and the rest of a row is small.
const maxArchiveLine = 4<<20 + 64<<10

// Manifest lists an archive directory's files.
type Manifest struct {
	Format string `json:"format"`
	// Horizon is ledger.horizon as the last archive left it.
	Horizon ManifestHorizon `json:"horizon"`
	// Files are in seq order, each covering [FromSeq, BelowSeq).
	Files []ManifestFile `json:"files"`
}

// ManifestHorizon is the archive horizon (ledger.horizon).
type ManifestHorizon struct {
	BelowSeq  int64     `json:"below_seq"`
	IDFloor   string    `json:"id_floor"`
	IDFloorAt time.Time `json:"id_floor_at"`
}

// ManifestFile is one archived partition.
type ManifestFile struct {
	File             string    `json:"file"`
	FromSeq          int64     `json:"from_seq"`
	BelowSeq         int64     `json:"below_seq"`
	Rows             int64     `json:"rows"`
	Bytes            int64     `json:"bytes"`
	SHA256           string    `json:"sha256"`
	FirstCommittedAt time.Time `json:"first_committed_at"`
	LastCommittedAt  time.Time `json:"last_committed_at"`
	ArchivedAt       time.Time `json:"archived_at"`
}

// archiveLine is one row of an archive file, the columns of ledger.events.
type archiveLine struct {
	Seq         *int64          `json:"seq"`
	EventID     *string         `json:"event_id"`
	Partition   *int            `json:"partition"`
	TaskID      *string         `json:"task_id"`
	Version     *int64          `json:"version"`
	Type        *string         `json:"type"`
	Holder      *string         `json:"holder"`
	Generation  *int64          `json:"generation"`
	CommittedAt *string         `json:"committed_at"`
	Payload     json.RawMessage `json:"payload"`
}

// encodeArchiveLine appends c as one line of an archive file.
func encodeArchiveLine(buf *bytes.Buffer, c *Committed) error {
	at := wire.FormatTime(c.CommittedAt)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	return enc.Encode(archiveLine{Seq: &c.Seq, EventID: &c.EventID, Partition: &c.Partition, TaskID: &c.Task,
		Version: &c.Version, Type: &c.Type, Holder: &c.Holder, Generation: &c.Generation, CommittedAt: &at,
		Payload: json.RawMessage(c.Payload)})
}

// DecodeArchiveLine reads one line of an archive file: a JSON object with
// exactly the columns of ledger.events, each once, a ULID event id, a task
// id of the contract's form, positive seq, version and generation, and a
// JSON payload. Anything else is an error that says what is wrong.
func DecodeArchiveLine(line []byte) (Committed, error) {
	var l archiveLine
	if err := strictjson.Decode(line, &l); err != nil {
		return Committed{}, fmt.Errorf("not an archive row: %w", err)
	}
	switch {
	case l.Seq == nil || l.EventID == nil || l.Partition == nil || l.TaskID == nil || l.Version == nil ||
		l.Type == nil || l.Holder == nil || l.Generation == nil || l.CommittedAt == nil || l.Payload == nil:
		return Committed{}, errors.New("archive row: a column is missing")
	case *l.Seq < 1 || *l.Version < 1 || *l.Generation < 1 || *l.Partition < 0:
		return Committed{}, fmt.Errorf("archive row: seq %d, version %d, generation %d, partition %d out of range",
			*l.Seq, *l.Version, *l.Generation, *l.Partition)
	case !wire.ValidEventIDAnyCase(*l.EventID):
		return Committed{}, fmt.Errorf("archive row %d: event id %.40q is not a ULID", *l.Seq, *l.EventID)
	case !wire.ValidID(*l.TaskID):
		return Committed{}, fmt.Errorf("archive row %d: task id %.40q is not 1..128 of [A-Za-z0-9_-]", *l.Seq, *l.TaskID)
	case *l.Type == "" || *l.Holder == "":
		return Committed{}, fmt.Errorf("archive row %d: empty type or holder", *l.Seq)
	}
	at, err := time.Parse(time.RFC3339Nano, *l.CommittedAt)
	if err != nil {
		return Committed{}, fmt.Errorf("archive row %d: committed_at: %w", *l.Seq, err)
	}
	return Committed{Seq: *l.Seq, EventID: *l.EventID, Partition: *l.Partition, Task: *l.TaskID, Version: *l.Version,
		Type: *l.Type, Payload: []byte(l.Payload), Holder: *l.Holder, Generation: *l.Generation, CommittedAt: at}, nil
}

// ArchiveReader reads the rows of one archive file in order.
type ArchiveReader struct {
	sc   *bufio.Scanner
	last int64
	rows int64
}

// NewArchiveReader reads an archive file from r (gzip-compressed JSON
// lines).
func NewArchiveReader(r io.Reader) (*ArchiveReader, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("archive file: %w", err)
	}
	sc := bufio.NewScanner(gz)
	sc.Buffer(make([]byte, 64<<10), maxArchiveLine)
	return &ArchiveReader{sc: sc}, nil
}

// Next returns the next row, or io.EOF after the last. Rows must rise in
// seq.
func (a *ArchiveReader) Next() (Committed, error) {
	if !a.sc.Scan() {
		if err := a.sc.Err(); err != nil {
			return Committed{}, fmt.Errorf("archive file, after row %d: %w", a.rows, err)
		}
		return Committed{}, io.EOF
	}
	c, err := DecodeArchiveLine(a.sc.Bytes())
	if err != nil {
		return Committed{}, fmt.Errorf("archive file, row %d: %w", a.rows+1, err)
	}
	if c.Seq <= a.last {
		return Committed{}, fmt.Errorf("archive file, row %d: seq %d after seq %d", a.rows+1, c.Seq, a.last)
	}
	a.last = c.Seq
	a.rows++
	return c, nil
}

// DecodeManifest reads a manifest strictly: the format named, no unknown
// fields, files in seq order without overlaps, each with a plain file name
// and a SHA-256 sum.
func DecodeManifest(data []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("archive manifest: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Manifest{}, errors.New("archive manifest: more after the object")
	}
	if m.Format != ArchiveFormat {
		return Manifest{}, fmt.Errorf("archive manifest: format %.40q, want %q", m.Format, ArchiveFormat)
	}
	var below int64
	for i, f := range m.Files {
		switch {
		case f.File == "" || f.File != filepath.Base(f.File) || strings.HasPrefix(f.File, ".") || strings.ContainsAny(f.File, `/\`):
			return Manifest{}, fmt.Errorf("archive manifest: file %d: %.60q is not a plain file name", i, f.File)
		case f.FromSeq < 1 || f.BelowSeq <= f.FromSeq || f.FromSeq < below:
			return Manifest{}, fmt.Errorf("archive manifest: file %s: seq range [%d, %d) is empty or overlaps the one before", f.File, f.FromSeq, f.BelowSeq)
		case f.Rows < 0 || f.Rows > f.BelowSeq-f.FromSeq || f.Bytes < 0:
			return Manifest{}, fmt.Errorf("archive manifest: file %s: %d rows, %d bytes", f.File, f.Rows, f.Bytes)
		}
		if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != sha256.Size {
			return Manifest{}, fmt.Errorf("archive manifest: file %s: %.80q is not a SHA-256 sum", f.File, f.SHA256)
		}
		below = f.BelowSeq
	}
	return m, nil
}

// ReadManifest reads the manifest of archive directory dir; a directory
// without one has an empty manifest.
func ReadManifest(dir string) (Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, os.ErrNotExist) {
		return Manifest{Format: ArchiveFormat}, nil
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("read the archive manifest: %w", err)
	}
	return DecodeManifest(data)
}

// ReplayArchive calls fn with every row of the archive in dir, in seq
// order, after checking each file against the manifest: its SHA-256 sum,
// its rows and their seq range. It returns the manifest.
func ReplayArchive(dir string, fn func(Committed) error) (Manifest, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return m, err
	}
	for _, f := range m.Files {
		if err := replayFile(dir, f, fn); err != nil {
			return m, err
		}
	}
	return m, nil
}

// VerifyArchive checks every file of the archive in dir against the
// manifest as ReplayArchive does, and applies no row: a rebuild calls it
// before it changes anything.
func VerifyArchive(dir string) (Manifest, error) {
	return ReplayArchive(dir, nil)
}

// replayFile reads one archive file, calling fn for each row, and fails
// unless the file is the one the manifest describes.
func replayFile(dir string, f ManifestFile, fn func(Committed) error) error {
	fh, err := os.Open(filepath.Join(dir, f.File))
	if err != nil {
		return fmt.Errorf("archive file %s: %w", f.File, err)
	}
	defer fh.Close()
	h := sha256.New()
	r, err := NewArchiveReader(io.TeeReader(fh, h))
	if err != nil {
		return fmt.Errorf("archive file %s: %w", f.File, err)
	}
	var rows int64
	for {
		c, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("archive file %s: %w", f.File, err)
		}
		if c.Seq < f.FromSeq || c.Seq >= f.BelowSeq {
			return fmt.Errorf("archive file %s: seq %d is outside [%d, %d)", f.File, c.Seq, f.FromSeq, f.BelowSeq)
		}
		rows++
		if fn != nil {
			if err := fn(c); err != nil {
				return err
			}
		}
	}
	// What follows the gzip stream counts toward the sum as well.
	if _, err := io.Copy(h, fh); err != nil {
		return fmt.Errorf("archive file %s: %w", f.File, err)
	}
	if rows != f.Rows {
		return fmt.Errorf("archive file %s: %d rows, the manifest says %d", f.File, rows, f.Rows)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.SHA256 {
		return fmt.Errorf("archive file %s: SHA-256 %s, the manifest says %s", f.File, sum, f.SHA256)
	}
	return nil
}

// writeManifest replaces the manifest of dir with m, atomically.
func writeManifest(dir string, m Manifest) error {
	slices.SortFunc(m.Files, func(a, b ManifestFile) int { return int(a.FromSeq - b.FromSeq) })
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(dir, ManifestName, append(data, '\n'))
}

// writeFileAtomic writes name in dir through a temporary file, synced and
// renamed, so that a crash leaves the old file or the new one, never half.
func writeFileAtomic(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
