package ctl_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAuthStaticWritesASeedPerUserAndKeepsThem(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	r := run(t, "auth", "static", "-out", dir, "-worker", "reports", "-worker", "billing", "-reader", "dashboards", "-json").ok(t)
	rows := r.jsonLines(t)
	require.Len(t, rows, 6)
	names := map[string]string{}
	for _, row := range rows {
		assert.Equal(t, true, row["new"])
		names[row["role"].(string)+" "+row["name"].(string)] = row["inbox_prefix"].(string)
		_, err := os.Stat(row["file"].(string))
		require.NoError(t, err)
	}
	assert.Equal(t, map[string]string{"ingest ingest": "_INBOX_ingest", "projector projector": "_INBOX_projector",
		"ledgerctl ledgerctl": "_INBOX_ledgerctl", "worker billing": "_INBOX.billing", "worker reports": "_INBOX.reports",
		"reader dashboards": "_INBOX_dashboards"}, names)
	_, err := os.Stat(filepath.Join(dir, "auth.conf"))
	require.NoError(t, err)

	r = run(t, "auth", "static", "-out", dir, "-worker", "reports,billing", "-reader", "dashboards").ok(t)
	assert.NotContains(t, r.stdout, " new")
	assert.Contains(t, r.stdout, "kept")
	assert.Contains(t, r.stdout, `include "`+filepath.Join(dir, "auth.conf")+`"`)
}

func TestAuthJWTAndJWTUser(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := run(t, "auth", "jwt", "-out", dir, "-worker", "reports").ok(t)
	assert.Contains(t, r.stdout, filepath.Join(dir, "worker-reports.creds"))
	r = run(t, "auth", "jwt-user", "-out", dir, "-role", "worker", "-name", "reports", "-json").ok(t)
	rows := r.jsonLines(t)
	require.Len(t, rows, 1)
	assert.Equal(t, "LEDGER_WORKER_reports", rows[0]["account"])
	assert.Equal(t, filepath.Join(dir, "worker-reports.creds"), rows[0]["file"])
	// A new principal needs an account of its own: auth jwt, then a reload.
	r = run(t, "auth", "jwt-user", "-out", dir, "-role", "worker", "-name", "billing")
	assert.NotZero(t, r.code)
	assert.Contains(t, r.stderr, "-worker billing")
}

func TestAuthRefusesNamesThatAreNotOneSubjectToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"auth", "static", "-out", dir, "-worker", "reports.pod-1"},
		{"auth", "static", "-out", dir, "-reader", "*"},
		{"auth", "jwt", "-out", dir, "-worker", ">"},
		{"auth", "jwt-user", "-out", dir, "-name", "a.b"},
		{"auth", "static", "-worker", "reports"},
		{"auth", "jwt-user", "-out", dir},
		{"auth", "static", "-out", dir, "extra"},
		{"auth", "static", "-out", dir, "-prefix", "a.b"},
		{"auth", "nkeys"},
	} {
		r := run(t, args...)
		assert.Equalf(t, 2, r.code, "%v: stderr %s", args, r.stderr)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written")
	assert.Contains(t, run(t, "help").ok(t).stdout, "  auth static|jwt|jwt-user")
}
