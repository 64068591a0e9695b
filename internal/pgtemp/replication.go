package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Streaming replication, for the chaos run's PostgreSQL failover: a
// standby made with pg_basebackup that streams from its primary through a
// replication slot, promoted by pg_ctl promote. Both servers listen on
// 127.0.0.1, so that one multi-host connection string names them.

// HostPort is the server's TCP address, 127.0.0.1:port (Options.TCP).
func (c *Cluster) HostPort() string { return "127.0.0.1:" + strconv.Itoa(c.port) }

// StartStandby copies the running cluster c with pg_basebackup into a new
// cluster of o (which listens on TCP) and starts it as a hot standby that
// streams from c through the replication slot name, which it creates.
// The standby's application_name is name too, so that c may list it in
// synchronous_standby_names. c must listen on TCP. Stop removes it.
func (c *Cluster) StartStandby(ctx context.Context, o Options, name string) (*Cluster, error) {
	if !c.tcp {
		return nil, errors.New("pgtemp: a standby streams over TCP; start the primary with Options.TCP")
	}
	basebackup, err := find("pg_basebackup")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ledger-standby-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtemp: temp dir: %w", err)
	}
	o.TCP = true
	s, err := newCluster(dir, c.pgCtl, o)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := s.run(ctx, basebackup, "-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-X", "stream", "-c", "fast", "-C", "-S", name, "-R", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtemp: pg_basebackup: %w: %s", err, out)
	}
	// After -R's own lines: the last setting of a name wins.
	conf := fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s'\nprimary_slot_name = '%s'\n",
		c.port, name, name)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtemp: configure the standby: %w", err)
	}
	if out, err := s.start(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtemp: start the standby: %w: %s %s", err, out, log)
	}
	return s, nil
}

// Promote makes a standby a primary (pg_ctl promote) and returns once it
// accepts writes, on a new WAL timeline.
func (c *Cluster) Promote(ctx context.Context) error {
	if out, err := c.run(ctx, c.pgCtl, "-D", filepath.Join(c.dir, "data"), "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("pgtemp: promote: %w: %s", err, out)
	}
	return nil
}

// StopStreaming freezes a standby where it is: it forgets its primary
// (primary_conninfo empty), so its WAL receiver stops and nothing its
// primary writes from now on reaches it. A promotion then loses it.
func (c *Cluster) StopStreaming(ctx context.Context) error {
	return c.Exec(ctx, `ALTER SYSTEM SET primary_conninfo = ''`, `SELECT pg_reload_conf()`)
}

// Exec runs statements on the cluster's postgres database, one after the
// other, each in a transaction of its own.
func (c *Cluster) Exec(ctx context.Context, sql ...string) error {
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgtemp: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range sql {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgtemp: %s: %w", q, err)
		}
	}
	return nil
}

// Kill kills every process of the server with SIGKILL, as a crashed host
// would leave it: the postmaster and each of its children, nothing
// flushed, nothing told. It returns once the postmaster is gone. Start
// brings the same data up again.
func (c *Cluster) Kill() error {
	b, err := os.ReadFile(filepath.Join(c.dir, "data", "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pgtemp: kill: no postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return fmt.Errorf("pgtemp: kill: postmaster.pid says %q", first)
	}
	children := childrenOf(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, ch := range children {
		_ = syscall.Kill(ch, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
	}
	return fmt.Errorf("pgtemp: kill: postmaster %d still runs 30s after SIGKILL", pid)
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after
		// its closing parenthesis.
		_, rest, ok := strings.Cut(string(b), ") ")
		if f := strings.Fields(rest); ok && len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// StartAgain starts a stopped or killed server on its data again, with
// settings added to its own ("name=value" each); it recovers from the
// WAL. A killed primary comes back a primary, on its old timeline.
func (c *Cluster) StartAgain(ctx context.Context, settings ...string) error {
	opts := c.opts
	for _, kv := range settings {
		c.opts += " -c " + kv
	}
	out, err := c.start(ctx)
	c.opts = opts
	if err != nil {
		return fmt.Errorf("pgtemp: start again: %w: %s", err, out)
	}
	return nil
}

// Port is the server's port.
func (c *Cluster) Port() int { return c.port }

// FreePort is a TCP port on 127.0.0.1 that was free when asked, for a
// cluster's Options.Port.
func FreePort() (int, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtemp: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Count runs a query of one bigint (a count) on the cluster's postgres
// database. A standby that has not replayed a table yet fails.
func (c *Cluster) Count(ctx context.Context, sql string) (int64, error) {
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return 0, fmt.Errorf("pgtemp: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgtemp: %s: %w", sql, err)
	}
	return n, nil
}
