package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/flowness/ledger/internal/connect"
)

// Func is one command. It parses its own args with NewFlags (which also
// accepts the global flags; Run hands over the ones given before the command
// name), writes its output to stdout and its diagnostics to stderr, and
// returns nil on success. A *UsageError (see Usagef) makes Run exit 2, any
// other error exits 1, flag.ErrHelp exits 0.
type Func func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Command is one entry of a dispatcher.
type Command struct {
	// Run runs the command.
	Run Func
	// Args is the synopsis after the command's name, like "[flags] <id>".
	Args string
	// Summary is the one line shown in the usage.
	Summary string
}

// commands is the top-level dispatcher. Adding a command is one line here;
// the usage lists exactly the commands present.
var commands = map[string]Command{
	"migrate": {Migrate, "[-check]", "apply the database migrations (safe to repeat)"},
	"streams": {Streams, "apply|list", "create or update the ledger's streams and buckets; list them all"},
	"leases":  {Leases, "[-partition N]", "list the partitions' leases: holder, generation, time left"},
	"claims":  {Claims, "", "list which ingest decides each partition, and its claim's epoch"},
	"restore": {Restore, "[-dry-run]", "write back from LEDGER_LOG acknowledged commits the database forgot"},
	"task":    {Task, "<id>", "show a task's committed events, rejections and projection"},
	"dlq":     {DLQ, "list|replay [flags]", "list dead letters, or re-submit them for a fresh verdict"},
	"tail":    {Tail, "[-since-seq N | -new] [-n N]", "follow the committed log (LEDGER_LOG)"},
	"version": {Version, "", "print the version of ledgerctl"},
	"demo":    {Demo, "", "run the whole ledger in-process and play the two seed stories"},
	"dev":     {Dev, "[-nats-port N] [-fresh-database] [-json]", "run a whole local ledger in-process until SIGINT or SIGTERM"},
	"bench":   {Bench, "[-events N] [-rate N]", "benchmark report: baselines, fence, pipeline, latency"},
	"console": {Console, "[-listen ADDR] [-allow-replay]", "serve the web console: partitions, flow, dead letters, tasks, live"},
	"auth":    {Auth, "static|jwt|jwt-user [flags]", "generate the NATS authorization of an authenticated deployment"},
	"rebuild": {Rebuild, "[-partitions SET]", "replay the PostgreSQL log into fresh projections (stop the projectors first)"},
	"chaos":   {Chaos, "[flags] | writer|check ...", "run the ledger as processes under faults and check every promise"},

	"archive":          {Archive, "-dir DIR -before-seq N | -older-than D", "move history older than a horizon into files, online"},
	"revoke":           {Revoke, "-partition P -reason R", "fence a partition's holder now: raise its generation, end its lease"},
	"cordon":           {Cordon, "-partition P -reason R", "grant a partition to nobody until it is uncordoned; its holder drains"},
	"uncordon":         {Uncordon, "-partition P -reason R", "let a cordoned partition be granted again"},
	"fence-mode":       {FenceMode, "[-partition P -reason R enforce|observe]", "switch a partition between enforcing and observing the fence; list modes"},
	"partition-ranges": {PartitionRanges, "[-principal NAME -ranges 0-15 | -clear -reason R]", "say which partitions a principal may lease; list the ranges"},
	"would-reject":     {WouldRejectReport, "-since T [-partitions SET]", "count commits that observe let through and enforce would have refused"},
	"verify":           {Verify, "[-kinds LIST] [-since D] [-json]", "report what JetStream lost against PostgreSQL: projections, log copies, consumers"},
	"repair":           {Repair, "[-kinds LIST] [-since D] [-json]", "put back from PostgreSQL what verify finds: log copies, projections"},
	"snapshot":         {Snapshot, "-out FILE", "write the projection bucket to a file a rebuild can start from"},
}

// Run runs ledgerctl with args (without the program name) and returns the
// process exit status: 0 success, 1 failure, 2 usage error.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := dispatch(ctx, "ledgerctl", commands, args, stdout, stderr)
	return exitCode(err, stderr)
}

