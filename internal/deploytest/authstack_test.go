package deploytest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
)

// The two ways `ledgerctl auth` writes an authenticated deployment.
const (
	modeStatic = "static" // nkey users in the server's configuration
	modeJWT    = "jwt"    // operator mode: accounts and users as JWTs
)

// The principals and readers every generated deployment of the tests has.
var (
	authWorkers = []string{"worker-a", "worker-b"}
	authReaders = []string{"dashboards", "audit"}
)

// authDeployment is an embedded NATS server running the authorization
// that the real `ledgerctl auth <mode>` wrote, and the users' secrets.
type authDeployment struct {
	mode string
	// inboxes: every principal has an inbox stream of its own,
	// LEDGER_IN_<principal> (`ledgerctl auth -inboxes`, `streams apply
	// -principals`), in place of LEDGER_IN.
	inboxes   bool
	dir       string // what ledgerctl auth wrote
	ledgerctl string // the binary
	srv       *natstest.Server
}

// runLedgerctl runs the ledgerctl binary and returns its standard output;
// a failure fails the test with what it printed.
func runLedgerctl(t testing.TB, bin string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoErrorf(t, cmd.Run(), "ledgerctl %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String()
}

// newAuthDeployment generates a deployment with `ledgerctl auth mode` and
// starts a server from the generated files: in static mode the generated
// auth.conf, in operator mode deploy/nats-jwt/server.conf with the
// generated resolver.conf beside it, as the example's README says. With
// inboxes, the principals get inboxes of their own (-inboxes).
func newAuthDeployment(t testing.TB, mode string, inboxes bool) *authDeployment {
	t.Helper()
	d := &authDeployment{mode: mode, inboxes: inboxes, ledgerctl: buildBinary(t, "ledgerctl")}
	root := t.TempDir()
	d.dir = filepath.Join(root, "auth")
	args := []string{"auth", mode, "-out", d.dir}
	for _, w := range authWorkers {
		args = append(args, "-worker", w)
	}
	for _, r := range authReaders {
		args = append(args, "-reader", r)
	}
	if inboxes {
		args = append(args, "-inboxes")
	}
	runLedgerctl(t, d.ledgerctl, nil, args...)

	switch mode {
	case modeStatic:
		conf, err := server.ProcessConfigFile(filepath.Join(d.dir, "auth.conf"))
		require.NoError(t, err, "the generated auth.conf")
		d.srv = natstest.Start(t, natstest.WithOptions(func(o *server.Options) {
			o.Accounts, o.Users, o.Nkeys, o.NoAuthUser = conf.Accounts, conf.Users, conf.Nkeys, conf.NoAuthUser
			// The account's limits are reservations: the server must be
			// able to grant them, as a production server with its disk would.
			o.JetStreamMaxStore = 128 << 30
		}))
	case modeJWT:
		example := readRepoFile(t, "deploy/nats-jwt/server.conf")
		require.NoError(t, os.WriteFile(filepath.Join(root, "server.conf"), []byte(example), 0o600))
		conf, err := server.ProcessConfigFile(filepath.Join(root, "server.conf"))
		require.NoError(t, err, "deploy/nats-jwt/server.conf with the generated resolver.conf")
		require.NotEmpty(t, conf.TrustedOperators, "operator mode")
		d.srv = natstest.Start(t, natstest.WithOptions(func(o *server.Options) {
			keep := *o
			// The whole file: the MEMORY resolver's preloads are not
			// exported fields. natstest then sets the listener and store.
			*o = *conf
			o.NoLog, o.JetStreamMaxMemory = keep.NoLog, keep.JetStreamMaxMemory
			o.JetStreamMaxStore = 128 << 30
			o.HTTPPort = 0
		}))
	default:
		t.Fatalf("no mode %q", mode)
	}
	return d
}

// inStreams are the streams that hold the workers' events: each
// principal's inbox, or LEDGER_IN.
func (d *authDeployment) inStreams() []string {
	if !d.inboxes {
		return []string{wire.StreamIn}
	}
	var out []string
	for _, w := range authWorkers {
		out = append(out, wire.InboxStream(w))
	}
	return out
}

// inStreamOf is the stream that holds principal's events.
func (d *authDeployment) inStreamOf(principal string) string {
	if !d.inboxes {
		return wire.StreamIn
	}
	return wire.InboxStream(principal)
}

// inboxOf is the inbox prefix each user connects with (contract §9;
// docs/operations.md): a worker _INBOX.<principal>, everyone else an
// _INBOX_<name> of its own.
func inboxOf(role, name string) string {
	if role == "worker" {
		return wire.InboxPrefix(name)
	}
	return "_INBOX_" + name
}

// secret is the file of a generated user's secret.
func (d *authDeployment) secret(role, name string) string {
	base := name
	if role == "worker" || role == "reader" {
		base = role + "-" + name
	}
	if d.mode == modeStatic {
		return filepath.Join(d.dir, base+".nk")
	}
	return filepath.Join(d.dir, base+".creds")
}

// options are the connection settings of a user, as a service gets them
// from its flags (internal/connect).
func (d *authDeployment) options(role, name string) connect.Options {
	o := connect.Options{NATSURL: d.srv.URL(), Name: "deploytest-" + role + "-" + name, InboxPrefix: inboxOf(role, name)}
	if d.mode == modeStatic {
		o.NATSNKey = d.secret(role, name)
	} else {
		o.NATSCreds = d.secret(role, name)
	}
	return o
}

// env is a user's connection settings as environment variables, for the
// ledgerctl binary.
func (d *authDeployment) env(role, name string) []string {
	o := d.options(role, name)
	return []string{"NATS_URL=" + o.NATSURL, "NATS_NKEY=" + o.NATSNKey, "NATS_CREDS=" + o.NATSCreds}
}

// userConn is a connection as one user, with the asynchronous errors the
// server sent it (permission violations arrive that way).
type userConn struct {
	*nats.Conn
	errs chan error
}

// connect connects as a generated user with the settings a service would
// use.
func (d *authDeployment) connect(t testing.TB, role, name string) *userConn {
	t.Helper()
	o := d.options(role, name)
	opts, err := o.NATSOptions(nil)
	require.NoError(t, err)
	return dial(t, d.srv.URL(), append(opts, nats.MaxReconnects(0))...)
}

func dial(t testing.TB, url string, opts ...nats.Option) *userConn {
	t.Helper()
	uc := &userConn{errs: make(chan error, 256)}
	nc, err := nats.Connect(url, append(opts,
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case uc.errs <- err:
			default:
			}
		}))...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	uc.Conn = nc
	return uc
}

func (uc *userConn) js(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(uc.Conn)
	require.NoError(t, err)
	return js
}

// requireDenied waits for the server's permissions violation that names
// subject.
func (uc *userConn) requireDenied(t testing.TB, subject string) {
	t.Helper()
	_ = uc.Flush()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-uc.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
		case <-timeout:
			t.Fatalf("no permissions violation for %q", subject)
		}
	}
}

// requireNoErrors checks that the server reported nothing to uc.
func (uc *userConn) requireNoErrors(t testing.TB) {
	t.Helper()
	require.NoError(t, uc.Flush())
	select {
	case err := <-uc.errs:
		t.Fatalf("unexpected error from the server: %v", err)
	default:
	}
}
