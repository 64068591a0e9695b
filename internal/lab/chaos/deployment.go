package chaos

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/internal/pgtemp"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/wire"
)

// DeploymentOptions configure StartDeployment. The zero value starts the
// default deployment from the binaries beside the running executable.
type DeploymentOptions struct {
	// Bin is the directory holding the ingest, projector and ledgerlab
	// binaries; default the directory of the running executable.
	Bin string
	// Partitions is the ingest's partition count; default 16
	// (wire.PartitionsDefault).
	Partitions int
	// IngestArgs are flags added to the ingest's (such as -cpuprofile
	// FILE); default none.
	IngestArgs []string
	// ProjectorArgs are flags added to the projector's; default none.
	ProjectorArgs []string
	// Dir keeps the processes' logs and the NATS store; default a temporary
	// directory, which Stop removes.
	Dir string
	// Progress receives the setup log; default discards.
	Progress io.Writer
	// NoProjector leaves the projector out: a latency run measures the
	// path to the receipt, which the projector is not on.
	NoProjector bool
	// Cluster runs three nats-server nodes and R3 streams and buckets;
	// default one node and R1.
	Cluster bool
	// NATSSyncAlways runs the nodes with sync_interval: always; default
	// the server's periodic sync (2 min).
	NATSSyncAlways bool
	// NATSProfile, when set, is the file the NATS node writes a CPU profile
	// of its whole life to; default none.
	NATSProfile string
	// Roles runs the ingest and the projector as LOGIN users in
	// ledger_ingest and ledger_projector, as a production deployment does
	// (docs/operations.md, "PostgreSQL roles"): the database's own fence
	// then checks each of their statements. The schema is migrated by its
	// owner first. Default: both connect as the owner.
	Roles bool
}

// Deployment is the ledger as processes, the way it is deployed and with no
// fault injected: a throwaway PostgreSQL with the settings of a durable
// deployment (fsync, full_page_writes and synchronous_commit on), one
// nats-server (a "ledgerlab chaos nats" process), one ingest and one
// projector, each from its binary with its default settings. It is what
// "ledgerlab bench -external" measures; a process that exits is not
// restarted but counted (Exits).
type Deployment struct {
	r    *run
	temp bool
	// ingestAdmin is the ingest's admin address (its /metrics).
	ingestAdmin string
}

// DeployedProcess is one service process of a Deployment.
type DeployedProcess struct {
	// Name is "nats-server", "ingest" or "projector".
	Name string
	// PID is its process id.
	PID int
}

// StartDeployment starts a Deployment and returns once the ingest and the
// projector are ready. Stop it with Stop.
func StartDeployment(ctx context.Context, o DeploymentOptions) (_ *Deployment, err error) {
	parts := cmp.Or(o.Partitions, wire.PartitionsDefault)
	ro := Options{Partitions: parts, Ingests: 1, Bin: o.Bin, Dir: o.Dir, Progress: o.Progress, Cluster: o.Cluster,
		NATSSyncAlways: o.NATSSyncAlways, NATSProfile: o.NATSProfile}.WithDefaults()
	replicas := "1"
	if o.Cluster {
		replicas = "3"
	}
	r := newRun(ro)
	if err := r.findBinaries(); err != nil {
		return nil, err
	}
	if err := r.makeDir(); err != nil {
		return nil, err
	}
	d := &Deployment{r: r, temp: o.Dir == ""}
	defer func() {
		if err != nil {
			d.Stop(true)
			err = fmt.Errorf("%w (logs in %s)", err, r.dir)
		}
	}()
	pg, err := pgtemp.StartWith(ctx, pgtemp.Options{Durable: true, Fsync: true})
	if err != nil {
		return nil, fmt.Errorf("deployment: start PostgreSQL: %w", err)
	}
	r.pg, r.dbURL = pg, pg.URL()
	r.logf("PostgreSQL: a throwaway cluster in %s (fsync, full_page_writes, synchronous_commit on)", pg.Dir())
	if err := r.startNATS(ctx); err != nil {
		return nil, err
	}
	if err := r.connect(ctx, func() (*nats.Conn, error) {
		return nats.Connect(r.natsURL, nats.Name("bench"))
	}); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	ingestURL, projectorURL := r.dbURL, r.dbURL
	if o.Roles {
		if err := serviceUsers(ctx, r.dbURL); err != nil {
			return nil, err
		}
		if ingestURL, err = urlAs(r.dbURL, ingestUser); err != nil {
			return nil, err
		}
		if projectorURL, err = urlAs(r.dbURL, projectorUser); err != nil {
			return nil, err
		}
		o.IngestArgs = append([]string{"-migrate=false"}, o.IngestArgs...)
		r.logf("the ingest and the projector connect as users in ledger_ingest and ledger_projector")
	}
	args := append([]string{"-database-url", ingestURL, "-nats-url", r.natsURL, "-partitions", strconv.Itoa(parts), "-replicas", replicas,
		"-admin-addr", fmt.Sprintf("127.0.0.1:%d", ports[0])}, o.IngestArgs...)
	d.ingestAdmin = fmt.Sprintf("127.0.0.1:%d", ports[0])
	ing := d.newProc("ingest", r.bin.ingest, args...)
	r.ingests = append(r.ingests, ing)
	if err := ing.start(); err != nil {
		return nil, err
	}
	// The ingest migrates and creates the streams; the projector needs both.
	if err := waitReady(ctx, ports[0], ing); err != nil {
		return nil, err
	}
	if o.Roles {
		if err := connectedAs(ctx, r.pool, ingestUser); err != nil {
			return nil, err
		}
	}
	if o.NoProjector {
		r.logf("an ingest ready (no projector)")
		return d, nil
	}
	r.proj = d.newProc("projector", r.bin.projector, append([]string{"-database-url", projectorURL, "-nats-url", r.natsURL,
		"-partition-count", strconv.Itoa(parts), "-replicas", replicas, "-admin-addr", fmt.Sprintf("127.0.0.1:%d", ports[1])},
		o.ProjectorArgs...)...)
	if err := r.proj.start(); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, ports[1], r.proj); err != nil {
		return nil, err
	}
	if o.Roles {
		if err := connectedAs(ctx, r.pool, projectorUser); err != nil {
			return nil, err
		}
	}
	r.logf("an ingest and a projector ready")
	return d, nil
}

