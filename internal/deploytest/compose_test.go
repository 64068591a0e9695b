package deploytest

import (
	"net"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/stretchr/testify/require"
)

// The services of docker-compose.yml and the container ports each publishes.
var composePorts = map[string][]string{
	"postgres":    {"5432"},
	"nats":        {"4222", "8222"},
	"ingest":      {"9090"},
	"projector":   {"9091"},
	"demo-worker": nil,
}

func TestComposeDefinesTheWholeStack(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	for name, ports := range composePorts {
		s, ok := c.Services[name]
		require.Truef(t, ok, "docker-compose.yml has no service %q", name)
		require.Truef(t, s.Image != "" || s.Build != nil, "service %s has neither image nor build", name)
		for _, p := range ports {
			require.Containsf(t, s.containerPorts(), p, "service %s does not publish port %s", name, p)
		}
		for _, v := range s.Volumes {
			if src, _, ok := strings.Cut(v, ":"); ok && !strings.ContainsAny(src, "./") {
				require.Containsf(t, c.Volumes, src, "service %s mounts volume %q, which is not declared", name, src)
			}
		}
	}
	require.Equal(t, "no", c.Services["demo-worker"].Restart, "the demo worker runs once")
}

func TestComposeNATSHasJetStreamAndMonitoring(t *testing.T) {
	t.Parallel()
	nats := loadCompose(t).Services["nats"]
	cmd := nats.Command
	require.Truef(t, slices.Contains(cmd, "-js") || slices.Contains(cmd, "--jetstream"), "nats command %q does not enable JetStream", cmd)
	mon, ok := flagValue(cmd, "m")
	if !ok {
		mon, ok = flagValue(cmd, "http_port")
	}
	require.Truef(t, ok, "nats command %q does not enable monitoring", cmd)
	require.Equal(t, "8222", mon, "monitoring port")
	store, ok := flagValue(cmd, "sd")
	require.Truef(t, ok, "nats command %q sets no JetStream store directory (-sd)", cmd)
	require.Truef(t, slices.ContainsFunc(nats.Volumes, func(v string) bool { return strings.HasSuffix(v, ":"+store) }),
		"the JetStream store %s is not on a volume, so streams are lost with the container", store)

	// The healthcheck runs wget inside the container: only the alpine images
	// have it. A pinned tag must be 2.11 or later.
	m := regexp.MustCompile(`^nats:2(?:\.(\d+))?(?:\.\d+)?-alpine[\w.]*$`).FindStringSubmatch(nats.Image)
	require.NotNilf(t, m, "nats image %q: want nats:2-alpine or a pinned nats:2.x-alpine tag", nats.Image)
	if m[1] != "" {
		minor, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		require.GreaterOrEqual(t, minor, 11, "nats image %q is older than 2.11", nats.Image)
	}
}

func TestComposeHealthchecksProbeReadiness(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	health := func(name string) string {
		s := c.Services[name]
		require.NotNilf(t, s.Healthcheck, "service %s has no healthcheck", name)
		require.NotEmptyf(t, s.Healthcheck.Test, "service %s has an empty healthcheck", name)
		return strings.Join(s.Healthcheck.Test, " ")
	}
	require.Contains(t, health("postgres"), "pg_isready")
	require.Contains(t, health("nats"), "http://127.0.0.1:8222/healthz?js-enabled-only=true")

	// The services' healthchecks ask the admin endpoint the command
	// configures, on the port the service publishes.
	for _, name := range []string{"ingest", "projector"} {
		s := c.Services[name]
		addr, ok := flagValue(s.Command, "admin-addr")
		require.Truef(t, ok, "service %s: set -admin-addr in its command, so the healthcheck's port is explicit", name)
		port := portOf(addr)
		require.NotEmptyf(t, port, "service %s: -admin-addr %q has no port", name, addr)
		// The binaries listen on loopback by default, which a published port
		// does not reach: the command must widen it, and say so.
		host, _, _ := net.SplitHostPort(addr)
		require.Equalf(t, "0.0.0.0", host, "service %s: -admin-addr %q must bind 0.0.0.0 explicitly, or its published port reaches nothing", name, addr)
		require.Containsf(t, health(name), "http://127.0.0.1:"+port+"/readyz", "service %s healthcheck", name)
		require.Containsf(t, s.containerPorts(), port, "service %s does not publish its admin port", name)
	}
}

