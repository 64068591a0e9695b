package projection

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/flowness/ledger/pkg/wire"
)

// ErrInvalidJSON is returned (wrapped) by MergePatch and MergeReducer when a
// document or payload is not valid JSON.
var ErrInvalidJSON = errors.New("projection: invalid JSON")

// MergePatch applies patch to target as an RFC 7386 JSON merge patch and
// returns the result. An empty or nil target or patch means null.
//
// It works on the raw bytes instead of decoded maps, so numbers, strings and
// the untouched parts of target keep their exact spelling, and a small patch
// on a small document costs well under a microsecond. Its time is linear in
// len(target)+len(patch), whatever the shape of either. Members of target
// keep their order; members that the patch adds come after them, in patch
// order. Keys are compared as a decoder compares them ("a" is "\u0061"), and
// when an object repeats a key its last member counts. The result may share
// memory with patch (when patch is not an object); neither input is modified.
func MergePatch(target, patch json.RawMessage) (json.RawMessage, error) {
	if len(target) > 0 && !wire.ValidJSON(target) {
		return nil, fmt.Errorf("%w: merge patch target", ErrInvalidJSON)
	}
	if len(patch) > 0 && !wire.ValidJSON(patch) {
		return nil, fmt.Errorf("%w: merge patch", ErrInvalidJSON)
	}
	return mergePatch(trimSpace(target), trimSpace(patch)), nil
}

// mergePatch is MergePatch on trimmed, valid JSON.
func mergePatch(target, patch []byte) []byte {
	m := mergers.Get().(*merger)
	out := m.merge(target, patch)
	mergers.Put(m)
	return out
}

// mergers keeps mergers between calls, so that a merge allocates nothing but
// its result.
var mergers = sync.Pool{New: func() any { return new(merger) }}

// mergerKeep is the most members a merger keeps room for between merges; one
// that grew larger for a huge merge lets go of its slices.
const mergerKeep = 1024

// merge is mergePatch on m's scratch space. m.steps holds its work afterwards.
func (m *merger) merge(target, patch []byte) []byte {
	m.steps = 0
	if len(patch) == 0 {
		return nullJSON
	}
	if !isObject(patch) {
		return patch // RFC 7386: a patch that is not an object replaces the target
	}
	if !isObject(target) {
		target = nil // and an object patch applies to {} when the target is not one
	}
	m.target, m.patch = target, patch
	dst := make([]byte, 0, len(target)+len(patch))
	root, _ := m.parsePatch(0)
	if target == nil {
		dst = m.emitPatch(dst, root)
	} else {
		t, _ := m.collect(0, root)
		dst = m.emitTarget(dst, t)
	}
	m.reset()
	return dst
}

// reset empties m for the next merge, keeping the room of its slices.
func (m *merger) reset() {
	clear(m.pn) // drops the index maps
	m.pn, m.pm, m.tn, m.tm = m.pn[:0], m.pm[:0], m.tn[:0], m.tm[:0]
	if cap(m.pm) > mergerKeep || cap(m.tm) > mergerKeep {
		m.pn, m.pm, m.tn, m.tm = nil, nil, nil, nil
	}
	m.target, m.patch, m.gen = nil, nil, 0 // nothing keeps the documents alive
}

// indexFrom is the member count above which a patch object's keys are looked
// up in a map instead of scanned: below it a linear scan is cheaper than
// hashing.
const indexFrom = 16

// merger applies one object patch to one object target in time linear in
// both. Merging member by member re-reads what was read already: the target
// once per repeated key of the patch, a nested level once per level above
// it, the growing member list once per added key, so a patch an attacker
// shapes costs time quadratic in its size (docs/internals/benchmarks.md, "Projector").
// Here every byte is read once:
//
//  1. parsePatch reads the patch into a tree of its objects, each key once
//     (the last of a repeated key wins, as for a decoder), with a map for the
//     keys of a large object.
//  2. collect walks the target along that tree: a member whose key the patch
//     merges an object into is parsed as it is met, the rest is skipped.
//  3. emitTarget writes the result into one buffer.
//
// Nodes and members live in flat slices and refer to each other by index
// and to the documents by offset, so the members hold no pointers (no write
// barriers, nothing for the GC to trace), and the slices are reused from one
// merge to the next (see mergers).
type merger struct {
	target, patch []byte

	pn []patchNode
	pm []patchMember
	tn []targetNode
	tm []targetMember

	gen uint32 // numbers the target objects collect visits

	// steps counts the work done: bytes scanned and keys compared. Tests
	// check that it stays proportional to the input.
	steps int
}

