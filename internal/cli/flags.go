package cli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/pkg/wire"
)

// Connection timeouts of the CLI: an operator should learn within seconds
// that a service is unreachable.
const (
	// PostgresTimeout bounds opening the pool and its first ping: 5 s.
	PostgresTimeout = 5 * time.Second
	// NATSTimeout bounds the NATS dial: 3 s.
	NATSTimeout = 3 * time.Second
	// RequestTimeout bounds one JetStream API request: 5 s.
	RequestTimeout = 5 * time.Second
)

// Globals are the settings every command accepts.
type Globals struct {
	// Conn holds the connection flags of internal/connect (DATABASE_URL,
	// NATS_URL, NATS credentials and TLS).
	Conn connect.Options
	// Prefix is the subject prefix; default "ledger" (env LEDGER_PREFIX).
	Prefix string
	// JSON selects one JSON object per line instead of tables.
	JSON bool
	// prog is the program, the first word of the command: it names the
	// connections.
	prog string
}

// Flags is a command's flag set with the global flags registered.
type Flags struct {
	*flag.FlagSet
	Globals
	global            map[string]bool
	synopsis, summary string
}

// NewFlags returns the flag set of command cmd (as it is typed, like
// "ledgerctl dlq list") with the global flags registered. synopsis and
// summary make up its usage; its errors and usage go to stderr.
func NewFlags(cmd, synopsis, summary string, stderr io.Writer) *Flags {
	f := &Flags{FlagSet: flag.NewFlagSet(cmd, flag.ContinueOnError), global: map[string]bool{},
		synopsis: synopsis, summary: summary}
	f.prog, _, _ = strings.Cut(cmd, " ")
	f.SetOutput(stderr)
	f.Conn.Register(f.FlagSet)
	f.StringVar(&f.Prefix, "prefix", connect.Env("LEDGER_PREFIX", wire.PrefixDefault), "subject prefix (env LEDGER_PREFIX)")
	f.BoolVar(&f.JSON, "json", false, "print one JSON object per line instead of a table")
	f.VisitAll(func(fl *flag.Flag) { f.global[fl.Name] = true })
	f.Usage = f.usage
	return f
}

func (f *Flags) usage() {
	w := f.Output()
	fmt.Fprintf(w, "Usage: %s %s\n", f.Name(), f.synopsis)
	if f.summary != "" {
		fmt.Fprintf(w, "\n%s\n", f.summary)
	}
	own := flag.NewFlagSet(f.Name(), flag.ContinueOnError)
	own.SetOutput(w)
	var globals []string
	f.VisitAll(func(fl *flag.Flag) {
		if f.global[fl.Name] {
			globals = append(globals, "-"+fl.Name)
			return
		}
		own.Var(fl.Value, fl.Name, fl.Usage)
		own.Lookup(fl.Name).DefValue = fl.DefValue
	})
	hasOwn := false
	own.VisitAll(func(*flag.Flag) { hasOwn = true })
	if hasOwn {
		fmt.Fprintf(w, "\nFlags:\n")
		own.PrintDefaults()
	}
	fmt.Fprintf(w, "\nGlobal flags (see '%s -h'): %s\n", f.prog, strings.Join(globals, " "))
}

// SetSynopsis replaces the synopsis of the usage, for a command that shares
// another's flags.
func (f *Flags) SetSynopsis(s string) { f.synopsis = s }

// Parse parses args. Unlike flag.FlagSet.Parse it accepts flags after
// positional arguments too ("task report-7 -json"); "--" ends the flags.
// Args then returns the positional arguments. A bad flag is reported with
// the usage and returned as a *UsageError; -h returns flag.ErrHelp.
func (f *Flags) Parse(args []string) error {
	var positional []string
	for {
		if err := f.FlagSet.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return &UsageError{Msg: err.Error(), printed: true}
		}
		rest := f.FlagSet.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	// Leave exactly the positional arguments in Args.
	_ = f.FlagSet.Parse(append([]string{"--"}, positional...))
	if !wire.ValidID(f.Prefix) {
		return Usagef("-prefix %q must be one subject token of [A-Za-z0-9_-]", f.Prefix)
	}
	return nil
}

// Subjects are the ledger's subjects under the chosen prefix.
func (g *Globals) Subjects() wire.Subjects { return wire.Subjects{Prefix: g.Prefix} }

// Postgres opens a pool on the database and checks that it answers, within
// PostgresTimeout. A missing or malformed URL is a *UsageError.
func (g *Globals) Postgres(ctx context.Context) (*pgxpool.Pool, error) {
	g.Conn.Name = g.prog
	ctx, cancel := context.WithTimeout(ctx, PostgresTimeout)
	defer cancel()
	pool, err := g.Conn.Postgres(ctx)
	var parseErr *pgconn.ParseConfigError
	switch {
	case errors.Is(err, connect.ErrNoDatabase):
		return nil, Usagef("%v", err)
	case errors.As(err, &parseErr):
		return nil, Usagef("-database-url: %v", parseErr)
	case err != nil:
		return nil, err
	}
	return pool, nil
}

// NATS connects to NATS for a short-lived command: a dial timeout of
// NATSTimeout and no reconnects, so an unreachable server is an error at
// once. extra options are applied last (tail allows reconnects).
func (g *Globals) NATS(extra ...nats.Option) (*nats.Conn, error) {
	g.Conn.Name = g.prog
	g.Conn.InboxPrefix = cmp.Or(g.Conn.InboxPrefix, connect.InboxPrefixFor(g.prog))
	opts, err := g.Conn.NATSOptions(nil)
	if err != nil {
		return nil, Usagef("%v", err)
	}
	opts = append(opts, nats.Name(g.prog), nats.Timeout(NATSTimeout), nats.MaxReconnects(0))
	opts = append(opts, extra...)
	nc, err := nats.Connect(g.Conn.NATSURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("NATS at %s is not reachable: %w", connect.RedactURLs(g.Conn.NATSURL), connect.RedactError(g.Conn.NATSURL, err))
	}
	return nc, nil
}

// JetStream connects to NATS and returns a JetStream context on it; close
// the connection when done.
func (g *Globals) JetStream(extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := g.NATS(extra...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}
