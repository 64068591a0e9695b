package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowness/ledger/internal/pgtemp"
)

// The PostgreSQL failover fault (Options.Replication). The ledger's
// database is a primary and a streaming standby (pg_basebackup, a
// replication slot) on 127.0.0.1, and the services reach them through one
// multi-host URL with target_session_attrs=read-write, as behind a
// failover manager. The fault kills every process of the primary with
// SIGKILL and promotes the standby with pg_ctl promote; the services find
// the new primary by themselves. A new standby is then made of the new
// primary on the old one's port, for the next failover.
//
// The promotion is made by hand, not by an HA manager (Patroni,
// pg_auto_failover): a manager promotes only after its own failure
// detection (tens of seconds by default), refuses to promote a standby
// that lags, and rewinds an old primary before it rejoins, so it would
// neither fit a CI run nor let the run inject the two faults the ledger
// must survive without one: a promoted standby that lost a tail, and an
// old primary that comes back writable.

// Modes of Options.Replication.
const (
	// ReplicationSync: synchronous_standby_names names the standby and
	// synchronous_commit is on; a commit returns once the standby has it.
	ReplicationSync = "sync"
	// ReplicationAsync: the standby streams, but no commit waits for it.
	// Before each failover the standby is frozen (it stops streaming) while
	// the primary commits on, and a holder is paused past its TTL, so that
	// the promoted standby lacks acknowledged commits and a grant.
	ReplicationAsync = "async"
)

// Defaults of the failover fault.
const (
	// PGFailoverEveryDefault is the mean time between two failovers: 30 s.
	PGFailoverEveryDefault = 30 * time.Second
	// splitBrainFor is how long an old primary stays up, writable, after
	// a failover with Options.SplitBrain.
	splitBrainFor = 5 * time.Second
	// RestoreWaitDefault is Options.RestoreWait's default.
	RestoreWaitDefault = time.Minute
	// restoreRetry is the pause before a failed restore is run again.
	restoreRetry = 2 * time.Second
	// resumeWait bounds the wait for the first commit after a promotion.
	resumeWait = 60 * time.Second
)

// PGFailover is what one failover did.
type PGFailover struct {
	// LagBytes is how far the standby's received WAL was behind the
	// primary's when the primary was killed (async).
	LagBytes int64
	// Forgotten is the number of commits LEDGER_LOG held beyond the
	// promoted standby, and Restored how many of them "ledgerctl restore"
	// wrote back (async).
	Forgotten, Restored int
	// Noticed is how long after the promotion an ingest's /readyz failed
	// its "memory" check, and RestoreDone when "ledgerctl restore" had
	// finished (async); 0 if not.
	Noticed, RestoreDone time.Duration
	// Judged is how long after the promotion (async: after the restore)
	// the ingests wrote their first verdict, a commit or a rejection;
	// Resumed how long after the promotion the first new event committed.
	// 0 if none within a minute. After an asynchronous failover the
	// writers resumed from the forgetful database's heads: their first
	// sends are conflicts with the restored versions, so the first new
	// commit comes later than the first verdict.
	Judged, Resumed time.Duration
	// SupersededCommits and SupersededGrants count what the old primary,
	// started again writable (split brain), committed and granted.
	SupersededCommits, SupersededGrants int
	// Refusals counts the ingests' log lines, while the old primary was
	// back, that refused it as a superseded primary.
	Refusals int
	// Noise counts the ingests' warning and error lines, by message, from
	// the kill to the end of the fault: what an operator read.
	Noise map[string]int
}

// logMarks are the sizes of the ingests' logs at a moment.
type logMarks []int64

func (r *run) markLogs() logMarks {
	m := make(logMarks, len(r.ingests))
	for i, p := range r.ingests {
		if st, err := os.Stat(p.logPath); err == nil {
			m[i] = st.Size()
		}
	}
	return m
}

// logLinesSince calls line with each line the ingests logged since m.
func (r *run) logLinesSince(m logMarks, line func(string)) {
	for i, p := range r.ingests {
		f, err := os.Open(p.logPath)
		if err != nil {
			continue
		}
		if _, err := f.Seek(m[i], io.SeekStart); err == nil {
			b, _ := io.ReadAll(f)
			for _, l := range strings.Split(string(b), "\n") {
				line(l)
			}
		}
		f.Close()
	}
}

// noise counts the warning and error lines since m by message.
func (r *run) noise(m logMarks) map[string]int {
	out := map[string]int{}
	r.logLinesSince(m, func(l string) {
		var rec struct{ Level, Msg string }
		if json.Unmarshal([]byte(l), &rec) == nil && (rec.Level == "WARN" || rec.Level == "ERROR") {
			out[rec.Level+" "+rec.Msg]++
		}
	})
	return out
}

