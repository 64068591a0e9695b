package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// recentTakeover is how long a partition's tile shows its last takeover as
// news.
const recentTakeover = time.Minute

// recentTakeoversShown is how many takeovers the partitions view lists.
const recentTakeoversShown = 20

// tile is one partition on the partitions view.
type tile struct {
	Partition  int
	Leased     bool
	Holder     string
	Generation int64
	Valid      bool
	TimeLeftMS int64
	TTLMS      int64
	// Takeovers counts the grants of generation 2 and above in the last
	// hour; LastTakeoverMS is how long ago the newest was (-1: none).
	Takeovers      int64
	LastTakeoverMS int64
	// Recent is set when the last takeover is younger than recentTakeover.
	Recent bool
	Commit *lastCommit
	// Cordon is the partition's cordon, nil when it is not cordoned.
	Cordon *operatorAction
	// Mode is the partition's effective fence mode: enforce or observe.
	Mode string
}

// lastCommit is a partition's newest committed event.
type lastCommit struct {
	Seq     int64
	Task    string
	Version int64
	At      time.Time
	// AgoMS is its age at the snapshot.
	AgoMS int64
}

// takeover is one grant that replaced an earlier lease.
type takeover struct {
	Partition  int
	Generation int64
	Holder     string
	From       string
	// AgoMS is how long ago it was granted, by the database's clock.
	AgoMS int64
}

type partitionsView struct {
	Tiles     []tile
	Takeovers []takeover
	// Actions are the newest operator actions (revoke, cordon, uncordon).
	Actions []operatorAction
	// Count is the deployment's partition count, 0 when unknown (no ingest
	// answered ledger.lease.get).
	Count    int
	Problems []string
}

// partState is what the partitions view remembers between snapshots.
type partState struct {
	// count is the partition count; asked again after countRetry when
	// unknown.
	count   int
	countAt time.Time
	// last is each partition's newest commit seen; looked the partitions
	// whose last commit was looked up in LEDGER_LOG once.
	last   map[int]lastCommit
	looked map[int]bool
	// seen is the head up to which last is current.
	seen int64
}

// countRetry is how often the partition count is asked for while unknown.
const countRetry = 30 * time.Second

func (h *hub) partitions(ctx context.Context, now time.Time, head int64, p *problems) partitionsView {
	var v partitionsView
	leases, err := h.deps.Ledger.Leases(ctx)
	if err != nil {
		p.partitions = append(p.partitions, h.problem("list leases", "the leases could not be read (the console's log says why)", err))
	}
	takeovers, counts, err := h.takeovers(ctx)
	if err != nil {
		p.partitions = append(p.partitions, h.problem("read lease grants", "the lease grants could not be read (the console's log says why)", err))
	}
	v.Takeovers = takeovers
	v.Count = h.partitionCount(ctx)
	actions, cordons, err := h.operatorActions(ctx)
	if err != nil {
		p.partitions = append(p.partitions, h.problem("read operator actions", "the operators' actions could not be read (the console's log says why)", err))
	}
	v.Actions = actions
	observed, err := h.observed(ctx)
	if err != nil {
		p.partitions = append(p.partitions, h.problem("read fence modes", "the fence modes could not be read (the console's log says why)", err))
	}

	commits := h.lastCommits(ctx, now, head, leases, p)
	// A tile for every partition of the deployment, and for any other that
	// was leased or committed to.
	shown := map[int]bool{}
	for n := range v.Count {
		shown[n] = true
	}
	for _, l := range leases {
		shown[l.Partition] = true
	}
	for n := range counts {
		shown[n] = true
	}
	for n := range commits {
		shown[n] = true
	}
	for n := range cordons {
		shown[n] = true
	}
	for n := range observed {
		shown[n] = true
	}
	for _, n := range slices.Sorted(maps.Keys(shown)) {
		v.Tiles = append(v.Tiles, tile{Partition: n, LastTakeoverMS: -1})
	}
	byPartition := make(map[int]*tile, len(v.Tiles))
	for i := range v.Tiles {
		byPartition[v.Tiles[i].Partition] = &v.Tiles[i]
	}
	for _, l := range leases {
		t := byPartition[l.Partition]
		t.Leased, t.Holder, t.Generation, t.Valid, t.TimeLeftMS, t.TTLMS = true, l.Holder, l.Generation, l.Valid, l.TimeLeftMS, l.TTLMS
	}
	for n, c := range counts {
		t := byPartition[n]
		t.Takeovers, t.LastTakeoverMS = c.n, c.agoMS
		t.Recent = c.agoMS < recentTakeover.Milliseconds()
	}
	for n, c := range commits {
		c.AgoMS = max(now.Sub(c.At).Milliseconds(), 0)
		byPartition[n].Commit = &c
	}
	for n, c := range cordons {
		byPartition[n].Cordon = &c
	}
	for i := range v.Tiles {
		v.Tiles[i].Mode = "enforce"
		if observed[v.Tiles[i].Partition] {
			v.Tiles[i].Mode = "observe"
		}
	}
	return v
}

type takeoverCount struct{ n, agoMS int64 }

