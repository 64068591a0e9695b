// Command ledgerctl is the ledger's admin command line: migrations,
// streams, leases, tasks, dead letters and the committed log. It also runs
// the lab: bench measures throughput and cost, chaos proves the promises
// under faults. Run "ledgerctl help" for the commands. Each command lives
// in ./internal/ctl/<command>.go; the bench report and the chaos run have
// packages of their own (./internal/benchreport, ./internal/chaos).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
