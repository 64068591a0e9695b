package dbtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PgBouncer is a PgBouncer process of one test, in front of the test
// server: Debian's pgbouncer package, started with a configuration of its
// own on a port of its own, stopped when the test ends.
type PgBouncer struct {
	// Addr is where it listens, "127.0.0.1:port".
	Addr string
	log  string
}

// StartPgBouncer starts PgBouncer in pool mode ("session" or
// "transaction") in front of the test server. settings are extra lines
// of its [pgbouncer] section, such as "ignore_startup_parameters = ...".
// A missing pgbouncer binary fails the test: CI installs it (.ci/run).
func StartPgBouncer(t testing.TB, mode string, settings ...string) *PgBouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			t.Fatalf("dbtest: pgbouncer is not installed (apt-get install pgbouncer): %v", err)
		}
		bin = "/usr/sbin/pgbouncer"
	}
	server, err := pgconn.ParseConfig(ServerURL())
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	// pgbouncer refuses to run as root and drops to another user (-u),
	// which must read its files.
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	port := freePort(t)
	users := fmt.Sprintf("%q %q\n", server.User, server.Password)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
%s
`, server.Host, server.Port, port, filepath.Join(dir, "users.txt"), mode, strings.Join(settings, "\n"))
	for name, body := range map[string]string{"users.txt": users, "pgbouncer.ini": ini} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatalf("dbtest: %v", err)
		}
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "nobody"}, args...)
	}
	cmd := exec.Command(bin, args...)
	pb := &PgBouncer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log: filepath.Join(dir, "log")}
	logf, err := os.Create(pb.log)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("dbtest: start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", pb.Log())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		c, err := net.DialTimeout("tcp", pb.Addr, time.Second)
		if err == nil {
			c.Close()
			return pb
		}
		select {
		case <-exited:
			t.Fatalf("dbtest: pgbouncer exited at start:\n%s", pb.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dbtest: pgbouncer does not listen on %s: %v", pb.Addr, err)
		}
	}
}

// Log is what pgbouncer has written so far.
func (pb *PgBouncer) Log() string {
	b, _ := os.ReadFile(pb.log)
	return string(b)
}

// URL is the connection string of database name through this PgBouncer,
// with query parameters query appended (like "default_query_exec_mode=exec").
func (pb *PgBouncer) URL(t testing.TB, name string, query ...string) string {
	t.Helper()
	server, err := pgconn.ParseConfig(ServerURL())
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	u := url.URL{Scheme: "postgres", Host: pb.Addr, Path: "/" + name,
		User: url.UserPassword(server.User, server.Password), RawQuery: strings.Join(append([]string{"sslmode=disable"}, query...), "&")}
	if server.Password == "" {
		u.User = url.User(server.User)
	}
	return u.String()
}

func freePort(t testing.TB) int {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("dbtest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
