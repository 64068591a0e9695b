package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Kinds of writer log records: one JSON object per line, written by a
// writer as things happen, read by the checker. Times are the writer's wall
// clock in Unix nanoseconds; every writer runs on the orchestrator's host,
// so times of different writers compare.
const (
	// KindStart opens a log: the writer's holder, partition and tasks.
	KindStart = "start"
	// KindGrant is a lease grant: T is when its reply arrived.
	KindGrant = "grant"
	// KindHeld is an acquire refused because another holder has the lease.
	KindHeld = "held"
	// KindLost is the writer giving up its generation (Why says why).
	KindLost = "lost"
	// KindHead is a task head the writer resumes from.
	KindHead = "head"
	// KindWoke is the writer noticing that it was paused (Paused says how
	// long); while Zombie it keeps publishing with its old generation.
	KindWoke = "woke"
	// KindPub is one send of an event, logged just before it leaves.
	KindPub = "pub"
	// KindAck is JetStream's publish ack of an event: it is in LEDGER_IN.
	KindAck = "ack"
	// KindNack is a send that got no ack (Err says why).
	KindNack = "nack"
	// KindReceipt is a receipt the writer received.
	KindReceipt = "rcpt"
	// KindEffect is a direct side effect of an intent (ID), logged just
	// before the writer performs it downstream with generation Gen.
	KindEffect = "effect"
	// KindEffectDone is its outcome: Verdict applied, refused (the fence
	// check) or error (Err).
	KindEffectDone = "effect_done"
	// KindStop closes a log.
	KindStop = "stop"
)

// Record is one line of a writer log. Fields a kind does not use are empty.
type Record struct {
	Kind string `json:"k"`
	// T is the writer's wall clock, Unix nanoseconds.
	T int64 `json:"t"`
	// Sent is when the request behind a grant, held or lost was sent.
	Sent      int64    `json:"sent,omitempty"`
	Holder    string   `json:"holder,omitempty"`
	Partition *int     `json:"partition,omitempty"`
	Tasks     []string `json:"tasks,omitempty"`
	TTLMillis int64    `json:"ttl_ms,omitempty"`
	Gen       int64    `json:"gen,omitempty"`
	ExpiresAt string   `json:"expires_at,omitempty"`
	ID        string   `json:"id,omitempty"`
	Task      string   `json:"task,omitempty"`
	Version   int64    `json:"v,omitempty"`
	Type      string   `json:"type,omitempty"`
	Try       int      `json:"try,omitempty"`
	Zombie    bool     `json:"zombie,omitempty"`
	Seq       uint64   `json:"seq,omitempty"`
	Dup       bool     `json:"dup,omitempty"`
	Verdict   string   `json:"verdict,omitempty"`
	Reason    string   `json:"reason,omitempty"`
	// PausedMillis is how long a woken writer was stopped.
	PausedMillis int64  `json:"paused_ms,omitempty"`
	Why          string `json:"why,omitempty"`
	Err          string `json:"err,omitempty"`
}

// maxRecordLine bounds one line of a writer log; the longest real one, a
// start record with a few hundred task ids, stays far below.
const maxRecordLine = 1 << 20

// WriterLog is one writer's log, decoded.
type WriterLog struct {
	// Name is where it was read from (a file name), for messages.
	Name      string
	Holder    string
	Partition int
	Tasks     []string
	Records   []Record
	// Truncated is set when the last line had no newline (the writer died
	// while writing it); that line is left out.
	Truncated bool
}

// ErrBadLog is wrapped by every error of ReadLog about the log's content.
var ErrBadLog = errors.New("chaos: bad writer log")

