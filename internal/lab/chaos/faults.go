package chaos

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"
)

// faultWarmup keeps the first fault out of the run's first seconds, while
// the writers take their first leases.
const faultWarmup = 2 * time.Second

// startFaults starts one goroutine per kind of fault (Faults) that applies
// to the run and is not Off.
func (r *run) startFaults(ctx context.Context, wg *sync.WaitGroup) {
	for _, k := range Faults {
		if !k.applies(r) {
			continue
		}
		r.mu.Lock()
		r.faults[k.Name] += 0 // listed in the summary even if it never fires
		r.mu.Unlock()
		every := *k.every(&r.o)
		if every <= 0 {
			continue
		}
		// The first one comes within the run's first 60%, so every enabled
		// fault happens at least once.
		first := max(faultWarmup, time.Duration(float64(min(every, r.o.Duration))*r.uniform(0.3, 0.6)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now().Add(first)
			for {
				if !sleep(ctx, time.Until(next)) {
					return
				}
				k.inject(r, ctx)
				r.mu.Lock()
				r.faults[k.Name]++
				r.mu.Unlock()
				next = time.Now().Add(time.Duration(float64(every) * r.uniform(0.75, 1.25)))
			}
		}()
	}
}

// faultCounts lists the faults injected in the summary's order.
func (r *run) faultCounts() []FaultCount {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []FaultCount
	for _, k := range Faults {
		if n, ok := r.faults[k.Name]; ok {
			out = append(out, FaultCount{Kind: k.Name, Count: n})
		}
	}
	return out
}

// pause sleeps d, or less if ctx ends; the fault then restores at once.
func pause(ctx context.Context, d time.Duration) { sleep(ctx, d) }

// sigstop stops a writer, preferably the holder of a random partition (a
// stopped standby changes nothing), for 1.25 to 2 TTLs, and wakes it up.
// Its lease expires at most a TTL after it stopped and the standby takes
// over at once; the pause is kept short of much more, so the woken zombie
// finds tasks the new holder has not written yet, whose next version only
// the fence can refuse it.
func (r *run) sigstop(ctx context.Context) {
	p := r.first + r.pick(r.o.Partitions)
	victim, why := r.writers[r.pick(len(r.writers))], "a random writer"
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	var holder string
	if err := r.pool.QueryRow(qctx, sqlHolder, p).Scan(&holder); err == nil && r.holderOf[holder] != nil {
		victim, why = r.holderOf[holder], fmt.Sprintf("holder of partition %d", p)
	}
	cancel()
	d := time.Duration(float64(r.o.TTL) * r.uniform(1.25, 2))
	if err := victim.signal(syscall.SIGSTOP); err != nil {
		r.logf("sigstop %s: %v", victim.name, err)
		return
	}
	r.logf("sigstop %s (%s) for %v", victim.name, why, d.Round(time.Millisecond))
	pause(ctx, d)
	if err := victim.signal(syscall.SIGCONT); err != nil {
		r.logf("sigcont %s: %v", victim.name, err)
		return
	}
	r.logf("sigcont %s", victim.name)
}

// killIngest kills a random ingest with SIGKILL and starts it again.
func (r *run) killIngest(ctx context.Context) {
	p := r.ingests[r.pick(len(r.ingests))]
	r.killAndRestart(ctx, p, time.Duration(float64(time.Second)*r.uniform(0.5, 2)))
}

// restartNATS kills the NATS server with SIGKILL and starts it again on the
// same port and store.
func (r *run) restartNATS(ctx context.Context) {
	r.killAndRestart(ctx, r.nodes[0], time.Second)
}

// killNATSNode kills a random cluster node with SIGKILL and starts it again
// 2 to 5 s later.
func (r *run) killNATSNode(ctx context.Context) {
	n := r.nodes[r.pick(len(r.nodes))]
	r.killAndRestart(ctx, n, time.Duration(float64(time.Second)*r.uniform(2, 5)))
}

// killAndRestart kills p with SIGKILL and starts it again down later (or
// sooner if ctx ends).
func (r *run) killAndRestart(ctx context.Context, p *proc, down time.Duration) {
	p.kill()
	r.logf("kill -9 %s; restart in %v", p.name, down.Round(time.Millisecond))
	pause(ctx, down)
	if err := p.start(); err != nil {
		r.logf("restart %s: %v", p.name, err)
		return
	}
	r.logf("%s started", p.name)
}

// restartPG stops PostgreSQL in immediate mode (no checkpoint, connections
// cut, as in a crash) and starts it again; it recovers from the WAL.
func (r *run) restartPG(context.Context) {
	t := time.Now()
	r.logf("PostgreSQL immediate restart")
	// The restart is finished even when the run ends meanwhile: the
	// services must find the database again.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := r.pg.Restart(ctx); err != nil {
		r.logf("PostgreSQL restart failed: %v", err)
		return
	}
	r.logf("PostgreSQL back after %v", time.Since(t).Round(time.Millisecond))
}

// cutPG cuts the network between a random ingest and PostgreSQL for 1 to
// 3 s: its connections are dropped mid-statement, new ones refused, while
// PostgreSQL and the other ingest go on. Whatever the ingest had in flight
// must be retried, never turned into a verdict, and nothing it committed
// lost.
func (r *run) cutPG(ctx context.Context) {
	i := r.pick(len(r.pgProxies))
	down := time.Duration(float64(time.Second) * r.uniform(1, 3))
	r.pgProxies[i].Cut()
	r.logf("network cut between %s and PostgreSQL for %v", r.ingests[i].name, down.Round(time.Millisecond))
	pause(ctx, down)
	r.pgProxies[i].Restore()
	r.logf("network between %s and PostgreSQL restored", r.ingests[i].name)
}
