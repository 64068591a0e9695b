package ctl

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/natsauth"
)

var authCommands = map[string]Command{
	"static": {AuthStatic, "-out DIR [-worker P]... [-reader R]... [-inboxes [-inbox-max-bytes N]]",
		"write an nkey seed per user and the NATS server's authorization (auth.conf)"},
	"jwt": {AuthJWT, "-out DIR [-worker P]... [-reader R]... [-inboxes [-inbox-max-bytes N]]",
		"write operator mode: keys, account JWTs, credentials and the server's resolver.conf"},
	"jwt-user": {AuthJWTUser, "-out DIR -role ROLE -name NAME",
		"mint credentials for one more user with its role's scoped signing key"},
}

// Auth dispatches the "auth" subcommands, which generate the NATS
// authorization of an authenticated deployment (contract §9,
// docs/security.md).
func Auth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "ledgerctl auth", authCommands, args, stdout, stderr)
}

// authSetup registers the flags shared by static and jwt and returns a
// function that reads them into a setup after Parse.
func authSetup(f *Flags) func() (natsauth.Setup, error) {
	out := f.String("out", "", "directory for the keys and files; created 0700, existing keys in it are kept (required)")
	var workers, readers listFlag
	f.Var(&workers, "worker", "a worker principal, given once per principal (its NATS user; the holder's first part)")
	f.Var(&readers, "reader", "a read side, given once per reader: an account of its own that may only get and follow projections")
	memMB := f.Int64("max-mem-mb", natsauth.MaxMemDefault>>20, "JetStream memory storage of each account that holds streams, MiB")
	fileGB := f.Int64("max-file-gb", natsauth.MaxFileDefault>>30, "JetStream file storage of the committed log's account (LEDGER_COMMITTED), GiB")
	inboxes := f.Bool("inboxes", false, "give every -worker principal an inbox stream of its own, LEDGER_IN_<principal>, as 'ledgerctl streams apply -principals' makes them")
	inboxMax := f.Int64("inbox-max-bytes", 0, "with -inboxes: the -inbox-max-bytes given to 'ledgerctl streams apply', room reserved per principal; 0 is its default (256 MiB)")
	return func() (natsauth.Setup, error) {
		if f.NArg() > 0 {
			return natsauth.Setup{}, Usagef("unexpected argument %q", f.Arg(0))
		}
		if *out == "" {
			return natsauth.Setup{}, Usagef("-out is required")
		}
		if *memMB < 1 || *fileGB < 1 || *memMB > 1<<30 || *fileGB > 1<<20 {
			return natsauth.Setup{}, Usagef("-max-mem-mb and -max-file-gb must be positive")
		}
		for _, n := range append(append([]string(nil), workers...), readers...) {
			if !natsauth.ValidName(n) {
				return natsauth.Setup{}, Usagef("name %q: want 1..%d characters of [A-Za-z0-9_-]", n, natsauth.MaxNameLen)
			}
		}
		switch {
		case *inboxMax < 0 || *inboxMax > natsauth.MaxInboxMaxBytes:
			return natsauth.Setup{}, Usagef("-inbox-max-bytes must be 0..%d", int64(natsauth.MaxInboxMaxBytes))
		case *inboxMax != 0 && !*inboxes:
			return natsauth.Setup{}, Usagef("-inbox-max-bytes needs -inboxes")
		}
		l, err := natsauth.NewLayout(f.Prefix)
		if err != nil {
			return natsauth.Setup{}, Usagef("%v", err)
		}
		return natsauth.Setup{Dir: *out, Layout: l, Workers: workers, Readers: readers,
			Limits:  natsauth.Limits{MaxMem: *memMB << 20, MaxFile: *fileGB << 30},
			Inboxes: *inboxes, InboxMaxBytes: *inboxMax}, nil
	}
}

// AuthStatic writes the static configuration ("auth static").
func AuthStatic(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl auth static", "-out DIR [-worker P]... [-reader R]... [-inboxes [-inbox-max-bytes N]]",
		"Write one nkey seed per user (<user>.nk, 0600) and auth.conf, the accounts, users and\n"+
			"permissions of contract §9 for the NATS server to include. Users: ingest, projector,\n"+
			"ledgerctl (operators), one per worker principal, one per reader. Run it again with the\n"+
			"same -out to add users: existing seeds are kept.", stderr)
	setup := authSetup(f)
	if err := f.Parse(args); err != nil {
		return err
	}
	s, err := setup()
	if err != nil {
		return err
	}
	users, err := natsauth.Static(s)
	if err != nil {
		return err
	}
	if err := printAuthUsers(f, stdout, users, "NATS_NKEY"); err != nil || f.JSON {
		return err
	}
	fmt.Fprintf(stdout, "\nServer: include %q in its configuration, and restart or reload it.\n",
		filepath.Join(s.Dir, natsauth.StaticConfFile))
	fmt.Fprintf(stdout, "Clients: each connects with its seed file and its inbox prefix (NATS_NKEY, NATS_INBOX_PREFIX).\n")
	return nil
}

