package deploytest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
)

// loadNATSConf parses a server configuration file of deploy/.
func loadNATSConf(t testing.TB, rel string) *server.Options {
	t.Helper()
	o, err := server.ProcessConfigFile(repoFile(t, rel))
	require.NoErrorf(t, err, "%s", rel)
	return o
}

// TestShippedAuthConfIsTheGeneratorsOutput keeps deploy/nats/auth.conf, the
// example the cluster files include, what `ledgerctl auth static` writes
// for the command line in its header: the same accounts, users and
// permissions, with other public keys (their seeds were not kept).
func TestShippedAuthConfIsTheGeneratorsOutput(t *testing.T) {
	t.Parallel()
	shipped := readRepoFile(t, "deploy/nats/auth.conf")
	header := regexp.MustCompile(`(?m)^#   ledgerctl (auth static .*) -out DIR$`).FindStringSubmatch(shipped)
	require.NotNil(t, header, "deploy/nats/auth.conf names no `ledgerctl auth static` command line")
	dir := t.TempDir()
	args := append(regexp.MustCompile(`\s+`).Split(header[1], -1), "-out", dir)
	runLedgerctl(t, buildBinary(t, "ledgerctl"), nil, args...)
	generated, err := os.ReadFile(filepath.Join(dir, "auth.conf"))
	require.NoError(t, err)

	key := regexp.MustCompile(`\bU[A-Z2-7]{55}\b`)
	want := strings.Split(key.ReplaceAllString(string(generated), "U…"), "\n")
	got := strings.Split(key.ReplaceAllString(shipped, "U…"), "\n")
	for i := range max(len(want), len(got)) {
		w, g := lineAt(want, i), lineAt(got, i)
		require.Equalf(t, w, g, "deploy/nats/auth.conf line %d differs from the generator's output: regenerate it with the command in its header", i+1)
	}

	o := loadNATSConf(t, "deploy/nats/auth.conf")
	require.NotEmpty(t, o.Nkeys, "nkey users")
	require.Empty(t, o.Users, "no user/password users")
}

func lineAt(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "<end of file>"
}

// TestNATSClusterFiles checks deploy/nats-cluster: three nodes of one
// cluster, each routing to all three, with JetStream and the ledger's
// authorization.
func TestNATSClusterFiles(t *testing.T) {
	t.Parallel()
	var names []string
	for i := 1; i <= 3; i++ {
		o := loadNATSConf(t, fmt.Sprintf("deploy/nats-cluster/nats-%d.conf", i))
		names = append(names, o.ServerName)
		require.Equal(t, "ledger", o.Cluster.Name)
		require.True(t, o.JetStream, "JetStream enabled")
		require.NotEmpty(t, o.StoreDir)
		var routes []string
		for _, r := range o.Routes {
			routes = append(routes, r.Host)
		}
		slices.Sort(routes)
		require.Equal(t, []string{"nats-1:6222", "nats-2:6222", "nats-3:6222"}, routes, "every node routes to every node")
		require.NotEmpty(t, o.Nkeys, "the cluster includes the generated auth.conf")
		require.Equal(t, 8222, o.HTTPPort, "monitoring for healthz")
		require.Equal(t, 2*time.Minute, o.SyncInterval, "the sync policy docs/operations.md recommends for a cluster")
		require.False(t, o.SyncAlways)
		require.Equal(t, "127.0.0.1", o.HTTPHost, "monitoring has no authentication: this host only")
	}
	require.Equal(t, []string{"nats-1", "nats-2", "nats-3"}, names)
}

// TestJWTExampleRunsInOperatorMode checks deploy/nats-jwt/server.conf with
// the files `ledgerctl auth jwt` writes beside it: operator mode, the
// system account, JetStream, monitoring.
func TestJWTExampleRunsInOperatorMode(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	runLedgerctl(t, buildBinary(t, "ledgerctl"), nil, "auth", "jwt", "-out", filepath.Join(root, "auth"), "-worker", "reports")
	require.NoError(t, os.WriteFile(filepath.Join(root, "server.conf"), []byte(readRepoFile(t, "deploy/nats-jwt/server.conf")), 0o600))
	o, err := server.ProcessConfigFile(filepath.Join(root, "server.conf"))
	require.NoError(t, err)
	require.Len(t, o.TrustedOperators, 1)
	require.NotEmpty(t, o.SystemAccount)
	require.NotNil(t, o.AccountResolver, "the MEMORY resolver")
	require.True(t, o.JetStream)
	require.Equal(t, 8222, o.HTTPPort)
	require.True(t, o.SyncAlways, "one node syncs every write (docs/operations.md, \"The sync policy\")")
	require.Equal(t, "127.0.0.1", o.HTTPHost, "monitoring has no authentication: this host only")
	for _, f := range []string{"auth/resolver.conf", "auth/ingest.creds", "auth/worker-reports.creds", "auth/keys/signing-worker-reports.nk"} {
		_, err := os.Stat(filepath.Join(root, f))
		require.NoError(t, err)
	}
	readme := readRepoFile(t, "deploy/nats-jwt/README.md")
	require.Contains(t, readme, "ledgerctl auth jwt ")
	require.Contains(t, readme, "ledgerctl auth jwt-user ")
}
