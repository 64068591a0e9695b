package fence_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/canonjson"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// hugeNumbers are the payloads of the incident and its neighbours: jsonb
// stores each in a few bytes, but renders it at up to gigabytes.
var hugeNumbers = map[string]string{
	"1e131071, the largest numeric":    `{"n":1e131071}`,
	"exponent just past the bound":     `1e1001`,
	"negative exponent past the bound": `[1e-1001]`,
	"exponent with leading zeros":      `1e000000000000000000001001`,
	"an exponent of 20 digits":         `1e99999999999999999999`,
	"1001 digits":                      strings.Repeat("7", 1001),
	"1001 fraction digits":             "0." + strings.Repeat("5", 1000),
	"many numbers at the bound":        "[" + strings.Repeat("1e1000,", 40) + "1]",
	"many small negative exponents":    "[" + strings.Repeat("1e-999,", 40) + "1]",
}

// withinBounds are payloads on the right side of the bounds.
var withinBounds = map[string]string{
	"exponent at the bound":   `1e1000`,
	"negative at the bound":   `-1e-1000`,
	"1000 digits":             strings.Repeat("7", 1000),
	"zero with a large scale": `0.0e-999`,
	"many small exponents":    "[" + strings.Repeat("1e-5,", 2000) + "1]",
	"usual numbers":           `{"price":12.50,"qty":3,"ratio":-0.125,"big":1.5e300,"tiny":2E-300}`,
}

func TestNumbersThatRenderHugeAreInvalid(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)

	var batch []fence.Event
	var names []string
	add := func(name, payload string) {
		e := ev(l, fmt.Sprintf("t%d", len(batch)), 1, "x")
		e.Payload = []byte(payload)
		batch, names = append(batch, e), append(names, name)
	}
	for name, p := range hugeNumbers {
		add(name, p)
	}
	nHuge := len(batch)
	for name, p := range withinBounds {
		add(name, p)
	}
	res, err := s.Append(ctx, batch)
	require.NoError(t, err)
	for k, r := range res {
		if k < nHuge {
			require.Equal(t, wire.VerdictInvalid, r.Verdict, names[k])
			require.Equal(t, wire.ReasonBadPayload, r.Reason, names[k])
			require.Contains(t, r.Detail, "number", names[k])
			continue
		}
		require.Equal(t, wire.VerdictCommitted, r.Verdict, names[k])
		var rendered int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT length(payload::text) FROM ledger.events WHERE event_id = $1`,
			batch[k].ID).Scan(&rendered))
		require.LessOrEqual(t, rendered, 3*len(batch[k].Payload)+fence.MaxNumberGrowthSlack, names[k])
	}
}

// pgJSON is one connection to the test server, shared by every iteration of
// a fuzz target; its queries need no schema. The target is skipped when no
// server answers.
func pgJSON(f *testing.F) *pgx.Conn {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbtest.ServerURL())
	if err != nil {
		f.Skipf("no PostgreSQL at %s: %v", dbtest.ServerURL(), err)
	}
	f.Cleanup(func() { _ = conn.Close(ctx) })
	return conn
}

// pgRendering is the text PostgreSQL renders p as jsonb, or ok false if
// PostgreSQL refuses it. An error that is not a refusal of the input fails
// the test.
func pgRendering(t *testing.T, conn *pgx.Conn, p string) (rendered int, ok bool) {
	err := conn.QueryRow(context.Background(), `SELECT length($1::text::jsonb::text)`, p).Scan(&rendered)
	if err == nil {
		return rendered, true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || pgErr.Code == "54001") {
		return 0, false
	}
	t.Fatalf("PostgreSQL on %q: %v", p, err)
	return 0, false
}

// withinNumberBounds is the oracle of the number bounds, written apart
// from the implementation: every number literal (encoding/json keeps its
// text) has at most MaxNumberDigits digits and an exponent within
// ±MaxNumberExponent, and PostgreSQL's own rendering of all of them exceeds
// what is written by at most the payload's size plus MaxNumberGrowthSlack.
func withinNumberBounds(t *testing.T, conn *pgx.Conn, p string) bool {
	dec := json.NewDecoder(strings.NewReader(p))
	dec.UseNumber()
	var literals []string
	depth, maxDepth := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil { // io.EOF at the end
			break
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '[' || v == '{' {
				depth++
				maxDepth = max(maxDepth, depth)
			} else {
				depth--
			}
		case json.Number:
			literals = append(literals, string(v))
		}
	}
	if maxDepth > fence.MaxPayloadDepth {
		return false
	}
	for _, n := range literals {
		mant, exp, _ := strings.Cut(strings.ToLower(n), "e")
		if len(strings.ReplaceAll(strings.TrimPrefix(mant, "-"), ".", "")) > fence.MaxNumberDigits {
			return false
		}
		if exp != "" {
			e, ok := new(big.Int).SetString(strings.TrimPrefix(exp, "+"), 10)
			if !ok || e.CmpAbs(big.NewInt(fence.MaxNumberExponent)) > 0 {
				return false
			}
		}
	}
	if len(literals) == 0 {
		return true
	}
	var growth int64
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT coalesce(sum(greatest(0, length(n::numeric::text) - length(n))), 0) FROM unnest($1::text[]) n`,
		literals).Scan(&growth))
	return growth <= int64(len(p)+fence.MaxNumberGrowthSlack)
}

