package deploytest

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOperationsGuideDocumentsEverySetting keeps docs/operations.md in step
// with the binaries: every environment variable and flag the services list in
// their -h output appears in the guide.
func TestOperationsGuideDocumentsEverySetting(t *testing.T) {
	t.Parallel()
	guide := readRepoFile(t, "docs/operations.md")
	envVar := regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)\)`)
	flagLine := regexp.MustCompile(`(?m)^\s*-([a-z][a-z0-9-]*)`)
	for _, name := range []string{"ingest", "projector"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			help := helpText(t, buildBinary(t, name))
			for _, m := range envVar.FindAllStringSubmatch(help, -1) {
				require.Truef(t, helpHasWord(guide, m[1]), "docs/operations.md does not mention %s (from `%s -h`)", m[1], name)
			}
			for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
				require.Containsf(t, guide, "`-"+m[1]+"`", "docs/operations.md does not mention %s's flag -%s", name, m[1])
			}
		})
	}
	for _, port := range []string{"9090", "9091", "4222", "8222", "6222", "5432"} {
		require.Contains(t, guide, "| "+port+" |", "the ports table lists %s", port)
	}
	for _, file := range []string{"deploy/nats/auth.conf", "deploy/nats-cluster/", "deploy/postgres/roles.sql", "00002_roles.sql"} {
		require.Contains(t, guide, file)
	}
}
