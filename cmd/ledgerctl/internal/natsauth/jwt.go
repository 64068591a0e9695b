package natsauth

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Files of operator mode, under Setup.Dir.
const (
	// ResolverConfFile is the server configuration JWT writes: the
	// operator, the system account and every account JWT, preloaded into
	// the server's MEMORY resolver.
	ResolverConfFile = "resolver.conf"
	// KeysDir holds the operator's, the accounts' and the signing keys'
	// seeds and the account JWTs. Keep it off the servers: whoever has a
	// signing key mints users of its role.
	KeysDir = "keys"
	// OperatorName is the name in the operator JWT.
	OperatorName = "ledger"
)

// responseExpiry is how long the ingest may answer a request it received;
// the server's default for allow_responses.
const responseExpiry = 2 * time.Minute

// signingKeyFile is the base name of the scoped signing key of role; a
// worker principal's and a reader's is their own, as is their account.
func signingKeyFile(role, name string) string {
	if role == RoleWorker || role == RoleReader {
		return "signing-" + role + "-" + name
	}
	return "signing-" + role
}

// JWT writes operator (decentralised JWT) mode into s.Dir: an operator, a
// system account, the accounts of Setup.accounts (the log's with the
// JetStream limits of s.Limits), those with users each with a scoped
// signing key per role whose template holds the role's permissions, so
// that a user's JWT carries a name and nothing else; ResolverConfFile for
// the server; and credentials (<user>.creds, 0600) for every user that has
// none yet. Each worker principal has an account and a key of its own,
// whose template names the principal: a user it signs acts as that
// principal whatever its JWT's name. Keys already in s.Dir are reused;
// account JWTs and the server file are written afresh.
func JWT(s Setup) ([]User, error) {
	s, err := s.normalize()
	if err != nil {
		return nil, err
	}
	key := func(name string, kind nkeys.PrefixByte) (nkeys.KeyPair, string, error) {
		kp, _, err := seedFile(s.path(KeysDir+"/"+name+".nk"), kind)
		if err != nil {
			return nil, "", err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, "", fmt.Errorf("public key of %s: %w", name, err)
		}
		return kp, pub, nil
	}
	opKP, opPub, err := key("operator", nkeys.PrefixByteOperator)
	if err != nil {
		return nil, err
	}

	type account struct {
		name   string
		spec   *Account
		claims *jwt.AccountClaims
		roles  map[string]string // role → signing key file
	}
	specs, err := s.accounts()
	if err != nil {
		return nil, err
	}
	accounts := []*account{{name: AccountSystem, spec: &Account{Name: AccountSystem}}}
	for _, sp := range specs {
		accounts = append(accounts, &account{name: sp.Name, spec: sp})
	}
	pubs := map[string]string{}
	for _, a := range accounts {
		_, pub, err := key("account-"+a.name, nkeys.PrefixByteAccount)
		if err != nil {
			return nil, err
		}
		pubs[a.name] = pub
		a.claims = jwt.NewAccountClaims(pub)
		a.claims.Name = a.name
		a.roles = map[string]string{}
	}

	for _, a := range accounts {
		if l := a.spec.JetStream; l != nil {
			a.claims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: l.MaxMem,
				DiskStorage: l.MaxFile, Streams: l.MaxStreams, Consumer: l.MaxConsumers}
		}
		for _, e := range a.spec.Exports {
			a.claims.Exports.Add(jwtExport(e))
		}
		for _, i := range a.spec.Imports {
			a.claims.Imports.Add(jwtImport(i, pubs[i.From]))
		}
		for _, role := range a.spec.Roles {
			a.roles[role] = signingKeyFile(role, a.spec.UserName)
		}
		for role, file := range a.roles {
			_, skPub, err := key(file, nkeys.PrefixByteAccount)
			if err != nil {
				return nil, err
			}
			p, err := s.Layout.Permissions(role, a.spec.UserName)
			if err != nil {
				return nil, err
			}
			scope := jwt.NewUserScope()
			scope.Key, scope.Role = skPub, role
			scope.Description = "users of role " + role
			scope.Template.Permissions = jwtPermissions(p)
			a.claims.SigningKeys.AddScopedSigner(scope)
		}
	}

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = OperatorName
	oc.SystemAccount = pubs[AccountSystem]
	opJWT, err := oc.Encode(opKP)
	if err != nil {
		return nil, fmt.Errorf("sign the operator JWT: %w", err)
	}
	if err := writeFile(s.path(KeysDir+"/operator.jwt"), []byte(opJWT+"\n"), publicMode); err != nil {
		return nil, err
	}
	var w confWriter
	w.line("# Operator mode of the ledger (contract §9), written by")
	w.line("#   %s", commandLine("jwt", s))
	w.line("# Include it from the server's configuration (deploy/nats-jwt/server.conf).")
	w.line("# JWTs only: the keys that signed them are in %s/, which the server does", KeysDir)
	w.line("# not need. Users' credentials are <user>.creds; mint more with")
	w.line("# `ledgerctl auth jwt-user`. docs/security.md says what each permission refuses.")
	w.line("")
	w.line("operator: %s", opJWT)
	w.line("system_account: %s", pubs[AccountSystem])
	w.line("resolver: MEMORY")
	w.open("resolver_preload: {")
	for _, a := range accounts {
		tok, err := a.claims.Encode(opKP)
		if err != nil {
			return nil, fmt.Errorf("sign account %s: %w", a.name, err)
		}
		if err := writeFile(s.path(KeysDir+"/account-"+a.name+".jwt"), []byte(tok+"\n"), publicMode); err != nil {
			return nil, err
		}
		w.line("# %s", a.name)
		w.line("%s: %s", a.claims.Subject, quoted(tok))
	}
	w.close("}")
	if err := writeFile(s.path(ResolverConfFile), []byte(w.b.String()), publicMode); err != nil {
		return nil, err
	}

	us := s.users()
	for i := range us {
		us[i].File = s.path(userFile(us[i].Role, us[i].Name) + ".creds")
		// Credentials of an account that is no more (a worker's of the
		// shared LEDGER_WORKERS before each principal had its own) are
		// minted anew: the server would refuse them.
		if issuer, err := credsAccount(us[i].File); err == nil && issuer == pubs[us[i].Account] {
			continue
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("credentials of %s %s: %w", us[i].Role, us[i].Name, err)
		}
		if _, err := MintUser(s.Dir, us[i].Role, us[i].Name); err != nil {
			return nil, err
		}
		us[i].New = true
	}
	return us, nil
}

