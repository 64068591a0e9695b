package wire

import (
	"hash/fnv"
	"strings"

	"github.com/oklog/ulid/v2"
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

// ValidEventID reports whether s is a ULID in its canonical 26-character
// Crockford base32 form.
func ValidEventID(s string) bool {
	if len(s) != ulid.EncodedSize {
		return false
	}
	_, err := ulid.ParseStrict(s)
	return err == nil
}

// PartitionOf is the Go SDK's default partition of a task: fnv1a32(task) mod n.
func PartitionOf(task string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(task))
	return int(h.Sum32() % uint32(n))
}
