package console_test

import (
	"bufio"
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/wire"
)

// sseEvents reads a live view's stream and hands each fragment to fn until
// fn returns true or the deadline passes.
func sseEvents(t *testing.T, u string, fn func(fragment string) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4<<20)
	var event string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		case line == "" && event != "":
			if event == "fragment" && fn(strings.Join(data, "\n")) {
				return
			}
			event, data = "", nil
		}
	}
	t.Fatalf("the stream %s ended before the view showed what was expected: %v", u, sc.Err())
}

// The partitions stream pushes a new fragment when a lease changes hands,
// with no request from the page.
func TestPartitionsStreamPushesATakeover(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.acquire(2, "worker-a.1")
	base := l.console()
	step := 0
	sseEvents(t, base+"/live/partitions", func(f string) bool {
		tile := regexp.MustCompile(`(?s)id="partition-2".*?</section>`).FindString(f)
		switch {
		case step == 0 && strings.Contains(tile, "worker-a.1"):
			step = 1
			ledgertest.ExpireLease(t, l.db.Pool, 2)
			l.acquire(2, "worker-b.1")
		case step == 1 && strings.Contains(tile, "worker-b.1"):
			assert.Contains(t, tile, "takeover", "the tile is lit")
			assert.Contains(t, tile, "generation <b>2</b>")
			assert.Contains(t, tile, "<b>1</b> takeover in the last hour")
			return true
		}
		return false
	})
}

// chartTotal reads one verdict's count over the window from the flow view;
// -1 before the console's first snapshot.
func chartTotal(t *testing.T, base, verdict string) int {
	t.Helper()
	_, _, body := get(t, base+"/frag/flow")
	m := regexp.MustCompile(`(?s)id="chart-` + verdict + `".*?<b class="total">(\d+)</b>`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// The flow counts what the ledger did: commits from ledger.events, stale
// letters from LEDGER_DLQ, and duplicates from the ingest's metrics.
func TestFlowCountsCommitsRejectionsAndDuplicates(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	base := l.console("-ingest-metrics", l.metricsURL)
	a := l.acquire(4, "worker-a.1")
	for v := int64(1); v <= 5; v++ {
		l.publish(event{partition: 4, task: "report-9", holder: "worker-a.1", generation: a.Generation, version: v,
			typ: "running", payload: `{"v":` + strconv.FormatInt(v, 10) + `}`})
	}
	l.waitCommitted("report-9", 5)
	// The same content under another event id: duplicate/same_content.
	l.publish(event{partition: 4, task: "report-9", holder: "worker-a.1", generation: a.Generation, version: 5,
		typ: "running", payload: `{"v":5}`})
	l.staleLetter("report-10", `{}`)

	require.Eventually(t, func() bool {
		return chartTotal(t, base, "committed") == 6 && chartTotal(t, base, "stale") == 1 && chartTotal(t, base, "duplicate") == 1
	}, 20*time.Second, 100*time.Millisecond, "the flow never showed 6 commits, 1 stale and 1 duplicate:\n%s",
		func() string { _, _, b := get(t, base+"/frag/flow"); return b }())
	assert.Zero(t, chartTotal(t, base, "conflict"))
	_, _, body := get(t, base+"/frag/flow")
	assert.Contains(t, body, "superseded")
	assert.Contains(t, body, "same_content")
}

// Sequences are drawn at insert and transactions commit out of order: a
// commit that becomes visible after a later sequence was seen is counted
// all the same.
func TestFlowCountsACommitThatLandsBehindTheHead(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	base := l.console()
	ctx := context.Background()
	insert := `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
VALUES ($1, 0, $2, 1, 'started', '{}', 'worker-a.1', 1, clock_timestamp())`
	slow, err := l.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer slow.Rollback(ctx) //nolint:errcheck
	_, err = slow.Exec(ctx, insert, ledgertest.NewID(), "early-seq")
	require.NoError(t, err)
	_, err = l.db.Pool.Exec(ctx, insert, ledgertest.NewID(), "late-seq")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return chartTotal(t, base, "committed") == 1 }, 20*time.Second, 50*time.Millisecond)
	time.Sleep(600 * time.Millisecond) // a few snapshots see the later sequence as the head
	require.NoError(t, slow.Commit(ctx))
	require.Eventually(t, func() bool { return chartTotal(t, base, "committed") == 2 }, 20*time.Second, 50*time.Millisecond,
		"the commit of the earlier sequence was never counted")
}

// The flow view tells how far the projector is behind LEDGER_LOG and how
// long its oldest open gap has waited.
func TestFlowShowsProjectorLagAndOldestGap(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	base := l.console()
	l.projector.Stop()
	a := l.acquire(6, "worker-a.1")
	for v := int64(1); v <= 3; v++ {
		l.publish(event{partition: 6, task: "report-11", holder: "worker-a.1", generation: a.Generation, version: v, typ: "running", payload: `{}`})
	}
	l.waitStream(wire.StreamLog, 3)
	eventually(t, base+"/frag/flow", `<td class="behind">3</td>`)

	kv, err := l.js.KeyValue(context.Background(), wire.BucketProjector)
	require.NoError(t, err)
	_, err = kv.Put(context.Background(), "projector.report-12", []byte(wire.FormatTime(time.Now().Add(-90*time.Second))))
	require.NoError(t, err)
	_, err = kv.Put(context.Background(), "projector.report-13", []byte(wire.FormatTime(time.Now().Add(-5*time.Second))))
	require.NoError(t, err)
	body := eventually(t, base+"/frag/flow", `<b class="open-gaps">2</b>`)
	assert.Contains(t, body, `task <a href="/task/report-12">report-12</a>`)
	assert.Regexp(t, `has waited <b class="oldest-gap">1m3\ds</b>`, body)

	require.NoError(t, kv.Delete(context.Background(), "projector.report-12"))
	eventually(t, base+"/frag/flow", `<b class="open-gaps">1</b>`)
}
