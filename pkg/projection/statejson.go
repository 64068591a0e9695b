package projection

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// AppendJSON appends st as json.Marshal writes it, byte for byte, without
// reflection: the projector writes one value per task per turn, and
// marshalling by reflection was a sixth of its CPU (ledgerlab bench
// -external -projector-profile). A state with anything the fast path does
// not write itself (a string or data that needs escaping, data that is not
// compact) goes through json.Marshal.
func (st State) AppendJSON(dst []byte) ([]byte, error) {
	if !plainString(st.Task) || !plainString(st.Status) || !plainString(st.Kind) || !plainData(st.Data) {
		return st.marshalSlow(dst)
	}
	b := append(dst, `{"task":"`...)
	b = append(b, st.Task...)
	b = append(b, `","partition":`...)
	b = strconv.AppendInt(b, int64(st.Partition), 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, st.Version, 10)
	b = append(b, `,"status":"`...)
	b = append(b, st.Status...)
	b = append(b, `","data":`...)
	if st.Data == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, st.Data...)
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, st.Seq, 10)
	b = append(b, `,"updated_at":`...)
	var err error
	if b, err = appendTime(b, st.UpdatedAt); err != nil {
		return st.marshalSlow(dst)
	}
	b = append(b, `,"gap":`...)
	if g := st.Gap; g == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"next_version":`...)
		b = strconv.AppendInt(b, g.NextVersion, 10)
		b = append(b, `,"buffered":`...)
		b = strconv.AppendInt(b, int64(g.Buffered), 10)
		b = append(b, `,"since":`...)
		if b, err = appendTime(b, g.Since); err != nil {
			return st.marshalSlow(dst)
		}
		b = append(b, '}')
	}
	if st.DataTooLarge != 0 {
		b = append(b, `,"data_too_large":`...)
		b = strconv.AppendInt(b, int64(st.DataTooLarge), 10)
	}
	if st.Kind != "" {
		b = append(b, `,"kind":"`...)
		b = append(b, st.Kind...)
		b = append(b, '"')
	}
	return append(b, '}'), nil
}

// marshalSlow is AppendJSON by json.Marshal.
func (st State) marshalSlow(dst []byte) ([]byte, error) {
	v, err := json.Marshal(st)
	if err != nil {
		return dst, err
	}
	return append(dst, v...), nil
}

// appendTime appends t as time.Time's MarshalJSON writes it.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return b, err
	}
	return append(b, '"'), nil
}

// plainString reports whether json.Marshal writes s as itself in quotes:
// printable ASCII without a quote, a backslash or a character it escapes
// for HTML.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// plainData reports whether json.Marshal writes data (a json.RawMessage)
// as itself: valid JSON with no byte its compaction removes (white space)
// or escapes (HTML characters; U+2028 and U+2029, which start with 0xE2).
func plainData(data json.RawMessage) bool {
	if data == nil {
		return true
	}
	for _, c := range data {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xE2:
			return false
		}
	}
	return wire.ValidJSON(data)
}
