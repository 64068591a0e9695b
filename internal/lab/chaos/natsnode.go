package chaos

import (
	"context"
	"errors"
	"fmt"
	"github.com/flowness/ledger/internal/admin"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSNode configures one nats-server process of a chaos run (the hidden
// "ledgerlab chaos nats"): the machine's packaged nats-server is too old
// for the ledger, so ledgerlab embeds the module's own and runs it as a
// child process that can be killed and started again on the same port and
// store.
type NATSNode struct {
	// Name is the server name, unique within a cluster.
	Name string
	// Port is the client port on 127.0.0.1.
	Port int
	// StoreDir holds the JetStream data; a restart on the same dir
	// recovers the streams.
	StoreDir string
	// Cluster names the cluster; empty runs a standalone server.
	Cluster string
	// ClusterPort is the route port on 127.0.0.1 (cluster only).
	ClusterPort int
	// CPUProfile, when set, is the file a CPU profile of the node's whole
	// life is written to as it stops.
	CPUProfile string
	// Routes are the route URLs of every node, this one included.
	Routes string
	// SyncAlways makes JetStream fsync every write before it acknowledges
	// it (sync_interval: always); default the server's periodic sync.
	SyncAlways bool
}

// JetStream limits of a chaos node: explicit, so the server does not size
// them from the machine's free memory and disk.
const (
	natsMaxMemory = 256 << 20
	natsMaxStore  = 8 << 30
)

// RunNATS runs the node until ctx ends, then shuts it down gracefully.
func RunNATS(ctx context.Context, n NATSNode) error {
	if n.Port <= 0 || n.StoreDir == "" || n.Name == "" {
		return errors.New("nats node: name, port and store dir are required")
	}
	o := &server.Options{ServerName: n.Name, Host: "127.0.0.1", Port: n.Port, JetStream: true,
		StoreDir: n.StoreDir, JetStreamMaxMemory: natsMaxMemory, JetStreamMaxStore: natsMaxStore,
		NoSigs: true, Logtime: true, SyncAlways: n.SyncAlways}
	if n.Cluster != "" {
		if n.ClusterPort <= 0 || n.Routes == "" {
			return errors.New("nats node: a cluster node needs a cluster port and routes")
		}
		o.Cluster.Name, o.Cluster.Host, o.Cluster.Port = n.Cluster, "127.0.0.1", n.ClusterPort
		o.Routes = server.RoutesFromStr(n.Routes)
	}
	srv, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("nats node %s: %w", n.Name, err)
	}
	srv.ConfigureLogger()
	if n.CPUProfile != "" {
		stop, err := admin.StartCPUProfile(n.CPUProfile)
		if err != nil {
			return fmt.Errorf("nats node %s: %w", n.Name, err)
		}
		defer stop()
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats node %s: not ready for connections on port %d within 30s", n.Name, n.Port)
	}
	<-ctx.Done()
	srv.Shutdown()
	srv.WaitForShutdown()
	return nil
}