// FuzzNormalizePayload: the fence accepts a payload exactly when PostgreSQL's
// jsonb accepts it and it is within the bounds (size, nesting, numbers),
// and what it accepts renders small.
func FuzzNormalizePayload(f *testing.F) {
	const maxPayload = 64 << 10
	for _, p := range hugeNumbers {
		f.Add([]byte(p))
	}
	for _, p := range withinBounds {
		f.Add([]byte(p))
	}
	for _, p := range []string{``, `null`, `{"a":"\u0000"}`, `"\ud800"`, `"\udc00\ud800"`, `"\ud83d\ude00"`, "\"\xff\"",
		strings.Repeat("[", 512) + strings.Repeat("]", 512), strings.Repeat("[", 513) + strings.Repeat("]", 513),
		strings.Repeat("9", 5000), `-0`, `0e99999`, `1E+0001000`, `{"a":1,"a":2}`, ` [1 , 2] `, `01`, `1.`, `"\u0061"`} {
		f.Add([]byte(p))
	}
	conn := pgJSON(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		stored, err := fence.NormalizePayload(p, maxPayload)
		accepted := err == nil
		var want bool
		switch {
		case len(p) == 0:
			want = true // stored as null
		case len(p) > maxPayload:
			want = false
		default:
			_, pgOK := pgRendering(t, conn, string(p))
			want = pgOK && withinNumberBounds(t, conn, string(p))
		}
		if accepted != want {
			t.Fatalf("normalizePayload accepted=%v (%v), PostgreSQL and the bounds say %v, for %q", accepted, err, want, p)
		}
		if !accepted {
			return
		}
		rendered, ok := pgRendering(t, conn, string(stored))
		if !ok || rendered > 3*len(p)+fence.MaxNumberGrowthSlack+len("null") {
			t.Fatalf("accepted %q renders %d bytes (refused %v)", p, rendered, !ok)
		}
	})
}

// FuzzCanonicalEqualsJSONB: the fence compares payloads by canonjson's form
// where PostgreSQL compares them as jsonb; the two must agree on every pair
// the fence accepts.
func FuzzCanonicalEqualsJSONB(f *testing.F) {
	for _, pair := range [][2]string{
		{`{"a":1,"b":[1.0,"x"]}`, `{"b":[1,"\u0078"],"a":1e0}`},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`[0,-0,0.0]`, `[0,0,0e5]`},
		{`1e1000`, `10e999`},
		{`1e1000`, `1e999`},
		{`"\/"`, `"/"`},
		{`"é"`, `"\u00e9"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`{"ab":1}`, `{"a":1,"b":1}`},
		{`[1,2]`, `[2,1]`},
		{`1.50`, `15e-1`},
		{`null`, ``},
	} {
		f.Add([]byte(pair[0]), []byte(pair[1]))
	}
	conn := pgJSON(f)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		na, errA := fence.NormalizePayload(a, 64<<10)
		nb, errB := fence.NormalizePayload(b, 64<<10)
		if errA != nil || errB != nil {
			return
		}
		var pgEqual bool
		if err := conn.QueryRow(context.Background(), `SELECT $1::text::jsonb = $2::text::jsonb`, string(na), string(nb)).
			Scan(&pgEqual); err != nil {
			t.Fatalf("PostgreSQL refused what the fence accepted, %q and %q: %v", a, b, err)
		}
		equal, err := canonjson.Equal(na, nb)
		require.NoError(t, err)
		if equal != pgEqual {
			t.Fatalf("canonjson says equal=%v, jsonb says %v, for %q and %q", equal, pgEqual, a, b)
		}
	})
}