func (h *hub) takeovers(ctx context.Context) ([]takeover, map[int]takeoverCount, error) {
	rows, err := h.deps.Pool.Query(ctx, sqlRecentTakeovers, recentTakeoversShown)
	if err != nil {
		return nil, nil, fmt.Errorf("list recent takeovers: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (takeover, error) {
		var t takeover
		err := r.Scan(&t.Partition, &t.Generation, &t.Holder, &t.From, &t.AgoMS)
		return t, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list recent takeovers: %w", err)
	}
	rows, err = h.deps.Pool.Query(ctx, sqlTakeovers)
	if err != nil {
		return nil, nil, fmt.Errorf("count takeovers: %w", err)
	}
	counts := map[int]takeoverCount{}
	var n int
	var c takeoverCount
	_, err = pgx.ForEachRow(rows, []any{&n, &c.n, &c.agoMS}, func() error {
		counts[n] = c
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("count takeovers: %w", err)
	}
	return list, counts, nil
}

// lastCommits keeps each partition's newest commit: from the events
// committed since the last snapshot (re-read over a margin, as sequences
// commit out of order), and for a partition not seen yet from its newest
// copy in LEDGER_LOG, once.
func (h *hub) lastCommits(ctx context.Context, now time.Time, head int64, leases []Lease, p *problems) map[int]lastCommit {
	h.mu.Lock()
	// The first snapshot reads at most the newest bootstrapRows events;
	// partitions idle since are looked up in LEDGER_LOG below.
	from := h.flow.floor(now.Add(-recount), max(h.parts.seen, head))
	h.mu.Unlock()
	if head >= 0 {
		rows, err := h.deps.Pool.Query(ctx, sqlLastCommits, from)
		var found []struct {
			p int
			c lastCommit
		}
		if err == nil {
			var n int
			var c lastCommit
			_, err = pgx.ForEachRow(rows, []any{&n, &c.Seq, &c.Task, &c.Version, &c.At}, func() error {
				found = append(found, struct {
					p int
					c lastCommit
				}{n, c})
				return nil
			})
		}
		if err != nil {
			p.partitions = append(p.partitions, h.problem("read the last commits", "the last commits could not be read (the console's log says why)", err))
		} else {
			h.mu.Lock()
			for _, f := range found {
				if old, ok := h.parts.last[f.p]; !ok || f.c.Seq > old.Seq {
					h.parts.last[f.p] = f.c
				}
			}
			h.parts.seen = max(h.parts.seen, head)
			h.mu.Unlock()
		}
	}
	for _, l := range leases {
		h.lookUpLastCommit(ctx, l.Partition)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[int]lastCommit, len(h.parts.last))
	for n, c := range h.parts.last {
		out[n] = c
	}
	return out
}

// lookUpLastCommit reads a partition's newest copy in LEDGER_LOG, once, so
// that a partition idle since before the console started shows its last
// commit too.
func (h *hub) lookUpLastCommit(ctx context.Context, partition int) {
	h.mu.Lock()
	done := h.parts.looked[partition]
	h.mu.Unlock()
	if done {
		return
	}
	s, err := h.deps.JS.Stream(ctx, wire.StreamLog)
	if err != nil {
		return // the flow view says when the log is missing
	}
	m, err := s.GetLastMsgForSubject(ctx, h.deps.Subjects.LogPartition(partition))
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.parts.looked[partition] = true
	if m == nil {
		return
	}
	copies, err := h.deps.Subjects.DecodeLogCopies(m.Subject, m.Header, m.Data)
	if err != nil {
		return
	}
	c := copies[len(copies)-1] // a log batch's newest
	if old, ok := h.parts.last[partition]; !ok || c.Seq > old.Seq {
		h.parts.last[partition] = lastCommit{Seq: c.Seq, Task: c.Task, Version: c.Version, At: c.CommittedAt}
	}
}

// partitionCount asks the lease service for the deployment's partition
// count (ledger.lease.get tells it even for a partition never leased).
func (h *hub) partitionCount(ctx context.Context) int {
	h.mu.Lock()
	n, at := h.parts.count, h.parts.countAt
	h.mu.Unlock()
	if n > 0 || (!at.IsZero() && time.Since(at) < countRetry) {
		return n
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	reply, err := h.deps.NC.RequestWithContext(rctx, h.deps.Subjects.LeaseGet(), []byte(`{"partition":0}`))
	if err == nil {
		n = partitionCountOf(reply.Data)
	}
	h.mu.Lock()
	h.parts.count, h.parts.countAt = n, time.Now()
	h.mu.Unlock()
	return n
}

// maxPartitionsShown bounds the tiles drawn for a partition count read
// from a reply: a wrong answer must not make a page of a million tiles.
const maxPartitionsShown = 4096

// partitionCountOf reads "partitions" from a lease.get reply (a lease or a
// no_lease error); 0 when absent or unusable.
func partitionCountOf(reply []byte) int {
	var r struct {
		Partitions int `json:"partitions"`
	}
	if json.Unmarshal(reply, &r) != nil || r.Partitions < 1 || r.Partitions > maxPartitionsShown {
		return 0
	}
	return r.Partitions
}
