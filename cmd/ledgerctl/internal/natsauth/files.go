package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// Modes of what the commands write. Seeds and credentials are secrets;
// server configuration holds public keys and signed JWTs only.
const (
	secretMode = 0o600
	publicMode = 0o644
	dirMode    = 0o700
)

// maxSeedFile bounds what a seed file may hold: a seed is 58 characters,
// and nothing this package writes is larger than a few lines.
const maxSeedFile = 4096

// parseSeed reads a seed file's content: one nkey seed of kind (user,
// account or operator), optionally followed by a line end. Anything else is
// an error naming what was found, never a key of another kind: a user
// seed where an account seed belongs would sign JWTs no server accepts.
func parseSeed(data []byte, kind nkeys.PrefixByte) (nkeys.KeyPair, error) {
	if len(data) > maxSeedFile {
		return nil, fmt.Errorf("%d bytes, larger than a seed file", len(data))
	}
	seed := bytes.TrimSpace(data)
	if len(seed) == 0 {
		return nil, errors.New("empty")
	}
	if bytes.ContainsAny(seed, " \t\r\n") {
		return nil, errors.New("more than one seed")
	}
	got, _, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("not an nkey seed: %w", err)
	}
	if got != kind {
		return nil, fmt.Errorf("a seed of a %s key, not of a %s key", keyKind(got), keyKind(kind))
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("not an nkey seed: %w", err)
	}
	return kp, nil
}

func keyKind(p nkeys.PrefixByte) string {
	switch p {
	case nkeys.PrefixByteUser:
		return "user"
	case nkeys.PrefixByteAccount:
		return "account"
	case nkeys.PrefixByteOperator:
		return "operator"
	}
	return "other"
}

// seedFile returns the key whose seed is in path, creating it (a new key,
// written 0600) when the file does not exist. Keys are reused so that
// running a command again, to add a worker say, keeps every existing user
// and server working.
func seedFile(path string, kind nkeys.PrefixByte) (kp nkeys.KeyPair, created bool, err error) {
	data, err := readSmall(path)
	switch {
	case err == nil:
		if err := privateFile(path); err != nil {
			return nil, false, err
		}
		kp, err := parseSeed(data, kind)
		if err != nil {
			return nil, false, fmt.Errorf("seed file %s: %w", path, err)
		}
		return kp, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("read seed file: %w", err)
	}
	kp, err = newKey(kind)
	if err != nil {
		return nil, false, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, false, fmt.Errorf("seed of a new %s key: %w", keyKind(kind), err)
	}
	if err := writeFile(path, append(seed, '\n'), secretMode); err != nil {
		return nil, false, err
	}
	return kp, true, nil
}

// privateFile refuses a seed file that others than its owner may read or
// write: whoever could read it may already hold the key, so reusing it
// quietly would hand them a credential of the new deployment.
func privateFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("seed file %s: %w", path, err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("seed file %s has mode %#o: others may read it, so the key may be known; "+
			"remove the file for a new key (its user's credentials change), or chmod 600 it if no one else has read it", path, perm)
	}
	return nil
}

func newKey(kind nkeys.PrefixByte) (nkeys.KeyPair, error) {
	var (
		kp  nkeys.KeyPair
		err error
	)
	switch kind {
	case nkeys.PrefixByteUser:
		kp, err = nkeys.CreateUser()
	case nkeys.PrefixByteAccount:
		kp, err = nkeys.CreateAccount()
	case nkeys.PrefixByteOperator:
		kp, err = nkeys.CreateOperator()
	default:
		return nil, fmt.Errorf("natsauth: no key kind %q", kind)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s key: %w", keyKind(kind), err)
	}
	return kp, nil
}

// readSmall reads a file this package wrote, refusing one too large to be
// a key, a JWT or a credentials file.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read only
	data, err := io.ReadAll(io.LimitReader(f, maxReadFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxReadFile {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a file ledgerctl auth wrote", path, maxReadFile)
	}
	return data, nil
}

// maxReadFile bounds every file the commands read back.
const maxReadFile = 1 << 20

// writeFile replaces path with data, readable per mode, through a
// temporary file in the same directory: a crash leaves the old file or the
// new one, never half of a seed.
func writeFile(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close() //nolint:errcheck
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close() //nolint:errcheck
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close() //nolint:errcheck
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
