package console

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// Deps are what a console reads from.
type Deps struct {
	// Ledger is ledgerctl's reading and replaying of the ledger.
	Ledger Ledger
	Pool   *pgxpool.Pool
	NC     *nats.Conn
	JS     jetstream.JetStream
	// Subjects are the ledger's subjects under the chosen prefix.
	Subjects wire.Subjects
	// Logger receives what went wrong in detail (pages say only what
	// failed: error text can carry host and user names); default discards.
	Logger *slog.Logger
}

// snapshot is one computation of the shared live views.
type snapshot struct {
	// At is the database's clock when it was taken (the local clock when
	// the database did not answer).
	At         time.Time
	Partitions partitionsView
	Flow       flowView
}

// hub keeps the live state every page reads: a snapshot recomputed every
// PollInterval, the dead letters as LEDGER_DLQ receives them, and the
// projector's open gaps.
type hub struct {
	cfg  Config
	deps Deps
	// scraper reads Config.IngestMetrics.
	scraper *http.Client

	mu      sync.Mutex
	snap    *snapshot
	changed chan struct{} // closed when snap is replaced
	flow    flowState
	dlq     dlqState
	gaps    gapState
	parts   partState
	logged  map[string]loggedProblem
}

type loggedProblem struct {
	msg string
	at  time.Time
}

func newHub(cfg Config, deps Deps) *hub {
	return &hub{cfg: cfg, deps: deps, scraper: &http.Client{Timeout: scrapeTimeout},
		snap: &snapshot{At: time.Now()}, changed: make(chan struct{}),
		flow: newFlowState(), dlq: newDLQState(), gaps: gapState{open: map[string]gapMarker{}},
		parts: partState{last: map[int]lastCommit{}, looked: map[int]bool{}}, logged: map[string]loggedProblem{}}
}

// run keeps the state current until ctx ends; it returns once every
// goroutine it started has.
func (h *hub) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { h.followDLQ(ctx) })
	wg.Go(func() { h.followGaps(ctx) })
	wg.Go(func() {
		t := time.NewTicker(h.cfg.PollInterval)
		defer t.Stop()
		for {
			h.tick(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Wait()
}

// current returns the latest snapshot and a channel closed when a newer
// one is taken.
func (h *hub) current() (*snapshot, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snap, h.changed
}

// tick takes a new snapshot.
func (h *hub) tick(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(h.cfg.PollInterval*3, 5*time.Second))
	defer cancel()
	var problems problems
	now, head := h.head(ctx, &problems)
	parts := h.partitions(ctx, now, head, &problems)
	flow := h.flowView(ctx, now, head, &problems)
	parts.Problems, flow.Problems = problems.partitions, problems.flow
	h.mu.Lock()
	h.snap = &snapshot{At: now, Partitions: parts, Flow: flow}
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

// problems collects what a view could not show, in words for the page.
type problems struct {
	partitions, flow []string
}

// problem logs err in detail (once a minute per source and message) and
// returns what a page says about it: what failed, without the error text.
func (h *hub) problem(source, page string, err error) string {
	h.mu.Lock()
	last, ok := h.logged[source]
	log := !ok || last.msg != err.Error() || time.Since(last.at) > time.Minute
	if log {
		h.logged[source] = loggedProblem{msg: err.Error(), at: time.Now()}
	}
	h.mu.Unlock()
	if log && h.deps.Logger != nil {
		h.deps.Logger.Warn("console: "+source, slog.String("error", err.Error()))
	}
	return page
}

// head reads the database's clock and its newest committed position.
func (h *hub) head(ctx context.Context, p *problems) (time.Time, int64) {
	var head int64
	var now time.Time
	if err := h.deps.Pool.QueryRow(ctx, sqlHead).Scan(&head, &now); err != nil {
		msg := h.problem("read the head of ledger.events", "PostgreSQL did not answer (the console's log says why)", err)
		p.partitions = append(p.partitions, msg)
		p.flow = append(p.flow, msg)
		return time.Now(), -1
	}
	return now, head
}
