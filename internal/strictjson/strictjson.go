// Package strictjson decodes one JSON object the way the ledger's operator
// files need it read: exactly the fields of the type, each key its field's
// exact name and given once, and nothing after. encoding/json alone matches
// names regardless of case and keeps the last of repeated keys, so a line
// could say two things and be read as either.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"
)

// Decode decodes the one JSON object in data into v (a pointer to a
// struct): no unknown field, nothing after the object, and every key of it
// (and of the objects its struct-typed fields hold, not those inside
// arrays) a field's exact JSON name, once.
func Decode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more after the object")
	}
	return exactKeys(json.NewDecoder(bytes.NewReader(data)), reflect.TypeOf(v))
}

// exactKeys reads the next value from dec and, where t is a struct (but a
// time.Time), fails on a key that is not exactly one of its fields' JSON
// names, or that is given twice; it looks into the values of the fields
// the same way.
func exactKeys(dec *json.Decoder, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
		var skip json.RawMessage
		return dec.Decode(&skip)
	}
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return err // null, or what Decode refused already
	}
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			fields[name] = f.Type
		}
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		ft, ok := fields[key]
		switch {
		case !ok:
			return fmt.Errorf("%.40q is not a field's exact name", key)
		case seen[key]:
			return fmt.Errorf("%q given twice", key)
		}
		seen[key] = true
		if err := exactKeys(dec, ft); err != nil {
			return err
		}
	}
	_, err = dec.Token() // '}'
	return err
}