// AuthJWT writes operator mode ("auth jwt").
func AuthJWT(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl auth jwt", "-out DIR [-worker P]... [-reader R]... [-inboxes [-inbox-max-bytes N]]",
		"Write operator (JWT) mode: an operator, the ledger's accounts and one per worker principal\n"+
			"and per reader, a scoped signing key per role and account whose template holds the\n"+
			"role's permissions, credentials (<user>.creds, 0600) for each user that has none, and\n"+
			"resolver.conf for the server. Keys are in DIR/keys/ and are kept when run again; account\n"+
			"JWTs and resolver.conf are written afresh. A new principal needs a run and a reload.", stderr)
	setup := authSetup(f)
	if err := f.Parse(args); err != nil {
		return err
	}
	s, err := setup()
	if err != nil {
		return err
	}
	users, err := natsauth.JWT(s)
	if err != nil {
		return err
	}
	if err := printAuthUsers(f, stdout, users, "NATS_CREDS"); err != nil || f.JSON {
		return err
	}
	fmt.Fprintf(stdout, "\nServer: include %q in its configuration (see deploy/nats-jwt/), and restart or reload it.\n",
		filepath.Join(s.Dir, natsauth.ResolverConfFile))
	fmt.Fprintf(stdout, "Keep %s off the servers: its signing keys mint users.\n", filepath.Join(s.Dir, natsauth.KeysDir))
	fmt.Fprintf(stdout, "More credentials of a principal: ledgerctl auth jwt-user -out %s -role worker -name <principal>\n", s.Dir)
	return nil
}

// AuthJWTUser mints one user's credentials ("auth jwt-user").
func AuthJWTUser(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl auth jwt-user", "-out DIR -role ROLE -name NAME",
		"Mint credentials for one more user (DIR/<user>.creds, 0600) with the scoped signing key of\n"+
			"its role, in a directory 'ledgerctl auth jwt' wrote. The server needs no change: the\n"+
			"role's permissions are in its account's JWT. A worker's name is its principal and a\n"+
			"reader's its name: each must have been given to 'ledgerctl auth jwt', which writes\n"+
			"their accounts.", stderr)
	out := f.String("out", "", "directory 'ledgerctl auth jwt' wrote (required)")
	role := f.String("role", natsauth.RoleWorker, "worker, reader, ingest, projector or ledgerctl")
	name := f.String("name", "", "the worker's principal, the reader's name, or a name for a service's user (required)")
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case f.NArg() > 0:
		return Usagef("unexpected argument %q", f.Arg(0))
	case *out == "":
		return Usagef("-out is required")
	case *name == "":
		return Usagef("-name is required")
	case !natsauth.ValidName(*name):
		return Usagef("-name %q: want 1..%d characters of [A-Za-z0-9_-]", *name, natsauth.MaxNameLen)
	}
	u, err := natsauth.MintUser(*out, *role, *name)
	if err != nil {
		return err
	}
	return printAuthUsers(f, stdout, []natsauth.User{u}, "NATS_CREDS")
}

// authUserRow is one user in the output of the auth commands.
type authUserRow struct {
	Role        string `json:"role"`
	Name        string `json:"name"`
	Account     string `json:"account"`
	File        string `json:"file"`
	InboxPrefix string `json:"inbox_prefix"`
	New         bool   `json:"new"`
}

func printAuthUsers(f *Flags, stdout io.Writer, users []natsauth.User, fileVar string) error {
	if f.JSON {
		for _, u := range users {
			if err := writeJSON(stdout, authUserRow{u.Role, u.Name, u.Account, u.File, u.Inbox, u.New}); err != nil {
				return err
			}
		}
		return nil
	}
	t := newTable(stdout, "ROLE", "NAME", "ACCOUNT", fileVar, "NATS_INBOX_PREFIX", "")
	for _, u := range users {
		state := "kept"
		if u.New {
			state = "new"
		}
		t.row(u.Role, u.Name, u.Account, u.File, u.Inbox, state)
	}
	return t.flush()
}