// dispatch finds the command name in args (after any global flags), and
// runs the command with the global flags it was given followed by the rest.
func dispatch(ctx context.Context, prog string, cmds map[string]Command, args []string, stdout, stderr io.Writer) error {
	// Only the global flags may come before the name; they are parsed here
	// to find the name, and again by the command.
	fs := NewFlags(prog, "", "", stderr)
	fs.Usage = func() { printUsage(stderr, prog, cmds) }
	if err := fs.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, prog, cmds)
			return err
		}
		return &UsageError{Msg: err.Error(), printed: true}
	}
	rest := fs.Args()
	if len(rest) == 0 {
		printUsage(stderr, prog, cmds)
		return &UsageError{Msg: "no command given", printed: true}
	}
	name := rest[0]
	if name == "help" {
		return help(ctx, prog, cmds, rest[1:], stdout, stderr)
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n", prog, name)
		printUsage(stderr, prog, cmds)
		return &UsageError{Msg: "unknown command " + name, printed: true}
	}
	globals := args[:len(args)-len(rest)]
	cmdArgs := append(slices.Clip(globals), rest[1:]...)
	if err := cmd.Run(ctx, cmdArgs, stdout, stderr); err != nil {
		return withCommand(prog+" "+name, err)
	}
	return nil
}

// help prints the usage, or a command's usage.
func help(ctx context.Context, prog string, cmds map[string]Command, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		printUsage(stdout, prog, cmds)
		return nil
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "%s help: unknown command %q\n\n", prog, args[0])
		printUsage(stderr, prog, cmds)
		return &UsageError{Msg: "unknown command " + args[0], printed: true}
	}
	// The usage asked for is the output: it goes to stdout.
	err := cmd.Run(ctx, append(args[1:len(args):len(args)], "-h"), stdout, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func printUsage(w io.Writer, prog string, cmds map[string]Command) {
	fmt.Fprintf(w, "Usage: %s [global flags] <command> [flags] [args]\n\nCommands:\n", prog)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, name := range slices.Sorted(maps.Keys(cmds)) {
		c := cmds[name]
		fmt.Fprintf(tw, "  %s %s\t%s\n", name, c.Args, c.Summary)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nGlobal flags (accepted before or after the command):\n")
	fs := NewFlags(prog, "", "", w)
	fs.PrintDefaults()
	fmt.Fprintf(w, "\nRun '%s help <command>' for a command's flags.\n", prog)
}

// UsageError is a mistake in how a command was called: Run prints it and
// exits 2.
type UsageError struct {
	Msg string
	// printed is set when the message and usage were already written.
	printed bool
}

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a *UsageError: Run prints "ledgerctl <command>: <message>"
// and a hint to the command's usage, and exits 2.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// cmdError names the command an error came from.
type cmdError struct {
	cmd string
	err error
}

func (e *cmdError) Error() string { return e.cmd + ": " + e.err.Error() }
func (e *cmdError) Unwrap() error { return e.err }

func withCommand(cmd string, err error) error {
	var ce *cmdError
	if errors.As(err, &ce) || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &cmdError{cmd: cmd, err: err}
}

// exitCode prints err (unless it was printed already) and maps it to the
// exit status.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	cmd := "ledgerctl"
	var ce *cmdError
	if errors.As(err, &ce) {
		cmd = ce.cmd
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		if !ue.printed {
			fmt.Fprintf(stderr, "%s: %s\nRun '%s -h' for usage.\n", cmd, printable(oneLine(ue.Msg)), cmd)
		}
		return 2
	}
	// Errors quote what they were given: a subject, a header, an id.
	fmt.Fprintf(stderr, "%s: %s\n", cmd, printable(oneLine(errorText(err, ce))))
	return 1
}

func errorText(err error, ce *cmdError) string {
	if ce != nil {
		err = ce.err
	}
	return connect.Explain(err).Error()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
