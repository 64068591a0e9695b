package connect

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
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
	log, err := Logger(s.LogLevel)
	if err != nil {
		return false, err
	}
	s.Log = log
	return true, nil
}

// Main runs a service's run function and exits non-zero with a message when
// it fails.
func Main(name string, run func(args []string) error) {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
