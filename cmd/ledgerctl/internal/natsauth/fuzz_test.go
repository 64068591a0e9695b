package natsauth

import (
	"bytes"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// FuzzParseSeed reads whatever a seed file may hold: a key is returned only
// for exactly one seed of the wanted kind, and nothing panics.
func FuzzParseSeed(f *testing.F) {
	user, _ := nkeys.CreateUser()
	userSeed, _ := user.Seed()
	acc, _ := nkeys.CreateAccount()
	accSeed, _ := acc.Seed()
	f.Add(userSeed)
	f.Add(append(append([]byte(nil), userSeed...), '\n'))
	f.Add(append(append([]byte("\r\n "), userSeed...), "\r\n"...))
	f.Add(accSeed)                                                                        // another kind
	f.Add(userSeed[:len(userSeed)-1])                                                     // truncated
	f.Add(append(append([]byte(nil), userSeed...), append([]byte("\n"), userSeed...)...)) // two seeds
	f.Add([]byte(""))
	f.Add([]byte("-----BEGIN USER NKEY SEED-----\n"))
	f.Add(bytes.Repeat([]byte("S"), maxSeedFile+1))
	f.Fuzz(func(t *testing.T, data []byte) {
		kp, err := parseSeed(data, nkeys.PrefixByteUser)
		if err != nil {
			return
		}
		seed, err := kp.Seed()
		if err != nil {
			t.Fatalf("a parsed key has no seed: %v", err)
		}
		if !bytes.Equal(seed, bytes.TrimSpace(data)) {
			t.Fatalf("parsed %q from %q", seed, data)
		}
		if pub, _ := kp.PublicKey(); !nkeys.IsValidPublicUserKey(pub) {
			t.Fatalf("not a user key: %s", pub)
		}
	})
}

// FuzzScopedAccount reads whatever an account JWT file may hold: an account
// key is returned only when the file is an account JWT listing the signer
// with the role, and nothing panics.
func FuzzScopedAccount(f *testing.F) {
	op, _ := nkeys.CreateOperator()
	acc, _ := nkeys.CreateAccount()
	accPub, _ := acc.PublicKey()
	sk, _ := nkeys.CreateAccount()
	skPub, _ := sk.PublicKey()
	ac := jwt.NewAccountClaims(accPub)
	scope := jwt.NewUserScope()
	scope.Key, scope.Role = skPub, RoleWorker
	ac.SigningKeys.AddScopedSigner(scope)
	scoped, _ := ac.Encode(op)
	plain := jwt.NewAccountClaims(accPub)
	plain.SigningKeys.Add(skPub)
	unscoped, _ := plain.Encode(op)
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(userPub)
	userJWT, _ := uc.Encode(acc)

	f.Add([]byte(scoped+"\n"), RoleWorker, skPub)
	f.Add([]byte(scoped), RoleReader, skPub)   // another role
	f.Add([]byte(scoped), RoleWorker, userPub) // not a key of the account
	f.Add([]byte(unscoped), RoleWorker, skPub) // a key, but not scoped
	f.Add([]byte(userJWT), RoleWorker, skPub)  // a user's JWT
	f.Add([]byte(scoped[:len(scoped)-5]), RoleWorker, skPub)
	f.Add([]byte("eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.AAAA"), RoleWorker, skPub)
	f.Add([]byte{}, "", "")
	f.Fuzz(func(t *testing.T, data []byte, role, signer string) {
		pub, err := scopedAccount(data, role, signer)
		if err != nil {
			return
		}
		if !nkeys.IsValidPublicAccountKey(pub) {
			t.Fatalf("not an account key: %q", pub)
		}
		ac, err := jwt.DecodeAccountClaims(string(trimLine(data)))
		if err != nil {
			t.Fatalf("accepted what does not decode: %v", err)
		}
		s, ok := ac.SigningKeys.GetScope(signer)
		if us, scoped := s.(*jwt.UserScope); !ok || !scoped || us.Role != role {
			t.Fatalf("accepted signer %q for role %q", signer, role)
		}
	})
}

// FuzzIssuerAccount reads whatever a credentials file may hold: an issuer
// is returned only for a user JWT, and it is an account key; nothing
// panics.
func FuzzIssuerAccount(f *testing.F) {
	acc, _ := nkeys.CreateAccount()
	accPub, _ := acc.PublicKey()
	sk, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	seed, _ := user.Seed()
	uc := jwt.NewUserClaims(userPub)
	direct, _ := uc.Encode(acc)
	uc.IssuerAccount = accPub
	scoped, _ := uc.Encode(sk)
	for _, tok := range []string{direct, scoped} {
		creds, _ := jwt.FormatUserConfig(tok, seed)
		f.Add(creds)
		f.Add([]byte(tok))
	}
	f.Add([]byte(direct[:len(direct)-5]))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		pub, err := issuerAccount(data)
		if err != nil {
			return
		}
		if !nkeys.IsValidPublicAccountKey(pub) {
			t.Fatalf("not an account key: %q", pub)
		}
	})
}