// credsAccount is the public key of the account that issued the user of a
// credentials file.
func credsAccount(path string) (string, error) {
	data, err := readSmall(path)
	if err != nil {
		return "", err
	}
	acc, err := issuerAccount(data)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return acc, nil
}

// issuerAccount decodes a credentials file's user JWT and returns the
// account that issued it: its IssuerAccount when a signing key signed it.
func issuerAccount(creds []byte) (string, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", err
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", err
	}
	return cmp.Or(uc.IssuerAccount, uc.Issuer), nil
}

func readerAccounts(readers []string) []string {
	out := make([]string, len(readers))
	for i, r := range readers {
		out[i] = ReaderAccount(r)
	}
	return out
}

func jwtExport(e Export) *jwt.Export {
	x := &jwt.Export{Subject: jwt.Subject(e.Subject), Type: jwt.Stream}
	if e.Service {
		x.Type, x.ResponseType = jwt.Service, jwt.ResponseTypeSingleton
		if e.StreamResponses {
			x.ResponseType = jwt.ResponseTypeStream
		}
	}
	return x
}

func jwtImport(i Import, from string) *jwt.Import {
	x := &jwt.Import{Subject: jwt.Subject(i.Subject), Account: from, Type: jwt.Stream}
	if i.Service {
		x.Type, x.Share = jwt.Service, i.Share
	}
	return x
}

func jwtPermissions(p Permissions) jwt.Permissions {
	var jp jwt.Permissions
	jp.Pub.Allow.Add(p.Publish...)
	jp.Sub.Allow.Add(p.Subscribe...)
	if p.Responses {
		jp.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: responseExpiry}
	}
	return jp
}

