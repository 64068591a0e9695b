package ctl_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
)

// ledgerctl migrate, run three times at once through a stock PgBouncer in
// transaction mode, applies the schema once, and then finds it current.
func TestMigrateThroughTransactionPooler(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmpty(t)
	name := url[strings.LastIndexByte(url, '/')+1:]
	name, _, _ = strings.Cut(name, "?")
	pb := dbtest.StartPgBouncer(t, "transaction")
	via := pb.URL(t, name)
	var wg sync.WaitGroup
	results := make([]result, 3)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, "-database-url", via, "migrate")
		}()
	}
	wg.Wait()
	applied := 0
	for _, r := range results {
		r.ok(t)
		if strings.HasPrefix(r.stdout, "applied migrations") {
			applied++
		}
	}
	require.Equal(t, 1, applied, "one migrator applied, the others found the schema current")
	require.Contains(t, run(t, "-database-url", via, "migrate", "-check").ok(t).stdout, "schema current")
}
