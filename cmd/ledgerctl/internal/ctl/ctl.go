package ctl

import (
	"context"
	"io"

	"github.com/flowness/ledger/internal/cli"
)

// The frame of ledgerctl is internal/cli, which ledgerlab shares; these
// names keep the commands' code as it was.
type (
	// Func is one command (cli.Func).
	Func = cli.Func
	// UsageError is a mistake in how a command was called (cli.UsageError).
	UsageError = cli.UsageError
	// Flags is a command's flag set with the global flags (cli.Flags).
	Flags = cli.Flags
	// Globals are the settings every command accepts (cli.Globals).
	Globals = cli.Globals
)

// Command is one entry of a dispatcher, a cli.Command. It is a type of ctl
// so that the dispatchers' tables may list its fields unnamed.
type Command struct {
	// Run runs the command.
	Run Func
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

// Connection timeouts of the CLI (internal/cli).
const (
	PostgresTimeout = cli.PostgresTimeout
	NATSTimeout     = cli.NATSTimeout
	RequestTimeout  = cli.RequestTimeout
)

// NewFlags returns the flag set of command cmd (cli.NewFlags).
func NewFlags(cmd, synopsis, summary string, stderr io.Writer) *Flags {
	return cli.NewFlags(cmd, synopsis, summary, stderr)
}

// Usagef returns a *UsageError (cli.Usagef).
func Usagef(format string, args ...any) error { return cli.Usagef(format, args...) }

func dispatch(ctx context.Context, prog string, cmds map[string]Command, args []string, stdout, stderr io.Writer) error {
	return cli.Dispatch(ctx, prog, toCLI(cmds), args, stdout, stderr)
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
	"console": {Console, "[-listen ADDR] [-allow-replay]", "serve the web console: partitions, flow, dead letters, tasks, live"},
	"auth":    {Auth, "static|jwt|jwt-user [flags]", "generate the NATS authorization of an authenticated deployment"},
	"rebuild": {Rebuild, "[-partitions SET]", "replay the PostgreSQL log into fresh projections (stop the projectors first)"},

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

	// The lab moved to ledgerlab; these say where.
	"bench": {movedToLab("bench"), "", "moved to ledgerlab: the benchmark report"},
	"chaos": {movedToLab("chaos"), "", "moved to ledgerlab: chaos runs, -external against a deployment"},
}

// Run runs ledgerctl with args (without the program name) and returns the
// process exit status: 0 success, 1 failure, 2 usage error.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "ledgerctl", toCLI(commands), args, stdout, stderr)
}
