package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// HeaderFence carries a holder's fence on a side effect or a call made on
// its behalf (docs/contract.md §10): "<partition>:<principal>.<instance>:<generation>".
const HeaderFence = "Ledger-Fence"

// ErrBadFence is what ParseFence returns, wrapped, for a value that is not
// a fence.
var ErrBadFence = errors.New("not a fence")

// maxFenceLen bounds a fence's text: a partition of at most 10 digits, a
// holder of at most 129 bytes, a generation of at most 18 digits and two
// separators.
const maxFenceLen = 10 + 1 + 2*MaxHolderPartLen + 1 + 1 + 18

// Fence is what a downstream service needs to tell a current holder from a
// superseded one: the partition, its holder and the lease's generation (the
// fencing token). A higher generation of the same partition always
// supersedes a lower one.
type Fence struct {
	Partition  int
	Holder     string
	Generation int64
}

// String renders f as the Ledger-Fence header's value:
// "<partition>:<holder>:<generation>", for example "3:reports.pod-a:42".
func (f Fence) String() string {
	return strconv.Itoa(f.Partition) + ":" + f.Holder + ":" + strconv.FormatInt(f.Generation, 10)
}

// Valid reports whether f could have been granted: a partition within
// [0, 2^30], a valid holder id and a generation of at least 1.
func (f Fence) Valid() bool {
	return f.Partition >= 0 && f.Partition <= 1<<30 && ValidHolder(f.Holder) && f.Generation >= 1
}

// ParseFence reads a Ledger-Fence value strictly: plain decimal digits
// without leading zeros for the partition and the generation (at least 1),
// a valid holder id between them, nothing else. Every refusal wraps
// ErrBadFence. An accepted value is exactly what String makes of the
// result, so each fence has one spelling.
func ParseFence(s string) (Fence, error) {
	var f Fence
	if len(s) > maxFenceLen {
		return f, fmt.Errorf("%w: %d bytes is longer than %d", ErrBadFence, len(s), maxFenceLen)
	}
	ps, rest, ok := strings.Cut(s, ":")
	holder, gs, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 {
		return f, fmt.Errorf("%w: %q is not <partition>:<principal>.<instance>:<generation>", ErrBadFence, s)
	}
	p, err := canonicalInt(ps)
	if err != nil || p > 1<<30 {
		return f, fmt.Errorf("%w: partition %q is not an integer in [0, 2^30] without leading zeros", ErrBadFence, ps)
	}
	if !ValidHolder(holder) {
		return f, fmt.Errorf("%w: holder %q is not <principal>.<instance>, each 1..64 of [A-Za-z0-9_-]", ErrBadFence, holder)
	}
	g, err := canonicalInt(gs)
	if err != nil || g < 1 {
		return f, fmt.Errorf("%w: generation %q is not an integer of at least 1 without leading zeros", ErrBadFence, gs)
	}
	return Fence{Partition: int(p), Holder: holder, Generation: g}, nil
}

// canonicalInt is ParseInt refusing leading zeros, so that one number has
// one spelling.
func canonicalInt(s string) (int64, error) {
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	return ParseInt(s)
}

// Supersedes reports whether f makes other stale: same partition, higher
// generation. Fences of different partitions never supersede each other.
func (f Fence) Supersedes(other Fence) bool {
	return f.Partition == other.Partition && f.Generation > other.Generation
}
