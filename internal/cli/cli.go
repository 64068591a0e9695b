// Package cli is the frame of the ledger's command-line tools, ledgerctl
// and ledgerlab: commands in a map, flags that mix with arguments, the
// connection flags every command accepts, and exit statuses.
package cli

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

// Run runs the program prog with args (without the program name) and
// returns the process exit status: 0 success, 1 failure, 2 usage error.
func Run(ctx context.Context, prog string, cmds map[string]Command, args []string, stdout, stderr io.Writer) int {
	err := Dispatch(ctx, prog, cmds, args, stdout, stderr)
	return exitCode(prog, err, stderr)
}

// Dispatch finds the command name in args (after any global flags), and
// runs the command with the global flags it was given followed by the rest.
func Dispatch(ctx context.Context, prog string, cmds map[string]Command, args []string, stdout, stderr io.Writer) error {
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
func exitCode(prog string, err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	cmd := prog
	var ce *cmdError
	if errors.As(err, &ce) {
		cmd = ce.cmd
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		if !ue.printed {
			fmt.Fprintf(stderr, "%s: %s\nRun '%s -h' for usage.\n", cmd, Printable(oneLine(ue.Msg)), cmd)
		}
		return 2
	}
	// Errors quote what they were given: a subject, a header, an id.
	fmt.Fprintf(stderr, "%s: %s\n", cmd, Printable(oneLine(errorText(err, ce))))
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
