package chaos

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// History is everything the checker reads: what the writers logged, and
// what PostgreSQL, LEDGER_LOG, LEDGER_DLQ and the bucket hold for the run's
// tasks and partitions. Nothing in it is what a service said about itself.
type History struct {
	Writers []*WriterLog
	// Events are the rows of ledger.events of the run's tasks, by seq.
	Events []EventRow
	// Rejections are the rows of ledger.rejections of the run's tasks.
	Rejections []RejectionRow
	// Grants are the rows of ledger.lease_grants of the run's partitions.
	Grants []GrantRow
	// Log holds the LEDGER_LOG copies of the run's tasks in stream order.
	Log []Copy
	// DLQ holds the LEDGER_DLQ letters of the run's tasks in stream order.
	DLQ []Letter
	// Projections are the ledger_tasks values of the run's tasks; a task
	// without a key is absent.
	Projections map[string][]byte
	// Effects are the downstream's applied effects (chaos_effects), when
	// EffectsRead: a run against an external deployment has none.
	Effects     []EffectRow
	EffectsRead bool
	// SupersededEvents and SupersededGrants are the run's rows an old
	// primary committed after it came back writable (a split brain), read
	// from it before it was removed.
	SupersededEvents []EventRow
	SupersededGrants []GrantRow
	// Forgetful are the windows, Unix nanoseconds from and to, in which
	// the database was allowed to forget: from the freeze of an
	// asynchronous standby to its promotion. A grant given then may be
	// missing from ledger.lease_grants.
	Forgetful [][2]int64
	// Observing holds the run's partitions in the observe fence mode
	// (docs/contract.md §13, ledger.fence_modes): there an event the fence
	// would refuse commits, and says so (would_reject).
	Observing map[int]bool
}

// EventRow is a row of ledger.events.
type EventRow struct {
	Seq         int64
	EventID     string
	Partition   int
	Task        string
	Version     int64
	Type        string
	Payload     json.RawMessage
	Holder      string
	Generation  int64
	CommittedAt time.Time
	// WouldReject is what the enforce mode would have answered to a
	// commit under observe ("stale/<reason>"); "" for every other row.
	WouldReject string
}

// RejectionRow is a row of ledger.rejections.
type RejectionRow struct {
	EventID           string
	Partition         int
	Task              string
	Version           int64
	Holder            string
	Generation        int64
	Verdict           string
	Reason            string
	CurrentGeneration int64
	RejectedAt        time.Time
}

// GrantRow is a row of ledger.lease_grants.
type GrantRow struct {
	Partition  int
	Generation int64
	Holder     string
	GrantedAt  time.Time
}

// Copy is a LEDGER_LOG message. Err says which of its headers did not
// parse; such a copy matches no row.
type Copy struct {
	StreamSeq  uint64
	Subject    string
	EventID    string
	Task       string
	Partition  int
	Version    int64
	Seq        int64
	Type       string
	Holder     string
	Generation int64
	// WouldReject is the copy's Ledger-Would-Reject header.
	WouldReject string
	Err         string
}

// Letter is a LEDGER_DLQ message.
type Letter struct {
	StreamSeq  uint64
	Subject    string
	EventID    string
	Task       string
	Version    int64
	Holder     string
	Generation int64
	Verdict    string
	Reason     string
	// Err says why the codec refused the letter's own headers.
	Err string
}

// parseCopy reads a LEDGER_LOG message with the contract's codec. A copy
// the codec refuses keeps what could be read, and Err says why.
func parseCopy(subj wire.Subjects, streamSeq uint64, subject string, h nats.Header, data []byte) Copy {
	lc, err := subj.DecodeLog(subject, h, data)
	c := copyOf(streamSeq, subject, &lc)
	if err != nil {
		c.Err = err.Error()
	} else if !wire.ValidEventID(c.EventID) {
		c.Err = fmt.Sprintf("its %s %q is not an event id", wire.HeaderMsgID, c.EventID)
	}
	return c
}

// copyOf is the checker's Copy of a decoded copy stored at streamSeq.
func copyOf(streamSeq uint64, subject string, lc *wire.LogCopy) Copy {
	return Copy{StreamSeq: streamSeq, Subject: subject, EventID: lc.EventID, Task: lc.Task, Partition: lc.Partition,
		Version: lc.Version, Seq: lc.Seq, Type: lc.Type, Holder: lc.Holder, Generation: lc.Generation,
		WouldReject: lc.WouldReject}
}

// parseCopies reads any LEDGER_LOG message: a copy (parseCopy), or each
// event of a log batch, all with the batch's stream sequence and subject.
// A batch the codec refuses is one Copy whose Err says why.
func parseCopies(subj wire.Subjects, streamSeq uint64, subject string, h nats.Header, data []byte) []Copy {
	if !subj.IsLogBatch(subject) {
		return []Copy{parseCopy(subj, streamSeq, subject, h, data)}
	}
	lcs, err := subj.DecodeLogBatch(subject, h, data)
	if err != nil {
		return []Copy{{StreamSeq: streamSeq, Subject: subject, Err: err.Error()}}
	}
	out := make([]Copy, len(lcs))
	for i := range lcs {
		lc := &lcs[i]
		out[i] = copyOf(streamSeq, subject, lc)
		if !wire.ValidEventID(lc.EventID) {
			out[i].Err = fmt.Sprintf("its event_id %q is not an event id", lc.EventID)
		}
	}
	return out
}

// parseLetter reads a LEDGER_DLQ message with the contract's codec; the
// event's own numbers are read from its original headers (0 where they
// are not numbers), its task from the subject.
func parseLetter(subj wire.Subjects, streamSeq uint64, subject string, h nats.Header, data []byte) Letter {
	d, err := wire.DecodeDeadLetter(h, data)
	num := func(name string) int64 {
		n, _ := wire.ParseInt(d.Header.Get(name))
		return n
	}
	l := Letter{StreamSeq: streamSeq, Subject: subject, EventID: wire.EventIDOf(d.Header.Get(wire.HeaderMsgID)),
		Version: num(wire.HeaderVersion), Holder: d.Header.Get(wire.HeaderHolder), Generation: num(wire.HeaderGeneration),
		Verdict: string(d.Verdict), Reason: d.Reason}
	if err != nil {
		l.Err = err.Error()
	}
	if _, task, err := subj.ParseDLQ(subject); err == nil {
		l.Task = task
	}
	return l
}
