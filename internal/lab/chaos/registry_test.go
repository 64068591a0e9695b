package chaos

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The fault table of docs/internals/chaos.md is the registry's: a row per
// entry of Faults with its flag and default, and no row for a fault the
// run does not know. Switch: delete the pg_cut row from the table.
func TestEveryFaultIsInTheDocs(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/internals/chaos.md")
	require.NoError(t, err)
	rows := map[string]string{}
	inTable := false
	for line := range strings.Lines(string(doc)) {
		switch {
		case strings.HasPrefix(line, "| fault |"):
			inTable = true
		case inTable && !strings.HasPrefix(line, "|"):
			inTable = false
		case inTable && strings.HasPrefix(line, "| `"):
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			rows[name] = line
		}
	}
	for _, f := range Faults {
		row, ok := rows[f.Name]
		require.True(t, ok, "docs/internals/chaos.md has no row for the fault %s", f.Name)
		delete(rows, f.Name)
		switch {
		case f.Flag == "":
			require.Contains(t, row, "same flag", f.Name)
		case f.Default == Off:
			require.Contains(t, row, "`-"+f.Flag+"` (off by default)", f.Name)
		default:
			require.Contains(t, row, "`-"+f.Flag+" "+f.Default.String()+"`", f.Name)
		}
	}
	require.Empty(t, rows, "rows of faults that are not in Faults")
}
