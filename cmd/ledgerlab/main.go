// Command ledgerlab is the ledger's lab: bench measures throughput and
// cost, chaos proves the promises under faults, chaos failover measures
// failover per lease TTL. It runs the ledger as processes (ingest,
// projector, ledgerctl, NATS, a throwaway PostgreSQL) found beside it.
// Run "ledgerlab help" for the commands; each lives in ./internal/lab.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/flowness/ledger/cmd/ledgerlab/internal/lab"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := lab.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
