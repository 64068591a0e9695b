// Package connect turns flags and environment variables into connections to
// PostgreSQL and NATS, the same way for every binary of the ledger.
package connect

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/fence"
)

// Defaults of the connection settings.
const (
	// NATSURLDefault is the NATS server used when NATS_URL is not set.
	NATSURLDefault = "nats://127.0.0.1:4222"
)

// Options are the connection settings shared by every binary.
type Options struct {
	DatabaseURL string
	NATSURL     string
	// NATS authentication: at most one of user/password, token, creds, nkey.
	NATSUser, NATSPassword string
	NATSCreds              string // credentials file (JWT + seed)
	NATSNKey               string // nkey seed file
	// TLS: a CA to trust, and a client certificate and key for mutual TLS.
	NATSCA, NATSCert, NATSKey string
	// Name is the client name shown by the NATS server.
	Name string
	// InboxPrefix is the prefix of the connection's reply subjects. Each
	// service uses its own (InboxPrefixFor) so that a deployment can let
	// each read only its own replies and nobody read _INBOX.> as a whole
	// (docs/contract.md §9); empty keeps nats.go's _INBOX.
	InboxPrefix string
	// Primary, when set, makes the pool refuse a superseded primary
	// (fence.GuardPool): an old primary that came back writable after a
	// failover.
	Primary *fence.PrimaryGuard
	// MinPoolSize raises the PostgreSQL pool's size to at least this many
	// connections unless the URL sets pool_max_conns itself.
	MinPoolSize int
	// Logger, if set, hears what Postgres learned about a pooler in between.
	Logger *slog.Logger
	// Session is what Postgres learned about the server's sessions.
	Session Session
	clashes *clashTracer
}

// InboxPrefixFor is the inbox prefix of a ledger component that is not a
// worker unless told otherwise: _INBOX_<name>, as in _INBOX_ingest,
// _INBOX_projector, _INBOX_ledgerctl, or _INBOX_<reader> for a reader. The
// authorization "ledgerctl auth" writes lets each subscribe to its own.
func InboxPrefixFor(name string) string { return "_INBOX_" + name }

// Register adds the connection flags to fs, with environment variables as
// their defaults.
func (o *Options) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL connection string (env DATABASE_URL)")
	fs.StringVar(&o.NATSURL, "nats-url", Env("NATS_URL", NATSURLDefault), "NATS server URLs, comma separated (env NATS_URL)")
	fs.StringVar(&o.NATSUser, "nats-user", os.Getenv("NATS_USER"), "NATS user (env NATS_USER)")
	fs.StringVar(&o.NATSPassword, "nats-password", os.Getenv("NATS_PASSWORD"), "NATS password (env NATS_PASSWORD)")
	fs.StringVar(&o.NATSCreds, "nats-creds", os.Getenv("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&o.NATSNKey, "nats-nkey", os.Getenv("NATS_NKEY"), "NATS nkey seed file (env NATS_NKEY)")
	fs.StringVar(&o.NATSCA, "nats-ca", os.Getenv("NATS_CA"), "CA certificate file to verify the NATS server (env NATS_CA)")
	fs.StringVar(&o.NATSCert, "nats-cert", os.Getenv("NATS_CERT"), "client certificate file for NATS mutual TLS (env NATS_CERT)")
	fs.StringVar(&o.NATSKey, "nats-key", os.Getenv("NATS_KEY"), "client key file for NATS mutual TLS (env NATS_KEY)")
	fs.StringVar(&o.InboxPrefix, "nats-inbox-prefix", os.Getenv("NATS_INBOX_PREFIX"),
		"prefix of this client's NATS reply subjects; default _INBOX_<component> (env NATS_INBOX_PREFIX)")
}

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// envErrs collects the malformed environment values met while flags got
// their defaults; Service.Parse reports them, so a bad value is an error,
// never silently the default.
var envErrs struct {
	sync.Mutex
	errs []error
}

func envErr(err error) {
	envErrs.Lock()
	envErrs.errs = append(envErrs.errs, err)
	envErrs.Unlock()
}

// EnvError returns the malformed environment values met so far by EnvInt
// and EnvDuration, joined, or nil.
func EnvError() error {
	envErrs.Lock()
	defer envErrs.Unlock()
	return errors.Join(envErrs.errs...)
}

// EnvInt is Env for integers. A malformed value yields def here and an
// error from EnvError (and Service.Parse).
func EnvInt(name string, def int) int {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		envErr(fmt.Errorf("%s=%q is not an integer", name, v))
		return def
	}
	return n
}