// patchNode is an object of the patch: a chain of its distinct keys.
type patchNode struct {
	first, last int32 // into merger.pm; -1 when empty
	n           int
	index       map[string]int32 // decoded key -> member, once n > indexFrom
}

// patchMember is a key of a patch object with the last value given for it:
// patch[ks:ke] is the key token, patch[vs:ve] the value.
type patchMember struct {
	ks, ke, vs, ve int
	esc            bool  // the key must be decoded before comparing (see scanKey)
	child          int32 // the value's patchNode when it is an object, else -1
	next           int32 // the next member of the same object, or -1

	// gen and at name the target object that collect last matched against
	// this member's object, and its member with this key (the last one, when
	// the target repeats the key).
	gen uint32
	at  int32
}

// targetNode is an object of the target that the patch merges into.
type targetNode struct {
	first, last int32  // into merger.tm; -1 when empty
	gen         uint32 // this visit's number, see patchMember.gen
	patch       int32  // the patchNode merged into it
}

// targetMember is a member of a targetNode: target[ks:ke] is the key token,
// target[vs:ve] the value.
type targetMember struct {
	ks, ke, vs, ve int
	p              int32 // the patch member with the same key, or -1
	child          int32 // the targetNode its value became, or -1
	next           int32
}

// parsePatch reads the patch object at patch[i] == '{' into a patchNode and
// returns it and the index just past the object.
func (m *merger) parsePatch(i int) (int32, int) {
	p := m.patch
	id := int32(len(m.pn))
	m.pn = append(m.pn, patchNode{first: -1, last: -1})
	for i++; ; {
		i = skipSpace(p, i)
		if i >= len(p) || p[i] == '}' {
			return id, i + 1
		}
		if p[i] == ',' {
			i++
			continue
		}
		ks := i
		var esc bool
		i, esc = scanKey(p, i)
		ke := i
		i = skipSpace(p, skipSpace(p, i)+1) // past ':'
		m.steps += i - ks
		vs, child := i, int32(-1)
		if p[i] == '{' {
			child, i = m.parsePatch(i)
		} else {
			i = scanValue(p, i)
			m.steps += i - vs
		}
		if k := m.find(id, p[ks:ke], esc); k >= 0 {
			// A repeated key: its last value wins, as for a decoder and in the
			// jsonb copy a re-fetch returns.
			m.pm[k].vs, m.pm[k].ve, m.pm[k].child = vs, i, child
			continue
		}
		m.add(id, patchMember{ks: ks, ke: ke, vs: vs, ve: i, esc: esc, child: child, next: -1, at: -1})
	}
}

// add appends a member to a patch object.
func (m *merger) add(id int32, pm patchMember) {
	k := int32(len(m.pm))
	m.pm = append(m.pm, pm)
	n := &m.pn[id]
	if n.last < 0 {
		n.first = k
	} else {
		m.pm[n.last].next = k
	}
	n.last = k
	n.n++
	switch {
	case n.index != nil:
		n.index[decodedKey(m.patch[pm.ks:pm.ke], pm.esc)] = k
	case n.n > indexFrom:
		n.index = make(map[string]int32, 2*n.n)
		for j := n.first; j >= 0; j = m.pm[j].next {
			n.index[decodedKey(m.patch[m.pm[j].ks:m.pm[j].ke], m.pm[j].esc)] = j
		}
		m.steps += n.n
	}
}

// find returns the member of patch object id named key (a raw string token),
// or -1.
func (m *merger) find(id int32, key []byte, esc bool) int32 {
	n := &m.pn[id]
	if n.index != nil {
		m.steps++
		var k int32
		var ok bool
		if esc {
			k, ok = n.index[decodedKey(key, esc)]
		} else {
			k, ok = n.index[string(key)] // no allocation: the conversion is only a lookup key
		}
		if !ok {
			return -1
		}
		return k
	}
	for k := n.first; k >= 0; k = m.pm[k].next {
		m.steps++
		pm := &m.pm[k]
		if sameKey(m.patch[pm.ks:pm.ke], pm.esc, key, esc) {
			return k
		}
	}
	return -1
}

