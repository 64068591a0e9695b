package projection

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/flowness/ledger/pkg/canonjson"
)

// fingerprint identifies the content (type and payload) of an event: two
// independently seeded 64-bit hashes of its canonical form. The seeds are
// random per Engine, so nobody can craft colliding payloads, and the 128 bits
// make an accidental collision between a conflicting copy and the applied one
// negligible. Fingerprints never leave the process, so they need not be stable
// across runs.
type fingerprint [2]uint64

// errBadJSON is returned by the canonicalizer for input that is not JSON.
var errBadJSON = canonjson.ErrInvalid

// canonicalizer fingerprints the canonical form of payloads (package
// canonjson: two values have one form exactly when jsonb calls them equal).
// This matters because the same committed event reaches the projector twice
// in different spellings: once as published on LEDGER_LOG and once
// re-fetched from a jsonb column.
//
// Its buffers are reused between calls; an Engine owns one and is not safe
// for concurrent use, so neither is this.
type canonicalizer struct {
	buf   []byte
	canon canonjson.Canonicalizer
	seeds [2]maphash.Seed
}

func newCanonicalizer() *canonicalizer {
	return &canonicalizer{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
}

// fingerprint returns the fingerprint of an event's type and payload, or
// errBadJSON when the payload is not a single valid JSON value.
func (c *canonicalizer) fingerprint(typ string, payload []byte) (fingerprint, error) {
	// The length prefix keeps type and payload from running into each other.
	c.buf = binary.AppendUvarint(c.buf[:0], uint64(len(typ)))
	c.buf = append(c.buf, typ...)
	if err := c.canonical(payload); err != nil {
		return fingerprint{}, err
	}
	fp := fingerprint{maphash.Bytes(c.seeds[0], c.buf), maphash.Bytes(c.seeds[1], c.buf)}
	// A one-off huge payload should not pin its buffer for the Engine's life.
	const keepMax = 1 << 20
	if cap(c.buf) > keepMax {
		c.buf = nil
	}
	return fp, nil
}

// canonical appends the canonical form of the single JSON value in b to c.buf.
func (c *canonicalizer) canonical(b []byte) error {
	var err error
	c.buf, err = c.canon.Append(c.buf, b)
	return err
}

// appendCanonicalString appends the canonical encoding of the JSON string at
// b[i] == '"' to dst and returns the index just past it.
func appendCanonicalString(dst, b []byte, i int) ([]byte, int, error) {
	return canonjson.AppendString(dst, b, i)
}
