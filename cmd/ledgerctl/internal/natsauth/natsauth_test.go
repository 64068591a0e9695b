package natsauth

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"
)

func layout(t *testing.T) Layout {
	t.Helper()
	l, err := NewLayout("")
	require.NoError(t, err)
	return l
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

func requireMode(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equalf(t, mode, st.Mode().Perm(), "mode of %s", path)
}

// Contract §9, spelled out: the worker permissions are exactly these
// subjects, so a change to them is a change to the contract.
func TestWorkerPermissionsAreTheContracts(t *testing.T) {
	t.Parallel()
	p, err := layout(t).Permissions(RoleWorker, "reports")
	require.NoError(t, err)
	require.Equal(t, []string{"ledger.in.reports.>", "ledger.lease.*.reports.*", "ledger.lease.get", "ledger.task.head"}, p.Publish)
	require.Equal(t, []string{"ledger.receipt.reports.>", "_INBOX.reports.>"}, p.Subscribe)
	require.False(t, p.Responses)
}

// A ledger with another subject prefix gets its own subjects everywhere;
// stream and bucket names are the contract's whatever the prefix.
func TestPrefixChangesEverySubject(t *testing.T) {
	t.Parallel()
	l, err := NewLayout("acme")
	require.NoError(t, err)
	dir := t.TempDir()
	_, err = Static(Setup{Dir: dir, Layout: l, Workers: []string{"reports"}, Readers: []string{"dash"}})
	require.NoError(t, err)
	conf := readFile(t, filepath.Join(dir, StaticConfFile))
	require.Contains(t, conf, `"acme.in.reports.>"`)
	require.Contains(t, conf, `{ service: "acme.in.>", accounts: ["LEDGER_OPERATORS", "LEDGER_WORKER_reports"] }`)
	require.Contains(t, conf, `{ service: { account: "LEDGER", subject: "acme.in.reports.>" } }`)
	require.Contains(t, conf, "ledgerctl auth static -prefix acme -worker reports -reader dash -out DIR")
	require.NotRegexp(t, `"ledger\.`, conf)
	require.Contains(t, conf, `"$JS.API.DIRECT.GET.KV_ledger_tasks.>"`)
	_, err = NewLayout("a.b")
	require.Error(t, err)
}

// Nobody but a worker's own principal reads its inbox: no role may
// subscribe to _INBOX.> or to another role's inbox.
func TestNoRoleSubscribesToAnotherInbox(t *testing.T) {
	t.Parallel()
	l := layout(t)
	for _, role := range []string{RoleIngest, RoleProjector, RoleLedgerctl, RoleWorker, RoleReader} {
		p, err := l.Permissions(role, "x")
		require.NoError(t, err)
		for _, s := range p.Subscribe {
			if strings.HasPrefix(s, "_INBOX") || s == ">" {
				require.Equalf(t, InboxPrefix(role, "x")+".>", s, "role %s subscribes to %s", role, s)
			}
		}
	}
}

// A name is spliced into subjects (by the server itself, in operator mode),
// so one that is more than a subject token would widen a user's rights.
func TestNamesThatWouldWidenPermissionsAreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := JWT(Setup{Dir: dir, Layout: layout(t), Workers: []string{"ok"}})
	require.NoError(t, err)
	for _, name := range []string{"reports.pod-1", "*", ">", "", "a b", strings.Repeat("x", MaxNameLen+1), "{{name()}}"} {
		require.Falsef(t, ValidName(name), "%q", name)
		_, err := Static(Setup{Dir: t.TempDir(), Layout: layout(t), Workers: []string{name}})
		require.Errorf(t, err, "static worker %q", name)
		_, err = Static(Setup{Dir: t.TempDir(), Layout: layout(t), Readers: []string{name}})
		require.Errorf(t, err, "static reader %q", name)
		_, err = MintUser(dir, RoleWorker, name)
		require.Errorf(t, err, "minted worker %q", name)
	}
	require.True(t, ValidName(strings.Repeat("x", MaxNameLen)))
}

