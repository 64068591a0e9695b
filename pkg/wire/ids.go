package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"strings"
)

// MaxIDLen is the longest task or holder id.
const MaxIDLen = 128

// MaxTypeLen is the longest event type.
const MaxTypeLen = 64

// PartitionsDefault is the default partition count N.
const PartitionsDefault = 16

// MaxPayloadDefault is the default largest event payload (256 KiB).
const MaxPayloadDefault = 256 << 10

// ValidID reports whether s is a valid task or holder id: 1..128 characters
// of [A-Za-z0-9_-], so that it is a NATS subject token and a KV key.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// MaxHolderPartLen is the longest principal or instance of a holder id.
const MaxHolderPartLen = 64

// ValidHolder reports whether s is a holder id: <principal>.<instance>,
// each 1..64 characters of [A-Za-z0-9_-] (docs/contract.md, Identifiers).
func ValidHolder(s string) bool {
	principal, instance, ok := strings.Cut(s, ".")
	return ok && len(principal) <= MaxHolderPartLen && len(instance) <= MaxHolderPartLen &&
		ValidID(principal) && ValidID(instance)
}

// Holder is the holder id of instance of principal.
func Holder(principal, instance string) string { return principal + "." + instance }

// Principal is the principal of a holder id: the part before the dot.
func Principal(holder string) string {
	p, _, _ := strings.Cut(holder, ".")
	return p
}

// InboxPrefix is the inbox prefix of a principal's connections: its
// replies come to <InboxPrefix>.>, which only that principal may
// subscribe to (docs/contract.md §9). Connect with
// nats.CustomInboxPrefix(wire.InboxPrefix(principal)).
func InboxPrefix(principal string) string { return "_INBOX." + principal }

// ValidType reports whether s is a valid event type: 1..64 of [A-Za-z0-9_.:-].
func ValidType(s string) bool {
	if len(s) == 0 || len(s) > MaxTypeLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// ValidEventID reports whether s is an event id: a ULID in its one
// spelling, 26 characters of Crockford base32 in upper case, the first at
// most '7' (docs/contract.md, Identifiers). Crockford base32 reads a lower
// case letter as its upper case, so "01jd…" and "01JD…" are one ULID; the
// ledger refuses the lower case rather than store one id twice.
func ValidEventID(s string) bool {
	if len(s) != eventIDLen || s[0] > '7' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isCrockford[s[i]] {
			return false
		}
	}
	return true
}

// isCrockford marks the bytes of crockford: a table, since every event's
// id is checked, a batch's 256 at once.
var isCrockford = func() (t [256]bool) {
	for i := range len(crockford) {
		t[crockford[i]] = true
	}
	return t
}()

// ValidEventIDAnyCase is ValidEventID also for a lower-case spelling: ids
// the ledger stored before it refused that spelling (archive files).
func ValidEventIDAnyCase(s string) bool { return ValidEventID(strings.ToUpper(s)) }

const (
	eventIDLen = 26
	crockford  = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	// MaxMsgTokenLen is the longest token after the event id in a
	// Nats-Msg-Id.
	MaxMsgTokenLen = 64
)

// SplitMsgID splits an inbound Nats-Msg-Id, <event id> or <event id>:<token>
// (docs/contract.md §2), into the event id and the token ("" for the bare
// form). ok is false when a token is there but is not 1..64 of
// [A-Za-z0-9_-]; the event id is the caller's to check (ValidEventID).
func SplitMsgID(v string) (id, token string, ok bool) {
	id, token, found := strings.Cut(v, ":")
	if !found {
		return v, "", true
	}
	return id, token, len(token) <= MaxMsgTokenLen && ValidID(token)
}

// EventIDOf is the event id of an inbound Nats-Msg-Id (SplitMsgID).
func EventIDOf(msgID string) string {
	id, _, _ := strings.Cut(msgID, ":")
	return id
}

// MsgID is the Nats-Msg-Id of event id with token ("": the bare id).
func MsgID(id, token string) string {
	if token == "" {
		return id
	}
	return id + ":" + token
}

// ContentToken is the token the SDKs put after the event id in an event's
// Nats-Msg-Id: the first 16 bytes, in lower-case hex, of the SHA-256 of
// the subject, the Ledger-Generation, Ledger-Version and Ledger-Type values
// and the body, joined by newlines. An identical re-send has the same
// Nats-Msg-Id, and LEDGER_IN drops it within its duplicate window; a
// message with other content under the same event id has another, and
// reaches the ledger for its verdict (docs/contract.md §2).
func ContentToken(subject, generation, version, typ string, body []byte) string {
	h := sha256.New()
	for _, s := range [...]string{subject, generation, version, typ} {
		h.Write([]byte(s))
		h.Write([]byte{'\n'})
	}
	h.Write(body)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// PartitionOf is the Go SDK's default partition of a task: fnv1a32(task) mod n.
func PartitionOf(task string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(task))
	return int(h.Sum32() % uint32(n))
}