func TestComposeStartsServicesInOrder(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	want := map[string][]string{
		"ingest":      {"postgres", "nats"},
		"projector":   {"postgres", "nats", "ingest"},
		"demo-worker": {"ingest", "projector"},
	}
	for name, deps := range want {
		for _, dep := range deps {
			d, ok := c.Services[name].DependsOn[dep]
			require.Truef(t, ok, "service %s does not depend on %s", name, dep)
			require.Equalf(t, "service_healthy", d.Condition, "service %s waits for %s", name, dep)
		}
	}
	// A service_healthy condition on a service without a healthcheck never
	// holds, and compose refuses to start.
	for name, s := range c.Services {
		for dep, d := range s.DependsOn {
			if d.Condition == "service_healthy" {
				require.NotNilf(t, c.Services[dep].Healthcheck, "service %s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
	}
}

// ledgerServices are the compose services that run the ledger's image.
func ledgerServices(c composeFile) map[string]composeService {
	m := map[string]composeService{}
	for name, s := range c.Services {
		if s.Build != nil {
			m[name] = s
		}
	}
	return m
}

func TestComposeRunsBinariesTheImageBuilds(t *testing.T) {
	t.Parallel()
	c, d := loadCompose(t), loadDockerfile(t)
	require.NotEmpty(t, d.Built, "the Dockerfile has no go build of ./cmd/... packages")
	for _, name := range d.Built {
		require.Containsf(t, d.Copied, "/usr/local/bin/"+name, "the Dockerfile builds %s but does not copy it into the final image", name)
	}
	require.Len(t, d.Entrypoint, 1)
	require.Contains(t, d.Copied, d.Entrypoint[0], "the image's default entrypoint is not a binary it contains")
	require.Equal(t, "/usr/local/bin/ingest", d.Entrypoint[0])

	services := ledgerServices(c)
	require.Len(t, services, 3, "ingest, projector and demo-worker are built from the Dockerfile")
	usesCurl := false
	for name, s := range services {
		require.Equalf(t, ".", s.buildContext(), "service %s: the Dockerfile is at the repository root", name)
		require.NotEmptyf(t, s.Entrypoint, "service %s: set entrypoint to the binary it runs", name)
		require.Containsf(t, d.Copied, s.Entrypoint[0], "service %s runs %s, which the image does not contain", name, s.Entrypoint[0])
		require.Containsf(t, d.Built, path.Base(s.Entrypoint[0]), "service %s runs %s, which the Dockerfile does not build", name, s.Entrypoint[0])
		if s.Healthcheck != nil && slices.Contains(s.Healthcheck.Test, "curl") {
			usesCurl = true
		}
	}
	if usesCurl {
		require.Truef(t, slices.ContainsFunc(d.Runs, func(r string) bool { return regexp.MustCompile(`install .*\bcurl\b`).MatchString(r) }),
			"the healthchecks run curl, which the final image does not install")
	}
}

func TestDockerfileBuildsStaticBinariesForANonRootUser(t *testing.T) {
	t.Parallel()
	d := loadDockerfile(t)
	require.GreaterOrEqual(t, len(d.Stages), 2, "a multi-stage build: builder and runtime")
	require.Contains(t, d.BuildLine, "CGO_ENABLED=0", "static binaries: the runtime image has no toolchain")
	require.Contains(t, d.BuildLine, "-trimpath")
	require.Contains(t, d.BuildLine, "--mount=type=cache", "module and build caches in cache mounts")
	require.NotContains(t, []string{"", "root", "0", "0:0"}, d.User, "the final stage runs as a non-root user")
	require.Subset(t, d.Expose, []string{"9090", "9091"})

	// The builder's Go is the one go.mod asks for.
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readRepoFile(t, "go.mod"))
	require.NotNil(t, goVersion, "go.mod has no go directive")
	builder := d.Stages[0].Image
	require.Truef(t, strings.HasPrefix(builder, "golang:"+goVersion[1]), "builder %s does not match go.mod's go %s", builder, goVersion[1])
}

// TestDockerignoreKeepsTheModule checks that .dockerignore leaves out what
// is large or irrelevant (the repository has test binaries of tens of MB at
// its root) and keeps everything the build needs.
func TestDockerignoreKeepsTheModule(t *testing.T) {
	t.Parallel()
	var patterns []string
	for _, l := range strings.Split(readRepoFile(t, ".dockerignore"), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	require.Contains(t, patterns, ".git")
	require.Contains(t, patterns, "**/*.test")

	excluded := func(p string) bool {
		for _, pat := range patterns {
			if strings.HasPrefix(pat, "!") {
				continue
			}
			pat = strings.TrimSuffix(strings.TrimPrefix(pat, "/"), "/")
			for _, cand := range []string{p, path.Base(p)} {
				if ok, _ := filepath.Match(strings.TrimPrefix(pat, "**/"), cand); ok {
					return true
				}
			}
		}
		return false
	}
	for _, need := range []string{"go.mod", "go.sum", "cmd", "internal", "pkg", "migrations", "streams",
		"cmd/ingest/main.go", "migrations/00001_ledger.sql", "streams/ledger_in.json"} {
		require.Falsef(t, excluded(need), ".dockerignore excludes %s, which the build needs", need)
	}
	require.True(t, excluded("fence.test"))
}

// TestComposeFlagsAndVariablesExist runs each ledger service's binary with
// -h (built the way the Dockerfile builds it; for a subcommand, both its -h
// and the binary's) and checks that every flag in the service's command and
// every variable in its environment is one the binary documents.
func TestComposeFlagsAndVariablesExist(t *testing.T) {
	t.Parallel()
	for name, s := range ledgerServices(loadCompose(t)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.NotEmpty(t, s.Entrypoint)
			bin := buildBinary(t, path.Base(s.Entrypoint[0]))
			sub := subcommand(s.Command)
			help := helpText(t, bin, sub...)
			all := help
			if len(sub) > 0 {
				// A subcommand's help may only name the global flags (and the
				// variables behind them) that the top-level help describes.
				all += helpText(t, bin)
			}
			what := strings.TrimSpace(path.Base(s.Entrypoint[0]) + " " + strings.Join(sub, " "))
			for _, f := range flags(s.Command) {
				require.Truef(t, helpHasFlag(all, f), "service %s passes -%s, which `%s -h` does not list:\n%s", name, f, what, help)
			}
			for v := range s.Environment {
				require.Truef(t, helpHasWord(all, v), "service %s sets %s, which `%s -h` does not mention:\n%s", name, v, what, help)
			}
		})
	}
}

// TestServicesServeAdminOnLoopbackByDefault reads the -admin-addr default
// the real binaries print: other hosts must not reach /metrics and /readyz
// unless the operator asks for it.
func TestServicesServeAdminOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	for name, port := range map[string]string{"ingest": "9090", "projector": "9091"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			help := helpText(t, buildBinary(t, name))
			m := regexp.MustCompile(`(?m)^\s*-admin-addr string\n[^\n]*\(default "([^"]*)"\)`).FindStringSubmatch(help)
			require.NotNilf(t, m, "`%s -h` shows no default for -admin-addr:\n%s", name, help)
			host, p, err := net.SplitHostPort(m[1])
			require.NoError(t, err)
			require.Equal(t, port, p)
			ip := net.ParseIP(host)
			require.Truef(t, ip != nil && ip.IsLoopback(), "%s serves its admin endpoints on %q by default", name, m[1])
		})
	}
}

// The contract's page, the codec's ContractVersion and the SDK's release
// tags (docs/sdk.md) name one version.
func TestContractVersionIsOneNumber(t *testing.T) {
	t.Parallel()
	v := strconv.Itoa(wire.ContractVersion)
	require.Contains(t, strings.SplitN(readRepoFile(t, "docs/contract.md"), "\n", 2)[0], "(v"+v+")")
	sdk := readRepoFile(t, "docs/sdk.md")
	require.Contains(t, sdk, "contract](contract.md) v"+v+" (`wire.ContractVersion`)")
	require.Contains(t, sdk, "`pkg/worker/v0."+v+".N`")
}