// Running static again, to add a worker, keeps every key: the servers and
// clients already running with them go on working.
func TestStaticKeepsKeysWhenRunAgain(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	us, err := Static(Setup{Dir: dir, Layout: layout(t), Workers: []string{"reports"}, Readers: []string{"dash"}})
	require.NoError(t, err)
	require.Len(t, us, 5)
	requireMode(t, dir, 0o700)
	requireMode(t, filepath.Join(dir, StaticConfFile), 0o644)
	seeds := map[string]string{}
	for _, u := range us {
		require.True(t, u.New)
		requireMode(t, u.File, 0o600)
		seeds[u.File] = readFile(t, u.File)
	}

	us, err = Static(Setup{Dir: dir, Layout: layout(t), Workers: []string{"billing", "reports", "reports"}, Readers: []string{"dash"}})
	require.NoError(t, err)
	require.Len(t, us, 6, "billing added, reports once")
	conf := readFile(t, filepath.Join(dir, StaticConfFile))
	for _, u := range us {
		kp, err := parseSeed([]byte(readFile(t, u.File)), nkeys.PrefixByteUser)
		require.NoError(t, err)
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		require.Contains(t, conf, "nkey: "+pub, "%s %s", u.Role, u.Name)
		if old, ok := seeds[u.File]; ok {
			require.False(t, u.New)
			require.Equal(t, old, readFile(t, u.File), "the seed of %s %s changed", u.Role, u.Name)
		} else {
			require.True(t, u.New)
		}
	}

	o, err := server.ProcessConfigFile(filepath.Join(dir, StaticConfFile))
	require.NoError(t, err)
	require.Len(t, o.Nkeys, 6)
	var accounts []string
	for _, a := range o.Accounts {
		accounts = append(accounts, a.Name)
	}
	slices.Sort(accounts)
	require.Equal(t, []string{AccountLedger, AccountLog, AccountIngest, AccountOperators, AccountProjections,
		AccountProjector, AccountReaderPrefix + "dash", WorkerAccount("billing"), WorkerAccount("reports")}, accounts)
}

// A seed file of the wrong kind is an error, never silently a new key.
func TestStaticRefusesASeedOfAnotherKind(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	acc, err := nkeys.CreateAccount()
	require.NoError(t, err)
	seed, err := acc.Seed()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ingest.nk"), seed, 0o600))
	_, err = Static(Setup{Dir: dir, Layout: layout(t)})
	require.ErrorContains(t, err, "a seed of a account key, not of a user key")
}

// A seed others may read is refused, in both modes, with what to do;
// never quietly reused.
func TestASeedOthersMayReadIsRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"static", "jwt"} {
		dir := filepath.Join(t.TempDir(), "auth")
		run := func() error {
			if mode == "static" {
				_, err := Static(Setup{Dir: dir, Layout: layout(t), Workers: []string{"reports"}})
				return err
			}
			_, err := JWT(Setup{Dir: dir, Layout: layout(t), Workers: []string{"reports"}})
			return err
		}
		require.NoError(t, run(), mode)
		seeds, err := filepath.Glob(filepath.Join(dir, "*.nk"))
		require.NoError(t, err)
		more, err := filepath.Glob(filepath.Join(dir, "*", "*.nk"))
		require.NoError(t, err)
		seeds = append(seeds, more...)
		require.NotEmpty(t, seeds, mode)
		for _, seed := range seeds {
			require.NoError(t, os.Chmod(seed, 0o644))
			err := run()
			require.ErrorContains(t, err, "has mode 0644: others may read it", "%s %s", mode, seed)
			require.ErrorContains(t, err, seed)
			require.NoError(t, os.Chmod(seed, 0o600))
		}
		require.NoError(t, run(), mode)
	}
}