// collect walks the target object at target[i] == '{' that patch object pid
// merges into, and returns its targetNode and the index just past it.
func (m *merger) collect(i int, pid int32) (int32, int) {
	t := m.target
	m.gen++
	id, gen := int32(len(m.tn)), m.gen
	m.tn = append(m.tn, targetNode{first: -1, last: -1, gen: gen, patch: pid})
	for i++; ; {
		i = skipSpace(t, i)
		if i >= len(t) || t[i] == '}' {
			return id, i + 1
		}
		if t[i] == ',' {
			i++
			continue
		}
		ks := i
		var esc bool
		i, esc = scanKey(t, i)
		ke := i
		i = skipSpace(t, skipSpace(t, i)+1) // past ':'
		m.steps += i - ks
		vs, child := i, int32(-1)
		p := m.find(pid, t[ks:ke], esc)
		if p >= 0 && m.pm[p].child >= 0 && t[i] == '{' {
			// Parsed now rather than skipped and parsed again later, so a
			// deep path is read once, not once per level above it.
			child, i = m.collect(i, m.pm[p].child)
		} else {
			i = scanValue(t, i)
			m.steps += i - vs
		}
		k := int32(len(m.tm))
		m.tm = append(m.tm, targetMember{ks: ks, ke: ke, vs: vs, ve: i, p: p, child: child, next: -1})
		if n := &m.tn[id]; n.last < 0 {
			n.first, n.last = k, k
		} else {
			m.tm[n.last].next, n.last = k, k
		}
		if p >= 0 {
			m.pm[p].gen, m.pm[p].at = gen, k
		}
	}
}

// emitTarget appends the merge of a collected target object and its patch.
func (m *merger) emitTarget(dst []byte, id int32) []byte {
	n := m.tn[id]
	dst = append(dst, '{')
	first := true
	for k := n.first; k >= 0; k = m.tm[k].next {
		tm := &m.tm[k]
		if tm.p < 0 {
			dst = appendMember(dst, &first, m.target[tm.ks:tm.ke])
			dst = append(dst, m.target[tm.vs:tm.ve]...)
			continue
		}
		pm := &m.pm[tm.p]
		if pm.at != k || pm.gen != n.gen || isNull(m.patch[pm.vs:pm.ve]) {
			// Removed by the patch, or shadowed by a later member of the
			// same key, which is what a decoder would read: dropping it keeps
			// that meaning once the last one is patched.
			continue
		}
		dst = appendMember(dst, &first, m.target[tm.ks:tm.ke])
		switch {
		case tm.child >= 0:
			dst = m.emitTarget(dst, tm.child)
		case pm.child >= 0:
			dst = m.emitPatch(dst, pm.child) // an object patch applies to {} when the value is not one
		default:
			dst = append(dst, m.patch[pm.vs:pm.ve]...)
		}
	}
	for k := m.pn[n.patch].first; k >= 0; k = m.pm[k].next {
		if pm := &m.pm[k]; pm.gen != n.gen {
			dst = m.emitAdded(dst, &first, pm)
		}
	}
	return append(dst, '}')
}

// emitPatch appends patch object id applied to {}: its members without the
// nulls, at every depth.
func (m *merger) emitPatch(dst []byte, id int32) []byte {
	dst = append(dst, '{')
	first := true
	for k := m.pn[id].first; k >= 0; k = m.pm[k].next {
		dst = m.emitAdded(dst, &first, &m.pm[k])
	}
	return append(dst, '}')
}

// emitAdded appends a patch member that the target does not have.
func (m *merger) emitAdded(dst []byte, first *bool, pm *patchMember) []byte {
	val := m.patch[pm.vs:pm.ve]
	if isNull(val) {
		return dst
	}
	dst = appendMember(dst, first, m.patch[pm.ks:pm.ke])
	if pm.child >= 0 {
		return m.emitPatch(dst, pm.child)
	}
	return append(dst, val...)
}

// appendMember appends the separator and key of the next member.
func appendMember(dst []byte, first *bool, key []byte) []byte {
	if !*first {
		dst = append(dst, ',')
	}
	*first = false
	dst = append(dst, key...)
	return append(dst, ':')
}

// sameKey reports whether two raw key tokens name the same member.
func sameKey(a []byte, aEsc bool, b []byte, bEsc bool) bool {
	if !aEsc && !bEsc {
		// The common case, inlined: the first byte after the quote settles
		// most mismatches without a call.
		return len(a) == len(b) && (len(a) < 2 || a[1] == b[1]) && string(a) == string(b)
	}
	return decodedKey(a, aEsc) == decodedKey(b, bEsc)
}

// decodedKey returns a raw JSON string token in the form in which two tokens
// are equal exactly when a decoder reads them as the same string: escapes
// decoded (canonically re-encoded), and each byte that is not UTF-8 replaced
// by U+FFFD, as encoding/json does. A token without escapes or such bytes
// (esc false, see scanKey) is already in that form.
func decodedKey(raw []byte, esc bool) string {
	if !esc {
		return string(raw)
	}
	b := raw
	if bytes.IndexByte(raw, '\\') >= 0 {
		var err error
		if b, _, err = appendCanonicalString(nil, raw, 0); err != nil {
			return string(raw)
		}
	}
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:size]...)
		}
		b = b[size:]
	}
	return string(out)
}
