// Package logscan reads LEDGER_LOG for the processes that ask what the log
// holds of a task: the ingest's memory and tail checks and `ledgerctl
// verify`. It reads with batched direct gets, which the ingest's NATS
// permissions allow where a consumer on LEDGER_LOG is not. A task's copies
// in log batches (docs/contract.md §4, "Log batches") are not under its
// own subject, so a get of the subject's last message does not see them.
package logscan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// DirectGet sends LEDGER_LOG one batched direct get (req: its fields),
// hands each message of the answer to each, and returns the sequence after
// the last one and whether any came (the server ends a batch at its size
// or max_bytes: 204, or at once with 404 when nothing matches). what
// names the read in its errors. It waits for the answer until ctx ends.
func DirectGet(ctx context.Context, nc *nats.Conn, req map[string]any, what string, each func(*nats.Msg)) (uint64, bool, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(req)
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+wire.StreamLog, inbox, body); err != nil {
		return 0, false, fmt.Errorf("%s: %w", what, err)
	}
	var next uint64
	got := false
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %w", what, err)
		}
		if status := m.Header.Get("Status"); status != "" {
			if status == "204" || status == "404" {
				return next, got, nil // the end of the batch; 404: nothing there
			}
			return 0, false, fmt.Errorf("%s: status %s %s", what, status, m.Header.Get("Description"))
		}
		at, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			continue
		}
		next, got = at+1, true
		each(m)
	}
}

// storeLag is how much earlier than the window's start the read begins: a
// copy is stored after its commit, and the window is of commits.
const storeLag = time.Minute

// BatchedVersions is, per task, the newest version in the log batches
// LEDGER_LOG stored within since of now (and a minute more). Each direct
// get waits at most wait. A batch that does not read is passed over: its
// events count as missing, which a caller publishes again.
func BatchedVersions(ctx context.Context, nc *nats.Conn, subj wire.Subjects, since, wait time.Duration) (map[string]int64, error) {
	out := map[string]int64{}
	filter := subj.LogBatches()
	req := map[string]any{"start_time": time.Now().Add(-since - storeLag).UTC(), "batch": 1000,
		"next_by_subj": filter, "max_bytes": 4 << 20}
	for {
		gctx, cancel := context.WithTimeout(ctx, wait)
		next, got, err := DirectGet(gctx, nc, req, "read LEDGER_LOG's recent log batches", func(m *nats.Msg) {
			copies, err := subj.DecodeLogBatch(m.Header.Get(jetstream.SubjectHeader), m.Header, m.Data)
			if err != nil {
				return
			}
			for _, c := range copies {
				out[c.Task] = max(out[c.Task], c.Version)
			}
		})
		cancel()
		if err != nil {
			return nil, err
		}
		if !got {
			return out, nil
		}
		req = map[string]any{"seq": next, "batch": 1000, "next_by_subj": filter, "max_bytes": 4 << 20}
	}
}

// LastCopied is the version of a task's last per-event copy in the stream
// s (under the task's own subject); 0 if it has none, or if that copy
// does not read (then its versions count as missing, and the ones a
// caller publishes again that the stream holds are deduplicated).
func LastCopied(ctx context.Context, s jetstream.Stream, subj wire.Subjects, partition int, task string) (int64, error) {
	m, err := s.GetLastMsgForSubject(ctx, subj.Log(partition, task))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("last log copy of task %s: %w", task, err)
	}
	c, err := subj.DecodeLog(m.Subject, m.Header, m.Data)
	if err != nil {
		return 0, nil
	}
	return c.Version, nil
}
