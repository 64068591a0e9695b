package console_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// A partition's last commit, read from LEDGER_LOG when PostgreSQL's newer
// rows do not name it, is the newest event of a log batch too.
func TestPartitionsShowTheLastCommitOfALogBatch(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.acquire(2, "worker-a.1")
	var copies []wire.LogCopy
	for i, task := range []string{"older", "newest"} {
		copies = append(copies, wire.LogCopy{Seq: int64(1000 + i), EventID: "01JD000000000000000000000" + string(rune('0'+i)),
			Partition: 2, Task: task, Version: 4, Type: "step", Holder: "worker-a.1", Generation: 1, CommittedAt: time.Now()})
	}
	msgs, err := wire.Subjects{}.LogBatchMsgs(copies, 1<<20)
	require.NoError(t, err)
	_, err = l.js.PublishMsg(context.Background(), msgs[0])
	require.NoError(t, err)

	base := l.console()
	require.Eventually(t, func() bool {
		_, _, body := get(t, base+"/frag/partitions")
		tile := regexp.MustCompile(`(?s)id="partition-2".*?</section>`).FindString(body)
		return strings.Contains(tile, `last commit <a href="/task/newest">newest</a> v4, seq 1001`)
	}, 10*time.Second, 50*time.Millisecond)
}