// Operator mode: users carry a name and nothing else, signed by their
// role's scoped key; run again, it keeps every key and credential.
func TestJWTSignsUsersWithScopedRoleKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	us, err := JWT(Setup{Dir: dir, Layout: layout(t), Workers: []string{"reports"}, Readers: []string{"dash"}})
	require.NoError(t, err)
	requireMode(t, filepath.Join(dir, KeysDir, "operator.nk"), 0o600)
	requireMode(t, filepath.Join(dir, ResolverConfFile), 0o644)

	accounts := map[string]*jwt.AccountClaims{}
	for _, name := range []string{AccountSystem, AccountLedger, AccountLog, AccountProjections, AccountIngest,
		AccountProjector, AccountOperators, WorkerAccount("reports"), ReaderAccount("dash")} {
		ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(readFile(t, filepath.Join(dir, KeysDir, "account-"+name+".jwt"))))
		require.NoError(t, err, name)
		accounts[name] = ac
	}
	require.EqualValues(t, MaxFileDefault, accounts[AccountLog].Limits.JetStreamLimits.DiskStorage)
	for _, name := range []string{AccountIngest, AccountProjector, AccountOperators, WorkerAccount("reports")} {
		require.Zero(t, accounts[name].Limits.JetStreamLimits.DiskStorage, "%s has no JetStream of its own", name)
		require.NotEmpty(t, accounts[name].SigningKeys, name)
	}
	for _, name := range []string{AccountLedger, AccountLog, AccountProjections} {
		require.Empty(t, accounts[name].SigningKeys, "%s has no users", name)
	}
	for _, u := range us {
		requireMode(t, u.File, 0o600)
		tok, err := jwt.ParseDecoratedJWT([]byte(readFile(t, u.File)))
		require.NoError(t, err)
		uc, err := jwt.DecodeUserClaims(tok)
		require.NoError(t, err)
		require.Equal(t, u.Name, uc.Name)
		ac := accounts[u.Account]
		require.Equal(t, ac.Subject, uc.IssuerAccount)
		require.True(t, uc.HasEmptyPermissions(), "%s: the permissions are the role's template", u.Name)
		scope, ok := ac.SigningKeys.GetScope(uc.Issuer)
		require.True(t, ok, "%s is signed by a key of its account", u.Name)
		require.Equal(t, u.Role, scope.(*jwt.UserScope).Role)
	}
	worker := accounts[WorkerAccount("reports")]
	for _, k := range worker.SigningKeys.Keys() {
		scope, _ := worker.SigningKeys.GetScope(k)
		require.Contains(t, scope.(*jwt.UserScope).Template.Pub.Allow, "ledger.in.reports.>")
	}

	before := readFile(t, filepath.Join(dir, KeysDir, "signing-worker-reports.nk"))
	creds := readFile(t, filepath.Join(dir, "worker-reports.creds"))
	us, err = JWT(Setup{Dir: dir, Layout: layout(t), Workers: []string{"reports"}, Readers: []string{"dash"}})
	require.NoError(t, err)
	for _, u := range us {
		require.False(t, u.New, "%s %s", u.Role, u.Name)
	}
	require.Equal(t, before, readFile(t, filepath.Join(dir, KeysDir, "signing-worker-reports.nk")))
	require.Equal(t, creds, readFile(t, filepath.Join(dir, "worker-reports.creds")))
	_, err = server.ProcessConfigFile(filepath.Join(dir, ResolverConfFile))
	require.NoError(t, err)
}

// jwt-user signs only with the key its account lists for the role: a key
// swapped in for it would mint users every server refuses.
func TestMintUserNeedsTheRolesScopedKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := JWT(Setup{Dir: dir, Layout: layout(t), Workers: []string{"billing"}})
	require.NoError(t, err)
	u, err := MintUser(dir, RoleWorker, "billing")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "worker-billing.creds"), u.File)
	require.Equal(t, WorkerAccount("billing"), u.Account)

	_, err = MintUser(dir, RoleReader, "nobody")
	require.ErrorContains(t, err, "no account for reader nobody")
	_, err = MintUser(dir, RoleWorker, "nobody")
	require.ErrorContains(t, err, "no account for worker nobody")
	_, err = MintUser(dir, "admin", "x")
	require.ErrorContains(t, err, `no role "admin"`)

	// The projector's key in the ingest's place: a key of another
	// account, whose users would get the projector's rights.
	projector := readFile(t, filepath.Join(dir, KeysDir, "signing-projector.nk"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, KeysDir, "signing-ingest.nk"), []byte(projector), 0o600))
	_, err = MintUser(dir, RoleIngest, "ingest-2")
	require.ErrorContains(t, err, "is not one of the account's")

	// The ingest's key in the worker's place.
	ingest := readFile(t, filepath.Join(dir, KeysDir, "signing-ingest.nk"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, KeysDir, "signing-worker-billing.nk"), []byte(ingest), 0o600))
	_, err = MintUser(dir, RoleWorker, "billing")
	require.ErrorContains(t, err, "is not one of the account's")

	other, err := nkeys.CreateAccount()
	require.NoError(t, err)
	seed, err := other.Seed()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, KeysDir, "signing-worker-billing.nk"), seed, 0o600))
	_, err = MintUser(dir, RoleWorker, "billing")
	require.ErrorContains(t, err, "is not one of the account's")
}