// EnvBool is Env for booleans ("true", "1", "false", "0"), with
// EnvInt's rule for malformed values.
func EnvBool(name string, def bool) bool {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		envErr(fmt.Errorf("%s=%q is not a boolean (true or false)", name, v))
		return def
	}
	return b
}

// EnvDuration is Env for durations ("3s", "250ms"), with EnvInt's rule
// for malformed values.
func EnvDuration(name string, def time.Duration) time.Duration {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		envErr(fmt.Errorf("%s=%q is not a duration (like 3s or 250ms)", name, v))
		return def
	}
	return d
}

// NATSOptions returns the nats.Connect options for o: authentication, TLS,
// and reconnecting for ever (a service outlives a NATS restart).
func (o *Options) NATSOptions(log *slog.Logger) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && log != nil {
				log.Warn("nats disconnected", slog.String("error", err.Error()))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			if log != nil {
				log.Info("nats reconnected", slog.String("url", nc.ConnectedUrlRedacted()))
			}
		}),
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	auth := 0
	if o.NATSUser != "" {
		opts, auth = append(opts, nats.UserInfo(o.NATSUser, o.NATSPassword)), auth+1
	}
	if o.NATSCreds != "" {
		opts, auth = append(opts, nats.UserCredentials(o.NATSCreds)), auth+1
	}
	if o.NATSNKey != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NATSNKey)
		if err != nil {
			return nil, fmt.Errorf("nats nkey %s: %w", o.NATSNKey, err)
		}
		opts, auth = append(opts, opt), auth+1
	}
	if auth > 1 {
		return nil, errors.New("nats: give only one of -nats-user, -nats-creds, -nats-nkey")
	}
	if o.NATSCA != "" {
		opts = append(opts, nats.RootCAs(o.NATSCA))
	}
	if (o.NATSCert == "") != (o.NATSKey == "") {
		return nil, errors.New("nats: -nats-cert and -nats-key go together")
	}
	if o.NATSCert != "" {
		opts = append(opts, nats.ClientCert(o.NATSCert, o.NATSKey))
	}
	if o.NATSCA != "" || o.NATSCert != "" {
		opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	return opts, nil
}

// NATS connects to the NATS servers.
func (o *Options) NATS(log *slog.Logger) (*nats.Conn, error) {
	opts, err := o.NATSOptions(log)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(o.NATSURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats %s is %w: %w", RedactURLs(o.NATSURL), ErrUnreachable, RedactError(o.NATSURL, err))
	}
	return nc, nil
}

// RedactURLs hides the user information (a password, or a token in the
// user position) of a comma-separated list of URLs: also of one without a
// scheme ("user:pass@host:4222") or that does not parse, whose text an
// error would otherwise carry as it is.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if info := userInfo(p); info != "" {
			parts[i] = strings.Replace(p, info, "redacted", 1)
		}
	}
	return strings.Join(parts, ",")
}

// userInfo is the user information of one URL as written: what stands
// between its scheme's "://" (or its start) and the last "@".
func userInfo(u string) string {
	from := 0
	if i := strings.Index(u, "://"); i >= 0 {
		from = i + 3
	}
	at := strings.LastIndex(u, "@")
	if at <= from {
		return ""
	}
	return u[from:at]
}

// RedactError returns err with the user information of every URL in urls
// hidden from its text: the NATS client quotes a URL it cannot parse, with
// its password, in its error. errors.Is and errors.As still see err.
func RedactError(urls string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, p := range strings.Split(urls, ",") {
		if info := userInfo(strings.TrimSpace(p)); info != "" {
			msg = strings.ReplaceAll(msg, info, "redacted")
		}
	}
	return &redactedError{msg: msg, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Logger is the JSON logger of the services, at level (debug, info, warn, error).
func Logger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