// newProc is a service process that is not restarted when it exits: a
// measurement that lost a process is void, and says so.
func (d *Deployment) newProc(name, path string, args ...string) *proc {
	p := d.r.newProc(name, path, args...)
	p.onExit = func(p *proc, err error) {
		d.r.onExit(p, err)
		p.close()
	}
	return p
}

// DatabaseURL connects to the deployment's PostgreSQL.
func (d *Deployment) DatabaseURL() string { return d.r.dbURL }

// NATSURL is the deployment's NATS server.
func (d *Deployment) NATSURL() string { return d.r.natsURL }

// Pool is a connection pool to the deployment's PostgreSQL, closed by Stop.
func (d *Deployment) Pool() *pgxpool.Pool { return d.r.pool }

// NATS is a connection to the deployment's NATS server, closed by Stop.
func (d *Deployment) NATS() *nats.Conn { return d.r.nc }

// Ledgerlab is the ledgerlab binary the deployment found beside the
// ingest and the projector (it runs the nats-server).
func (d *Deployment) Ledgerlab() string { return d.r.bin.ledgerlab }

// IngestAdmin is the ingest's admin address, host:port: its /metrics.
func (d *Deployment) IngestAdmin() string { return d.ingestAdmin }

// Dir is where the processes' logs are (under procs/).
func (d *Deployment) Dir() string { return d.r.dir }

// Processes lists the running service processes: the nats-server, the
// ingest and the projector (unless NoProjector). PostgreSQL's are not among
// them: its postmaster is the parent of any backend's pg_backend_pid().
func (d *Deployment) Processes() ([]DeployedProcess, error) {
	var out []DeployedProcess
	procs := []struct {
		name string
		p    *proc
	}{{"nats-server", d.r.nodes[0]}, {"ingest", d.r.ingests[0]}}
	if d.r.proj != nil {
		procs = append(procs, struct {
			name string
			p    *proc
		}{"projector", d.r.proj})
	}
	for _, x := range procs {
		pid, ok := x.p.pid()
		if !ok {
			return nil, fmt.Errorf("deployment: %s is not running (see %s)", x.name, x.p.logPath)
		}
		out = append(out, DeployedProcess{Name: x.name, PID: pid})
	}
	return out, nil
}

// Exits counts the service processes that exited while they should have
// been running.
func (d *Deployment) Exits() int { return d.r.exitCount() }

// Stop stops every process, the ingest and the projector gracefully
// (SIGTERM, so that a -cpuprofile is written), and removes the directory
// unless DeploymentOptions.Dir named it or keepLogs is set.
func (d *Deployment) Stop(keepLogs bool) {
	d.r.teardown()
	if d.r.runLog != nil {
		_ = d.r.runLog.Close()
	}
	if d.temp && !keepLogs {
		_ = os.RemoveAll(d.r.dir)
	}
}

// serviceUsers migrates the database at dbURL as its owner and makes the
// LOGIN users ingestUser, in ledger_ingest, and projectorUser, in
// ledger_projector (urlAs connects as them).
func serviceUsers(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("deployment: connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		return fmt.Errorf("deployment: migrate as the owner: %w", err)
	}
	for user, group := range map[string]string{ingestUser: "ledger_ingest", projectorUser: "ledger_projector"} {
		for _, q := range []string{"CREATE ROLE " + user + " LOGIN IN ROLE " + group,
			"DO $$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %I TO " + user + "', current_database()); END $$"} {
			if _, err := pool.Exec(ctx, q); err != nil {
				return fmt.Errorf("deployment: the %s user: %w", group, err)
			}
		}
	}
	return nil
}

// urlAs is dbURL with user as its user (and no password).
func urlAs(dbURL, user string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("deployment: the database URL: %w", err)
	}
	u.User = url.User(user)
	return u.String(), nil
}

// The users of DeploymentOptions.Roles.
const (
	ingestUser    = "ledger_deploy_ingest"
	projectorUser = "ledger_deploy_projector"
)

// connectedAs fails unless a session of user is connected: a run that says
// it measured the services as their users but did not is void.
func connectedAs(ctx context.Context, pool *pgxpool.Pool, user string) error {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, user).Scan(&n); err != nil {
		return fmt.Errorf("deployment: who the services connect as: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("deployment: no session of %s is connected", user)
	}
	return nil
}