// startReplicated starts the primary and its standby, and sets r.dbURL to
// both. The downstream of the side effects gets a server of its own: it
// stands for another system, which a failover of the ledger's database
// does not touch.
func (r *run) startReplicated(ctx context.Context) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	pg, err := pgtemp.StartWith(ctx, pgtemp.Options{Durable: true, TCP: true, Port: ports[0]})
	if err != nil {
		return fmt.Errorf("chaos: start PostgreSQL: %w", err)
	}
	r.pg = pg
	if err := r.addStandby(ctx, ports[1]); err != nil {
		return err
	}
	r.dbURL = fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write",
		pg.HostPort(), r.standby.HostPort())
	r.logf("PostgreSQL: primary %s and %s standby %s; the services use %s", pg.HostPort(), r.o.Replication,
		r.standby.HostPort(), r.dbURL)
	if r.downPG, err = pgtemp.StartWith(ctx, pgtemp.Options{Durable: true, Port: ports[1] + 1}); err != nil {
		return fmt.Errorf("chaos: start the downstream's PostgreSQL: %w", err)
	}
	return nil
}

// addStandby makes a standby of r.pg on port and, with synchronous
// replication, makes r.pg wait for it.
func (r *run) addStandby(ctx context.Context, port int) error {
	r.standbys++
	name := fmt.Sprintf("standby%d", r.standbys)
	s, err := r.pg.StartStandby(ctx, pgtemp.Options{Durable: true, Port: port}, name)
	if err != nil {
		return fmt.Errorf("chaos: start a standby: %w", err)
	}
	r.mu.Lock()
	r.standby = s
	r.mu.Unlock()
	if r.o.Replication == ReplicationSync {
		if err := r.pg.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '%s'`, name),
			`SELECT pg_reload_conf()`); err != nil {
			return fmt.Errorf("chaos: make the standby synchronous: %w", err)
		}
	}
	// Streaming (and synchronous) before the next failover may come.
	want := "async"
	if r.o.Replication == ReplicationSync {
		want = "sync"
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int64
		if err := queryPG(ctx, r.pg, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`,
			[]any{name, want}, &n); err == nil && n == 1 {
			r.logf("standby %s streams from %s (%s)", s.HostPort(), r.pg.HostPort(), want)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("chaos: standby %s does not stream after 60s (see %s)", name, s.LogFile())
		}
	}
}

// queryPG reads one row from a server of the run, whatever its role.
func queryPG(ctx context.Context, c *pgtemp.Cluster, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// failoverPG is the fault: (async) freeze the standby behind, kill the
// primary, promote the standby, (async) restore what it forgot as an
// operator would, measure when commits resume, (split brain) start the old
// primary again, writable, and make a new standby.
func (r *run) failoverPG(ctx context.Context) {
	// The fault runs to its end even when the run ends meanwhile: the
	// services must find a primary again.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	old, next := r.pg, r.standby
	var f PGFailover
	var frozen time.Time
	if r.o.Replication == ReplicationAsync {
		frozen = time.Now()
		if err := r.freeze(ctx, next); err != nil {
			r.logf("freeze the standby: %v", err)
			return
		}
		// A takeover while the standby is frozen: the promoted standby
		// forgets its grant, and must not give its generation again.
		r.sigstop(ctx)
		pause(ctx, 500*time.Millisecond)
		var primaryLSN string
		if err := queryPG(ctx, old, `SELECT pg_current_wal_lsn()::text`, nil, &primaryLSN); err == nil {
			_ = queryPG(ctx, next, `SELECT pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_receive_lsn())::bigint`,
				[]any{primaryLSN}, &f.LagBytes)
		}
		r.logf("the standby is %d KiB behind the primary", f.LagBytes/1024)
	}
	marks := r.markLogs()
	if err := old.Kill(); err != nil {
		r.logf("kill the primary: %v", err)
		return
	}
	r.logf("kill -9 of every process of the primary %s", old.HostPort())
	if err := next.Promote(ctx); err != nil {
		r.logf("promote the standby: %v", err)
		return
	}
	promoted := time.Now()
	// A promoted standby may carry its primary's synchronous_standby_names
	// (a copy of its configuration): nothing would commit until a standby
	// of that name streams from it.
	if err := next.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = ''`, `SELECT pg_reload_conf()`); err != nil {
		r.logf("clear synchronous_standby_names on the new primary: %v", err)
	}
	r.mu.Lock()
	r.pg, r.standby = next, nil
	if !frozen.IsZero() {
		r.forgetful = append(r.forgetful, [2]int64{frozen.UnixNano(), promoted.UnixNano()})
	}
	r.mu.Unlock()
	r.logf("standby %s promoted: the new primary", next.HostPort())
	// The run's own pool: onto the new primary, and never back.
	var timeline int64
	if err := queryPG(ctx, next, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`,
		nil, &timeline); err == nil {
		r.guard.Raise(timeline)
	}
	r.pool.Reset()
	if r.o.Replication == ReplicationAsync {
		r.restoreForgotten(ctx, promoted, &f)
	}
	from, what := promoted, "the promote"
	if f.RestoreDone > 0 {
		from, what = promoted.Add(f.RestoreDone), "the restore"
	}
	f.Judged = r.waitFirst(ctx, sqlFirstVerdictAfter, from)
	f.Resumed = r.waitFirst(ctx, sqlFirstCommitAfterT, promoted)
	r.logf("the first verdict %v after %s, the first new commit %v after the promote (0s: none within %v)",
		f.Judged.Round(time.Millisecond), what, f.Resumed.Round(time.Millisecond), resumeWait)
	if r.o.SplitBrain {
		r.splitBrain(ctx, old, &f)
	}
	f.Noise = r.noise(marks)
	r.logf("the ingests logged, from the kill on: %s", noiseLine(f.Noise))
	r.keepLog(old)
	port := old.Port()
	old.Stop()
	r.pool.Reset()
	r.mu.Lock()
	r.failovers = append(r.failovers, f)
	r.mu.Unlock()
	if err := r.addStandby(ctx, port); err != nil {
		r.logf("%v", err)
	}
}

