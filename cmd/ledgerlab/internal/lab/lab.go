// Package lab is ledgerlab's commands: the benchmark report and the chaos
// runs, with the failover study. They run the ledger as processes, so they
// live apart from ledgerctl, the operator's tool.
package lab

import (
	"context"
	"io"

	"github.com/flowness/ledger/internal/cli"
)

// commands is ledgerlab's dispatcher. Adding a command is one line here.
var commands = map[string]Command{
	"bench": {Bench, "[-events N] [-rate N] | -external [flags]", "benchmark report: baselines, fence, pipeline, latency; -external: the deployment's shape"},
	"chaos": {Chaos, "[flags] | writer|check|failover ...", "run the ledger as processes under faults and check every promise"},
}

// Run runs ledgerlab with args (without the program name) and returns the
// process exit status: 0 success, 1 failure, 2 usage error.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "ledgerlab", toCLI(commands), args, stdout, stderr)
}

// Command is one entry of a dispatcher, a cli.Command. It is a type of lab
// so that the dispatchers' tables may list its fields unnamed.
type Command struct {
	// Run runs the command.
	Run cli.Func
	// Args is the synopsis after the command's name, like "[flags] <id>".
	Args string
	// Summary is the one line shown in the usage.
	Summary string
}

func toCLI(cmds map[string]Command) map[string]cli.Command {
	m := make(map[string]cli.Command, len(cmds))
	for name, c := range cmds {
		m[name] = cli.Command(c)
	}
	return m
}

// Flags is a command's flag set with the global flags (cli.Flags).
type Flags = cli.Flags

// NewFlags returns the flag set of command cmd (cli.NewFlags).
func NewFlags(cmd, synopsis, summary string, stderr io.Writer) *Flags {
	return cli.NewFlags(cmd, synopsis, summary, stderr)
}

// Usagef returns a *cli.UsageError: exit status 2.
func Usagef(format string, args ...any) error { return cli.Usagef(format, args...) }

func dispatch(ctx context.Context, prog string, cmds map[string]Command, args []string, stdout, stderr io.Writer) error {
	return cli.Dispatch(ctx, prog, toCLI(cmds), args, stdout, stderr)
}

func writeJSON(w io.Writer, v any) error { return cli.WriteJSON(w, v) }
