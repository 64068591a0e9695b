// Package pgtemp starts a throwaway PostgreSQL cluster from the local
// installation, for the demo: initdb in a temporary directory, a server that
// listens only on a Unix socket in that directory, removed on Stop. When run
// as root it runs the server as the "postgres" user, as PostgreSQL refuses to
// run as root.
package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cluster is a running throwaway cluster.
type Cluster struct {
	dir    string
	port   int
	pgCtl  string
	asUser *user.User
	// opts are the server options of pg_ctl start, kept for Restart.
	opts string
	// tcp is set when the server listens on 127.0.0.1:port too.
	tcp bool
}

// ErrNotInstalled is returned when initdb and pg_ctl cannot be found.
var ErrNotInstalled = errors.New("pgtemp: PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin")

// find locates a PostgreSQL server binary.
func find(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	sort.Sort(sort.Reverse(sort.StringSlice(matches))) // newest major first
	if len(matches) > 0 {
		return matches[0], nil
	}
	return "", ErrNotInstalled
}

// Start creates and starts a cluster. Stop removes it.
func Start(ctx context.Context) (*Cluster, error) { return StartWith(ctx, Options{}) }

// StartWith is Start with options.
func StartWith(ctx context.Context, o Options) (*Cluster, error) {
	initdb, err := find("initdb")
	if err != nil {
		return nil, err
	}
	pgCtl, err := find("pg_ctl")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ledger-demo-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtemp: temp dir: %w", err)
	}
	c, err := newCluster(dir, pgCtl, o)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := c.run(ctx, initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtemp: initdb: %w: %s", err, out)
	}
	if out, err := c.start(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtemp: start: %w: %s %s", err, out, log)
	}
	return c, nil
}

// newCluster is the cluster of o in dir, owned by the postgres user when
// run as root; nothing is started yet.
func newCluster(dir, pgCtl string, o Options) (*Cluster, error) {
	c := &Cluster{dir: dir, port: cmpOr(o.Port, 50000+os.Getpid()%10000), pgCtl: pgCtl, tcp: o.TCP}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtemp: running as root needs a postgres user to run the server: %w", err)
		}
		c.asUser = u
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtemp: chown %s: %w", dir, err)
		}
	}
	listen := "''"
	if o.TCP {
		listen = "127.0.0.1"
	}
	c.opts = fmt.Sprintf("-c listen_addresses=%s -k %s -p %d -c fsync=off -c full_page_writes=off %s", listen, dir, c.port, o.settings())
	return c, nil
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// URL connects to the cluster's postgres database over its socket.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", c.dir, c.port)
}

// Socket is the path of the server's Unix socket.
func (c *Cluster) Socket() string {
	return filepath.Join(c.dir, fmt.Sprintf(".s.PGSQL.%d", c.port))
}

// Stop stops the server and removes the cluster.
func (c *Cluster) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = c.run(ctx, c.pgCtl, "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "-w", "stop")
	os.RemoveAll(c.dir)
}

func (c *Cluster) run(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = c.dir
	if c.asUser != nil {
		uid, _ := strconv.Atoi(c.asUser.Uid)
		gid, _ := strconv.Atoi(c.asUser.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = append(os.Environ(), "HOME="+c.dir)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
