package connect

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
)

// AdminHostDefault is the host the admin endpoints listen on unless
// -admin-addr says otherwise: 127.0.0.1. /metrics and /readyz describe the
// service's dependencies to whoever asks, so they are not offered to other
// hosts until the operator widens the address (0.0.0.0:9090 in a container
// whose port is published, for example).
const AdminHostDefault = "127.0.0.1"

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

// Register adds the shared flags to fs. adminPort is the service's own
// admin port ("9090" for the ingest, "9091" for the projector; empty for no
// admin endpoints by default): -admin-addr defaults to that port on
// AdminHostDefault. It panics if adminPort is not a bare port, as the flag
// package does on a misdeclared flag.
func (s *Service) Register(fs *flag.FlagSet, adminPort string) {
	adminDefault := ""
	if adminPort != "" {
		if strings.ContainsAny(adminPort, ":[]") {
			panic(fmt.Sprintf("connect: admin port %q: want a bare port such as \"9090\"", adminPort))
		}
		adminDefault = net.JoinHostPort(AdminHostDefault, adminPort)
	}
	s.Conn.Register(fs)
	fs.StringVar(&s.Prefix, "prefix", Env("LEDGER_PREFIX", "ledger"), "subject prefix (env LEDGER_PREFIX)")
	fs.StringVar(&s.AdminAddr, "admin-addr", Env("LEDGER_ADMIN_ADDR", adminDefault),
		"address of /metrics, /healthz and /readyz (env LEDGER_ADMIN_ADDR); loopback by default, 0.0.0.0:<port> serves other hosts; empty disables")
	fs.StringVar(&s.LogLevel, "log-level", Env("LEDGER_LOG_LEVEL", "info"), "debug, info, warn or error (env LEDGER_LOG_LEVEL)")
}

// Parse parses args, builds the logger and gives the process the services'
// garbage-collector defaults (TuneGC). It reports false (and no error) when
// only -h was asked for.
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
	s.Conn.Logger = log
	TuneGC(log)
	return true, nil
}

// Run runs a service's run function on args and returns the process's
// exit status: 0, or 1 after writing the error to stderr.
func Run(name string, run func(args []string) error, args []string, stderr io.Writer) int {
	if err := run(args); err != nil {
		fmt.Fprintln(stderr, name+":", Explain(err))
		return 1
	}
	return 0
}