// freeze makes the standby stop streaming, and waits until it does.
func (r *run) freeze(ctx context.Context, s *pgtemp.Cluster) error {
	if err := s.StopStreaming(ctx); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int64
		if err := queryPG(ctx, s, `SELECT count(*) FROM pg_stat_wal_receiver`, nil, &n); err == nil && n == 0 {
			r.logf("standby %s frozen: it receives no more WAL", s.HostPort())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("standby %s still streams 10s after primary_conninfo was cleared", s.HostPort())
		}
	}
}

// restoreForgotten does what docs/operations.md tells an operator to do
// after an asynchronous failover: wait for an ingest's /readyz to fail its
// "memory" check, then run "ledgerctl restore".
func (r *run) restoreForgotten(ctx context.Context, promoted time.Time, f *PGFailover) {
	client := &http.Client{Timeout: time.Second}
	var said string
	for deadline := promoted.Add(r.o.RestoreWait); said == "" && time.Now().Before(deadline); {
		for i, port := range r.ingestPorts {
			resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"memory"`) {
				said = fmt.Sprintf("%s /readyz: %s", r.ingests[i].name, strings.TrimSpace(string(b)))
				break
			}
		}
		sleep(ctx, 50*time.Millisecond)
	}
	if said == "" {
		r.logf("no ingest reported, within %v of the promote, that the database forgot commits; no restore", r.o.RestoreWait)
		return
	}
	f.Noticed = time.Since(promoted)
	r.logf("%v after the promote, %s", f.Noticed.Round(time.Millisecond), said)
	// A restore that fails (NATS or the database restarting under it) is
	// run again, as an operator would, until it works or the run ends.
	var out []byte
	for try := 1; ; try++ {
		var err error
		out, err = exec.CommandContext(ctx, r.bin.ledgerctl, "restore", "-json", "-database-url", r.dbURL,
			"-nats-url", r.natsURL, "-prefix", r.prefix).CombinedOutput()
		_ = os.WriteFile(filepath.Join(r.dir, "procs", fmt.Sprintf("restore-%d.log", len(r.failovers)+1)), out, 0o644)
		if err == nil {
			break
		}
		r.logf("ledgerctl restore (try %d): %v: %s", try, err, out)
		if !sleep(ctx, restoreRetry) {
			return
		}
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f.Forgotten++
		if strings.Contains(line, `"outcome":"restored"`) {
			f.Restored++
		}
	}
	f.RestoreDone = time.Since(promoted)
	r.logf("ledgerctl restore: %d of %d forgotten commits restored from LEDGER_LOG", f.Restored, f.Forgotten)
}

// The first commit after $1 that the database took itself (a restored row
// keeps its commit time), and the first verdict, commit or rejection.
const (
	sqlFirstCommitAfterT = `SELECT min(committed_at) FROM ledger.events WHERE committed_at > $1`
	sqlFirstVerdictAfter = `SELECT least((SELECT min(committed_at) FROM ledger.events WHERE committed_at > $1),
             (SELECT min(rejected_at) FROM ledger.rejections WHERE rejected_at > $1))`
)

// waitFirst is how long after since the time sql reads is; 0 if it reads
// none within resumeWait.
func (r *run) waitFirst(ctx context.Context, sql string, since time.Time) time.Duration {
	for deadline := since.Add(resumeWait); time.Now().Before(deadline); sleep(ctx, 20*time.Millisecond) {
		var at *time.Time
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := r.pool.QueryRow(qctx, sql, since).Scan(&at)
		cancel()
		if err == nil && at != nil {
			return at.Sub(since)
		}
	}
	return 0
}

// splitBrain starts the old primary again, writable and on its old
// timeline, while the services' connections to the new primary are cut
// and an ingest restarts, so that each connects anew and tries the old
// primary first (first in the URL at the run's first failover). Then it
// reads what the old primary committed and granted meanwhile.
func (r *run) splitBrain(ctx context.Context, old *pgtemp.Cluster, f *PGFailover) {
	if err := old.StartAgain(ctx, "synchronous_standby_names=''"); err != nil {
		r.logf("split brain: %v", err)
		return
	}
	r.logf("split brain: the old primary %s is back, writable, on its old timeline", old.HostPort())
	marks := r.markLogs()
	if err := r.pg.Exec(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name <> 'ledger-chaos'`); err != nil {
		r.logf("split brain: cut the connections to the new primary: %v", err)
	} else {
		r.logf("split brain: every service connection to the new primary cut")
	}
	r.killAndRestart(ctx, r.ingests[r.pick(len(r.ingests))], 500*time.Millisecond)
	pause(ctx, splitBrainFor)
	r.logLinesSince(marks, func(l string) {
		if strings.Contains(l, "superseded primary") {
			f.Refusals++
		}
	})
	h := &History{}
	conn, err := pgx.Connect(ctx, old.URL())
	if err != nil {
		r.logf("split brain: read the old primary: %v", err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := readSuperseded(ctx, conn, h); err != nil {
		r.logf("split brain: read the old primary: %v", err)
		return
	}
	f.SupersededCommits, f.SupersededGrants = len(h.SupersededEvents), len(h.SupersededGrants)
	r.mu.Lock()
	r.superseded.SupersededEvents = append(r.superseded.SupersededEvents, h.SupersededEvents...)
	r.superseded.SupersededGrants = append(r.superseded.SupersededGrants, h.SupersededGrants...)
	r.mu.Unlock()
	r.logf("split brain: the old primary committed %d events and granted %d leases while it was back (%d ingest log lines refused it); stopping it",
		f.SupersededCommits, f.SupersededGrants, f.Refusals)
}

// readSuperseded reads the events and grants a server took since it last
// started: what an old primary did after it came back.
func readSuperseded(ctx context.Context, conn *pgx.Conn, h *History) error {
	rows, err := conn.Query(ctx, `SELECT seq, event_id, partition, task_id, version, type, payload::text, holder, generation, committed_at
FROM ledger.events WHERE committed_at >= pg_postmaster_start_time() ORDER BY seq`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var e EventRow
		var payload string
		if err := rows.Scan(&e.Seq, &e.EventID, &e.Partition, &e.Task, &e.Version, &e.Type, &payload, &e.Holder,
			&e.Generation, &e.CommittedAt); err != nil {
			return err
		}
		e.Payload = []byte(payload)
		h.SupersededEvents = append(h.SupersededEvents, e)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = conn.Query(ctx, `SELECT partition, generation, holder, granted_at
FROM ledger.lease_grants WHERE granted_at >= pg_postmaster_start_time() ORDER BY partition, generation`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var g GrantRow
		if err := rows.Scan(&g.Partition, &g.Generation, &g.Holder, &g.GrantedAt); err != nil {
			return err
		}
		h.SupersededGrants = append(h.SupersededGrants, g)
	}
	return rows.Err()
}

// noiseLine renders log line counts, most frequent first.
func noiseLine(n map[string]int) string {
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return n[keys[i]] > n[keys[j]] || n[keys[i]] == n[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%dx %q", n[k], k)
	}
	if len(parts) == 0 {
		return "no warning or error"
	}
	return strings.Join(parts, ", ")
}

// keepLog copies a server's log into the run's directory before the
// server is removed.
func (r *run) keepLog(c *pgtemp.Cluster) {
	if b, err := os.ReadFile(c.LogFile()); err == nil {
		_ = os.WriteFile(filepath.Join(r.dir, "procs", fmt.Sprintf("postgres-%d.log", c.Port())), b, 0o644)
	}
}
