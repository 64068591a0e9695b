package connect

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// Service holds what every service binary shares: the connection flags,
// the subject prefix, the admin address and the log level.
type Service struct {
	Conn      Options
	Prefix    string
	AdminAddr string
	LogLevel  string
	// Log is the JSON logger, set by Parse.
	Log *slog.Logger
}

// Register adds the shared flags to fs; adminDefault is the service's own
// admin address (":9090" for the ingest, ":9091" for the projector).
func (s *Service) Register(fs *flag.FlagSet, adminDefault string) {
	s.Conn.Register(fs)
	fs.StringVar(&s.Prefix, "prefix", Env("LEDGER_PREFIX", "ledger"), "subject prefix (env LEDGER_PREFIX)")
	fs.StringVar(&s.AdminAddr, "admin-addr", Env("LEDGER_ADMIN_ADDR", adminDefault),
		"address of /metrics, /healthz and /readyz (env LEDGER_ADMIN_ADDR); empty disables")
	fs.StringVar(&s.LogLevel, "log-level", Env("LEDGER_LOG_LEVEL", "info"), "debug, info, warn or error (env LEDGER_LOG_LEVEL)")
}

// Parse parses args and builds the logger. It reports false (and no error)
// when only -h was asked for.
func (s *Service) Parse(fs *flag.FlagSet, args []string) (bool, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return false, nil
		}
		return false, err
	}
	if err := EnvError(); err != nil {
		return false, err
	}
	log, err := Logger(s.LogLevel)
	if err != nil {
		return false, err
	}
	s.Log = log
	return true, nil
}

// Run runs a service's run function on args and returns the process's
// exit status: 0, or 1 after writing the error to stderr.
func Run(name string, run func(args []string) error, args []string, stderr io.Writer) int {
	if err := run(args); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 1
	}
	return 0
}
