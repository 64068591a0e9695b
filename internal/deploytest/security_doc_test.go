package deploytest

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSecurityGuideCoversEveryShippedExample keeps docs/security.md in step
// with what ships: every deployment example has a row saying what it
// prevents, and the migrations that set up PostgreSQL's privileges are named.
func TestSecurityGuideCoversEveryShippedExample(t *testing.T) {
	t.Parallel()
	guide := readRepoFile(t, "docs/security.md")
	entries, err := os.ReadDir(repoFile(t, "deploy"))
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	for _, e := range entries {
		want := "`deploy/" + e.Name() + "/"
		if e.Name() == "postgres" {
			want = "`deploy/postgres/roles.sql`"
		}
		require.Containsf(t, guide, want, "docs/security.md does not say what deploy/%s prevents", e.Name())
	}
	for _, want := range []string{"`docker-compose.yml`", "`make demo`", "`00002_roles.sql`", "`00004_connect.sql`", "(contract v2)"} {
		require.Contains(t, guide, want)
	}
}
