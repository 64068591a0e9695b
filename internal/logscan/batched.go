// Package logscan reads LEDGER_LOG's log batches (docs/contract.md §4, "Log
// batches") for the processes that ask what the log holds of a task: the
// ingest's tail check and `ledgerctl verify`. A task's copies in batches
// are not under its own subject, so a get of the subject's last message
// does not see them.
package logscan

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// storeLag is how much earlier than the window's start the read begins: a
// copy is stored after its commit, and the window is of commits.
const storeLag = time.Minute

// BatchedVersions is, per task, the newest version in the log batches that
// the stream s stored within since of now (and a minute more). Each
// message is waited for at most wait. A batch that does not read is passed
// over: its events count as missing, which a caller publishes again.
func BatchedVersions(ctx context.Context, s jetstream.Stream, subj wire.Subjects, since, wait time.Duration) (map[string]int64, error) {
	out := map[string]int64{}
	start := time.Now().Add(-since - storeLag)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj.LogBatches()},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &start})
	if err != nil {
		return nil, fmt.Errorf("read the log batches: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the log batches: %w", err)
	}
	if info.NumPending == 0 {
		return out, nil
	}
	// One pull brings many batches, where Next would ask for each.
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("read the log batches: %w", err)
	}
	defer it.Stop()
	for left := info.NumPending; left > 0; left-- {
		mctx, cancel := context.WithTimeout(ctx, wait)
		m, err := it.Next(jetstream.NextContext(mctx))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read the log batches: %w", err)
		}
		copies, err := subj.DecodeLogBatch(m.Subject(), m.Headers(), m.Data())
		if err != nil {
			continue
		}
		for _, c := range copies {
			out[c.Task] = max(out[c.Task], c.Version)
		}
	}
	return out, nil
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