// The committed example's header is a command line that reproduces it;
// commandLine must keep writing it that way.
func TestHeaderNamesTheCommandLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := Static(Setup{Dir: dir, Layout: layout(t), Workers: []string{"b", "a"}, Readers: []string{"r"}})
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`(?m)^#   ledgerctl auth static -worker a -worker b -reader r -out DIR$`),
		readFile(t, filepath.Join(dir, StaticConfFile)))
}

// An answer lands in the requester's account, and a consumer delivers in
// its stream's: so no user shares an account with a stream, the projector's
// consumers are on streams apart from LEDGER_IN, LEDGER_DLQ and the
// receipts, and no service may update a stream (an update could make it
// republish). internal/deploytest's no_reply_aimed_into_the_ledger tries it
// on a server.
func TestNoUserSharesAnAccountWithAStream(t *testing.T) {
	t.Parallel()
	s, err := Setup{Dir: t.TempDir(), Layout: layout(t), Workers: []string{"reports"}, Readers: []string{"dash"}}.normalize()
	require.NoError(t, err)
	accs, err := s.accounts()
	require.NoError(t, err)
	owners := s.Layout.owners()
	for _, a := range accs {
		holds := a.JetStream != nil
		require.Equalf(t, holds, len(a.Roles) == 0, "%s: an account holds streams or users, never both", a.Name)
		for _, st := range owners {
			if st == a.Name {
				require.True(t, holds, "%s holds a stream but has no JetStream", a.Name)
			}
		}
	}
	require.NotEqual(t, owners["LEDGER_LOG"], owners["LEDGER_IN"])
	require.NotEqual(t, owners["KV_ledger_tasks"], owners["LEDGER_IN"])
	require.NotEqual(t, owners["KV_ledger_tasks"], owners["LEDGER_LOG"])
	for _, role := range []string{RoleIngest, RoleProjector} {
		p, err := s.Layout.Permissions(role, role)
		require.NoError(t, err)
		for _, subj := range p.Publish {
			require.NotContains(t, subj, "$JS.API.STREAM.UPDATE.", role)
		}
	}
}

// Credentials an account no longer issues (a worker's from the shared
// LEDGER_WORKERS account) are minted anew, never kept: the server would
// refuse them. Switch: keep every credentials file that exists.
func TestJWTRemintsCredentialsOfAnotherAccount(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := JWT(Setup{Dir: dir, Layout: layout(t), Workers: []string{"reports"}, Readers: []string{"dash"}})
	require.NoError(t, err)
	// The reader's credentials in the worker's place: issued by another
	// account, as an old worker's were.
	creds := filepath.Join(dir, "worker-reports.creds")
	require.NoError(t, os.WriteFile(creds, []byte(readFile(t, filepath.Join(dir, "reader-dash.creds"))), 0o600))
	us, err := JWT(Setup{Dir: dir, Layout: layout(t), Workers: []string{"reports"}, Readers: []string{"dash"}})
	require.NoError(t, err)
	for _, u := range us {
		require.Equalf(t, u.Name == "reports", u.New, "%s %s minted anew", u.Role, u.Name)
	}
	issuer, err := credsAccount(creds)
	require.NoError(t, err)
	ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(readFile(t, filepath.Join(dir, KeysDir, "account-"+WorkerAccount("reports")+".jwt"))))
	require.NoError(t, err)
	require.Equal(t, ac.Subject, issuer)
}