// ReadLog decodes a writer log: a start record, then records of known kinds
// whose fields are valid for their kind. A final line without a newline is
// left out (Truncated); any other malformed line is an error naming it.
func ReadLog(name string, r io.Reader) (*WriterLog, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	wl := &WriterLog{Name: name}
	for n := 1; ; n++ {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				wl.Truncated = true
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s line %d: %w", ErrBadLog, name, n, err)
		}
		rec, err := decodeRecord(line)
		if err != nil {
			return nil, fmt.Errorf("%w: %s line %d: %w", ErrBadLog, name, n, err)
		}
		if n == 1 {
			if rec.Kind != KindStart {
				return nil, fmt.Errorf("%w: %s line 1: a log begins with a %q record, not %q", ErrBadLog, name, KindStart, rec.Kind)
			}
			wl.Holder, wl.Partition, wl.Tasks = rec.Holder, *rec.Partition, rec.Tasks
		} else if rec.Kind == KindStart {
			return nil, fmt.Errorf("%w: %s line %d: a second %q record", ErrBadLog, name, n, KindStart)
		}
		wl.Records = append(wl.Records, rec)
	}
	if len(wl.Records) == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrBadLog, name)
	}
	return wl, nil
}

// readLine returns the next line without its newline; io.EOF comes with
// the unterminated rest, if any.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxRecordLine {
			return nil, fmt.Errorf("line longer than %d bytes", maxRecordLine)
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}

// decodeRecord decodes one line strictly: one JSON object, no unknown
// member, and the members its kind needs.
func decodeRecord(line []byte) (Record, error) {
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return rec, fmt.Errorf("not a record: %w", err)
	}
	// More is false before a stray '}' or ']': only the end of the line
	// ends a record.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return rec, errors.New("data after the record")
	}
	return rec, rec.check()
}

// check says what a record lacks for its kind.
func (r Record) check() error {
	if r.T <= 0 {
		return fmt.Errorf("%s record without a time", r.Kind)
	}
	need := func(ok bool, what string) error {
		if !ok {
			return fmt.Errorf("%s record without %s", r.Kind, what)
		}
		return nil
	}
	switch r.Kind {
	case KindStart:
		if err := need(wire.ValidHolder(r.Holder), "a valid holder"); err != nil {
			return err
		}
		if err := need(r.Partition != nil && *r.Partition >= 0, "a partition"); err != nil {
			return err
		}
		for _, t := range r.Tasks {
			if !wire.ValidID(t) {
				return fmt.Errorf("start record with task id %q", t)
			}
		}
		return need(len(r.Tasks) > 0, "tasks")
	case KindGrant, KindLost:
		return need(r.Gen > 0, "a generation")
	case KindHead:
		return need(r.Task != "" && r.Version >= 0, "a task")
	case KindPub:
		return need(r.ID != "" && r.Task != "" && r.Version > 0 && r.Gen > 0, "an event id, task, version and generation")
	case KindAck:
		return need(r.ID != "" && r.Seq > 0, "an event id and stream sequence")
	case KindNack, KindReceipt:
		return need(r.ID != "", "an event id")
	case KindEffect:
		return need(r.ID != "" && r.Gen > 0, "an event id and generation")
	case KindEffectDone:
		return need(r.ID != "" && (r.Verdict == "applied" || r.Verdict == "refused" || r.Verdict == "error"),
			"an event id and an outcome (applied, refused or error)")
	case KindHeld, KindWoke, KindStop:
		return nil
	}
	return fmt.Errorf("unknown record kind %q", r.Kind)
}

// logWriter appends records to a writer log. It is safe for concurrent use;
// Flush pushes buffered lines to the file.
type logWriter struct {
	mu  sync.Mutex
	w   *bufio.Writer
	err error
}

func newLogWriter(w io.Writer) *logWriter {
	return &logWriter{w: bufio.NewWriterSize(w, 64<<10)}
}

// add writes rec with its time set to now unless it has one.
func (l *logWriter) add(rec Record) {
	if rec.T == 0 {
		rec.T = time.Now().UnixNano()
	}
	b, err := json.Marshal(rec)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		b = append(b, '\n')
		_, err = l.w.Write(b)
	}
	if err != nil && l.err == nil {
		l.err = err
	}
}

func (l *logWriter) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.w.Flush(); err != nil && l.err == nil {
		l.err = err
	}
	return l.err
}