// MintUser writes credentials for one more user of role into dir, which
// JWT wrote: <user>.creds (0600), replacing any earlier file of that name
// (earlier credentials stay valid). The user's JWT is signed by the role's
// scoped signing key and carries only its name, so its permissions are the
// role's template: for a worker, contract §9 with name as the principal.
// It needs the role's signing key and its account's JWT, nothing else.
func MintUser(dir, role, name string) (User, error) {
	if !ValidName(name) {
		return User{}, fmt.Errorf("name %q: want 1..%d characters of [A-Za-z0-9_-]", name, MaxNameLen)
	}
	switch role {
	case RoleWorker, RoleReader, RoleIngest, RoleProjector, RoleLedgerctl:
	default:
		return User{}, fmt.Errorf("no role %q: want worker, reader, ingest, projector or ledgerctl", role)
	}
	s := Setup{Dir: dir}
	acc := accountOf(role, name)
	accJWT, err := readSmall(s.path(KeysDir + "/account-" + acc + ".jwt"))
	if errors.Is(err, fs.ErrNotExist) {
		if role == RoleWorker || role == RoleReader {
			return User{}, fmt.Errorf("no account for %s %s in %s: run `ledgerctl auth jwt` with -%s %s and reload the servers",
				role, name, dir, role, name)
		}
		return User{}, fmt.Errorf("no account %s in %s: run `ledgerctl auth jwt -out %s` first", acc, dir, dir)
	}
	if err != nil {
		return User{}, err
	}
	skFile := s.path(KeysDir + "/" + signingKeyFile(role, name) + ".nk")
	seed, err := readSmall(skFile)
	if err != nil {
		return User{}, fmt.Errorf("signing key of role %s: %w", role, err)
	}
	sk, err := parseSeed(seed, nkeys.PrefixByteAccount)
	if err != nil {
		return User{}, fmt.Errorf("signing key %s: %w", skFile, err)
	}
	skPub, err := sk.PublicKey()
	if err != nil {
		return User{}, fmt.Errorf("signing key %s: %w", skFile, err)
	}
	accPub, err := scopedAccount(accJWT, role, skPub)
	if err != nil {
		return User{}, fmt.Errorf("account %s: %w", acc, err)
	}

	ukp, err := nkeys.CreateUser()
	if err != nil {
		return User{}, fmt.Errorf("create user key: %w", err)
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		return User{}, fmt.Errorf("user key: %w", err)
	}
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.IssuerAccount = accPub
	uc.SetScoped(true)
	tok, err := uc.Encode(sk)
	if err != nil {
		return User{}, fmt.Errorf("sign the JWT of %s %s: %w", role, name, err)
	}
	useed, err := ukp.Seed()
	if err != nil {
		return User{}, fmt.Errorf("user key: %w", err)
	}
	creds, err := jwt.FormatUserConfig(tok, useed)
	if err != nil {
		return User{}, fmt.Errorf("credentials of %s %s: %w", role, name, err)
	}
	u := User{Role: role, Name: name, Account: acc, Inbox: InboxPrefix(role, name),
		File: s.path(userFile(role, name) + ".creds"), New: true}
	if err := writeFile(u.File, creds, secretMode); err != nil {
		return User{}, err
	}
	return u, nil
}

// scopedAccount decodes an account JWT that JWT wrote and returns the
// account's public key, once it has checked that signer is one of the
// account's scoped signing keys, of role. A user signed by any other key
// would be refused by the server; better to say so here.
func scopedAccount(data []byte, role, signer string) (string, error) {
	ac, err := jwt.DecodeAccountClaims(string(trimLine(data)))
	if err != nil {
		return "", fmt.Errorf("not an account JWT: %w", err)
	}
	scope, ok := ac.SigningKeys.GetScope(signer)
	us, scoped := scope.(*jwt.UserScope)
	switch {
	case !ok:
		return "", fmt.Errorf("signing key %s is not one of the account's: run `ledgerctl auth jwt` again", signer)
	case !scoped || us.Role != role:
		return "", fmt.Errorf("signing key %s is not the account's key of role %s", signer, role)
	}
	return ac.Subject, nil
}

func trimLine(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
