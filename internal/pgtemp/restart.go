package pgtemp

import (
	"context"
	"fmt"
	"path/filepath"
)

// Options adjust a throwaway cluster. The zero value is the demo's cluster.
type Options struct {
	// Durable keeps synchronous_commit on, so that every commit a client was
	// told about survives Restart (an immediate shutdown drops the WAL not yet
	// written). Default off: the demo trades that for speed. It leaves fsync
	// off (see Fsync), since a stopped server, unlike a crashed host, loses
	// nothing the kernel already holds.
	Durable bool
	// Fsync turns fsync and full_page_writes on, as a real deployment runs
	// them, so that a commit costs its WAL flush to the disk (ledgerctl
	// bench -external measures that cost). Default off.
	Fsync bool
	// TCP makes the server listen on 127.0.0.1 too (see TCPURL), as a
	// multi-host connection string needs. Default the socket only.
	TCP bool
	// Port is the server's port; default 50000 plus the process id modulo
	// 10000 (two clusters of one process need ports of their own).
	Port int
	// Settings are more server settings, "name=value" each; they come
	// last, so they win.
	Settings []string
}

func (o Options) settings() string {
	s := "-c synchronous_commit=off"
	if o.Durable {
		s = "-c synchronous_commit=on"
	}
	if o.Fsync {
		// After the defaults' "fsync=off" on the command line: the last
		// setting of a name wins.
		s += " -c fsync=on -c full_page_writes=on"
	}
	for _, kv := range o.Settings {
		s += " -c " + kv
	}
	return s
}

// Restart stops the server in immediate mode, as a crash would (no
// checkpoint, every connection cut), and starts it again on the same socket
// and data, which it recovers from the WAL.
func (c *Cluster) Restart(ctx context.Context) error {
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, c.pgCtl, "-D", data, "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("pgtemp: immediate stop: %w: %s", err, out)
	}
	if out, err := c.start(ctx); err != nil {
		return fmt.Errorf("pgtemp: start after immediate stop: %w: %s", err, out)
	}
	return nil
}

// start starts the server with c.opts; its log goes to server.log.
func (c *Cluster) start(ctx context.Context) (string, error) {
	return c.run(ctx, c.pgCtl, "-D", filepath.Join(c.dir, "data"), "-o", c.opts,
		"-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "start")
}

// LogFile is the path of the server's log.
func (c *Cluster) LogFile() string { return filepath.Join(c.dir, "server.log") }

// Dir is the cluster's directory: data, socket and log.
func (c *Cluster) Dir() string { return c.dir }
