// Command ledgerctl is the ledger's admin command line: migrations, streams,
// leases, tasks, dead letters and the committed log. Run "ledgerctl help"
// for the commands; the implementations live in ./internal/ctl.
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