// With inboxes, every principal's inbox is named, beside LEDGER_IN, where
// LEDGER_IN is: the ingest consumes and acks each, the operators reach each
// through their imports, nobody gets a wildcard over the stream names, and
// the LEDGER account has room for each inbox's max_bytes. Without, nothing
// changes. internal/deploytest's operator-mode stack runs on it.
func TestInboxesAreNamedAndHaveRoom(t *testing.T) {
	t.Parallel()
	setup := func(inboxes bool) Setup {
		s, err := Setup{Dir: t.TempDir(), Layout: layout(t), Workers: []string{"reports", "billing"},
			Inboxes: inboxes}.normalize()
		require.NoError(t, err)
		return s
	}
	off, on := setup(false), setup(true)
	ingestOff, err := off.Layout.Permissions(RoleIngest, RoleIngest)
	require.NoError(t, err)
	ingestOn, err := on.Layout.Permissions(RoleIngest, RoleIngest)
	require.NoError(t, err)
	for _, subj := range ingestOff.Publish {
		require.Contains(t, ingestOn.Publish, subj, "inboxes take nothing of LEDGER_IN's away")
	}
	for _, inbox := range []string{"LEDGER_IN_reports", "LEDGER_IN_billing"} {
		for _, subj := range []string{"$JS.API.STREAM.CREATE.", "$JS.API.STREAM.INFO.", "$JS.API.DIRECT.GET.",
			"$JS.API.CONSUMER.NAMES.", "$JS.ACK."} {
			want := subj + inbox
			if subj == "$JS.ACK." {
				want += ".>"
			}
			require.Contains(t, ingestOn.Publish, want)
			require.NotContains(t, ingestOff.Publish, want)
		}
		require.Contains(t, ingestOn.Publish, "$JS.API.CONSUMER.CREATE."+inbox+".*.>")
		require.Equal(t, AccountLedger, on.Layout.ownerOf("$JS.API.CONSUMER.MSG.NEXT."+inbox+".ingest-0-1"))
		require.Contains(t, on.Layout.operatorImports(), Import{Subject: "$JS.API.STREAM.*." + inbox, From: AccountLedger, Service: true})
	}
	require.Contains(t, ingestOn.Publish, "$JS.API.STREAM.NAMES", "it lists the inboxes")
	for _, role := range []string{RoleIngest, RoleProjector} {
		p, err := on.Layout.Permissions(role, role)
		require.NoError(t, err)
		for _, subj := range p.Publish {
			require.NotRegexp(t, `\.(UPDATE|DELETE|PURGE)\.LEDGER_IN`, strings.Replace(subj, "CONSUMER.DELETE", "", 1), role)
			require.NotContains(t, subj, "LEDGER_IN_*", role)
			require.NotContains(t, subj, "LEDGER_IN*", role)
		}
	}

	ledger := func(s Setup) *Account {
		accs, err := s.accounts()
		require.NoError(t, err)
		i := slices.IndexFunc(accs, func(a *Account) bool { return a.Name == AccountLedger })
		return accs[i]
	}
	require.EqualValues(t, inboundFile, ledger(off).JetStream.MaxFile)
	require.EqualValues(t, inboundFile+2*(256<<20), ledger(on).JetStream.MaxFile, "256 MiB more per inbox by default")
	require.EqualValues(t, MaxStreamsDefault+2, ledger(on).JetStream.MaxStreams)
	big, err := Setup{Dir: t.TempDir(), Layout: layout(t), Workers: []string{"reports"}, Inboxes: true, InboxMaxBytes: 1 << 30}.normalize()
	require.NoError(t, err)
	require.EqualValues(t, inboundFile+1<<30, ledger(big).JetStream.MaxFile)

	_, err = Setup{Dir: t.TempDir(), Layout: layout(t), InboxMaxBytes: 1 << 30}.normalize()
	require.ErrorContains(t, err, "without inboxes")
	dir := t.TempDir()
	_, err = Static(Setup{Dir: dir, Layout: layout(t), Workers: []string{"a"}, Inboxes: true})
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`(?m)^#   ledgerctl auth static -worker a -inboxes -inbox-max-bytes 268435456 -out DIR$`),
		readFile(t, filepath.Join(dir, StaticConfFile)))
}
