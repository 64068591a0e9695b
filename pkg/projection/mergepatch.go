package projection

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrInvalidJSON is returned (wrapped) by MergePatch and MergeReducer when a
// document or payload is not valid JSON.
var ErrInvalidJSON = errors.New("projection: invalid JSON")

// MergePatch applies patch to target as an RFC 7386 JSON merge patch and
// returns the result. An empty or nil target or patch means null.
//
// It works on the raw bytes instead of decoded maps, so numbers, strings and
// the untouched parts of target keep their exact spelling, and a small patch
// on a small document costs well under a microsecond. Members of target keep
// their order; members that the patch adds come after them, in patch order.
// The result may share memory with patch (when patch is not an object);
// neither input is modified.
func MergePatch(target, patch json.RawMessage) (json.RawMessage, error) {
	if len(target) > 0 && !json.Valid(target) {
		return nil, fmt.Errorf("%w: merge patch target", ErrInvalidJSON)
	}
	if len(patch) > 0 && !json.Valid(patch) {
		return nil, fmt.Errorf("%w: merge patch", ErrInvalidJSON)
	}
	return mergePatch(trimSpace(target), trimSpace(patch)), nil
}

// mergePatch is MergePatch on trimmed, valid JSON.
func mergePatch(target, patch []byte) []byte {
	if len(patch) == 0 {
		return nullJSON
	}
	if !isObject(patch) {
		return patch // RFC 7386: a patch that is not an object replaces the target
	}
	if !isObject(target) {
		target = nil // and an object patch applies to {} when the target is not one
	}
	return mergeObject(make([]byte, 0, len(target)+len(patch)), target, patch)
}

// indexFrom is the member count above which mergeObject looks keys up in a
// map instead of scanning: below it a linear scan is cheaper than hashing.
const indexFrom = 16

// mergeObject appends to dst the object that results from applying the
// object patch to target (an object, or nil for {}).
func mergeObject(dst, target, patch []byte) []byte {
	var arr [16]member // keeps payload-sized objects off the heap
	ms := arr[:0]
	if target != nil {
		ms = appendMembers(ms, target)
	}
	var index map[string]int // canonical key -> position in ms, for large objects
	if len(ms) > indexFrom {
		index = make(map[string]int, len(ms))
		for k := range ms {
			ck := canonicalKey(ms[k].key)
			if prev, dup := index[ck]; dup {
				ms[prev].val = nil // a later duplicate key wins, as in a decoder
			}
			index[ck] = k
		}
	}
	for i := 1; ; { // past '{'
		i = skipSpace(patch, i)
		if i >= len(patch) || patch[i] == '}' {
			break
		}
		if patch[i] == ',' {
			i++
			continue
		}
		ks := i
		var esc bool
		i, esc = scanKey(patch, i)
		key := patch[ks:i]
		i = skipSpace(patch, skipSpace(patch, i)+1)
		vs := i
		i = scanValue(patch, i)
		val := patch[vs:i]

		at := findMember(ms, index, key, esc)
		switch {
		case isNull(val):
			if at >= 0 {
				ms[at].val, ms[at].touched = nil, true
			}
			continue
		case isObject(val):
			var base []byte
			if at >= 0 {
				base = ms[at].val
				if ms[at].touched {
					// The patch repeats this key. The last one must win, as
					// it does for a decoder and in the jsonb copy a re-fetch
					// returns, so it patches the original value.
					base = lookupMember(target, key, esc)
				}
			}
			if !isObject(base) {
				base = nil
			}
			val = mergeObject(make([]byte, 0, len(base)+len(val)), base, val)
		}
		if at >= 0 {
			ms[at].val, ms[at].touched = val, true
			continue
		}
		if index != nil {
			index[canonicalKey(key)] = len(ms)
		}
		ms = append(ms, member{key: key, val: val, esc: esc, touched: true})
	}
	dst = append(dst, '{')
	first := true
	for k := range ms {
		m := &ms[k]
		if m.val == nil {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, m.key...)
		dst = append(dst, ':')
		dst = append(dst, m.val...)
	}
	return append(dst, '}')
}

// findMember returns the position in ms of the member named key (a raw string
// token), or -1. Keys are compared by their decoded text, so "a" and "\u0061"
// name the same member.
func findMember(ms []member, index map[string]int, key []byte, esc bool) int {
	if index != nil {
		if k, ok := index[canonicalKey(key)]; ok {
			return k
		}
		return -1
	}
	found := -1
	for k := range ms {
		m := &ms[k]
		if sameKey(m.key, m.esc, key, esc) {
			// A target with duplicate keys means its last one, as a decoder
			// reads it; dropping the shadowed ones keeps that meaning after
			// the patch changes or removes the last.
			if found >= 0 {
				ms[found].val = nil
			}
			found = k
		}
	}
	return found
}

// sameKey reports whether two raw key tokens name the same member.
func sameKey(a []byte, aEsc bool, b []byte, bEsc bool) bool {
	if !aEsc && !bEsc {
		// The common case, inlined: the first byte after the quote settles
		// most mismatches without a call.
		return len(a) == len(b) && (len(a) < 2 || a[1] == b[1]) && string(a) == string(b)
	}
	return canonicalKey(a) == canonicalKey(b)
}

// lookupMember returns the value of the last member of the object obj named
// key, or nil.
func lookupMember(obj, key []byte, esc bool) []byte {
	if obj == nil {
		return nil
	}
	var arr [16]member
	ms := appendMembers(arr[:0], obj)
	for k := len(ms) - 1; k >= 0; k-- {
		if sameKey(ms[k].key, ms[k].esc, key, esc) {
			return ms[k].val
		}
	}
	return nil
}

// canonicalKey returns the canonical encoding of a raw JSON string token.
func canonicalKey(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	b, _, err := appendCanonicalString(nil, raw, 0)
	if err != nil {
		return string(raw)
	}
	return string(b)
}
