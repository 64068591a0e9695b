package ingest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// leaseEndpoints are the lease service's endpoints, by the name their
// request decoder knows them.
var leaseEndpoints = []string{"acquire", "renew", "release", "get", "task_head"}

// subjectHolder is the holder the request subjects of these tests name.
const subjectHolder = "worker-a.1"

// decodeRequest decodes a request body of endpoint op, sent on a subject
// of subjectHolder.
func decodeRequest(op string, data []byte) (any, error) {
	if op == "task_head" {
		return decodeTaskHeadRequest(data, wire.MaxPayloadDefault)
	}
	if op == "get" {
		return decodeLeaseRequest(op, "", data)
	}
	return decodeLeaseRequest(op, subjectHolder, data)
}

const validULID = "01JD0000000000000000000001"

var mib = strings.Repeat("a", 1<<20)

// requestCases are bodies the lease service must accept or refuse; the
// fuzz target starts from them too.
var requestCases = []struct {
	name string
	op   string
	body string
	ok   bool
}{
	{"acquire", "acquire", `{"partition":3,"holder":"worker-a.1","ttl_ms":3000}`, true},
	{"acquire without ttl", "acquire", `{"partition":0,"holder":"worker-a.1"}`, true},
	{"renew", "renew", `{"partition":3,"holder":"worker-a.1","generation":42}`, true},
	{"release", "release", `{"partition":3,"holder":"worker-a.1","generation":42}`, true},
	{"get", "get", `{"partition":3}`, true},
	{"get ignores the members it does not use", "get", `{"partition":3,"holder":"not a holder","generation":9}`, true},
	{"task head", "task_head", `{"task":"report-7"}`, true},
	{"task head with an event id", "task_head", `{"task":"report-7","event_id":"` + validULID + `"}`, true},
	{"lookup with the event's content", "task_head", `{"task":"report-7","event_id":"` + validULID + `","version":3,"type":"running","payload":"{\"a\":1}"}`, true},
	{"lookup with an empty body", "task_head", `{"task":"report-7","event_id":"` + validULID + `","version":3,"type":"running","payload":""}`, true},
	{"lookup with a large payload", "task_head", `{"task":"report-7","event_id":"` + validULID + `","version":3,"type":"running","payload":"` + strings.Repeat("a", 200<<10) + `"}`, true},
	{"lookup: a payload above the limit", "task_head", `{"task":"report-7","event_id":"` + validULID + `","version":3,"type":"running","payload":"` + strings.Repeat("a", 257<<10) + `"}`, false},
	{"lookup: content without its type", "task_head", `{"task":"report-7","event_id":"` + validULID + `","version":3,"payload":"1"}`, false},
	{"lookup: content without an event id", "task_head", `{"task":"report-7","version":3,"type":"running","payload":"1"}`, false},
	{"lookup: version 0", "task_head", `{"task":"report-7","event_id":"` + validULID + `","version":0,"type":"running","payload":"1"}`, false},
	{"lookup: a payload that is not a string", "task_head", `{"task":"report-7","event_id":"` + validULID + `","version":1,"type":"running","payload":{"a":1}}`, false},
	{"task head: a large body without content", "task_head", `{"task":"report-7","event_id":"` + validULID + `"` + strings.Repeat(" ", 200<<10) + `}`, false},
	{"heads of several tasks", "task_head", `{"tasks":["report-7","report-8"]}`, true},
	{"heads: an empty list", "task_head", `{"tasks":[]}`, false},
	{"heads: a bad id in the list", "task_head", `{"tasks":["ok","not ok"]}`, false},
	{"heads: a nested list", "task_head", `{"tasks":[["a"]]}`, false},
	{"heads: a number in the list", "task_head", `{"tasks":["a",1]}`, false},
	{"heads: with a task too", "task_head", `{"task":"a","tasks":["b"]}`, false},
	{"heads: with content", "task_head", `{"tasks":["b"],"version":1}`, false},
	{"heads: with an event id", "task_head", `{"tasks":["b"],"event_id":"` + validULID + `"}`, false},
	{"heads: 1001 tasks", "task_head", `{"tasks":["` + strings.TrimSuffix(strings.Repeat(`t","`, 1001), `","`) + `"]}`, false},
	{"tasks as a string", "task_head", `{"tasks":"a"}`, false},
	{"lookups of two events", "task_head", `{"lookups":[{"task":"a","event_id":"` + validULID + `","version":2,"type":"t","payload":"{}"},{"task":"b","event_id":"` + validULID + `"}]}`, true},
	{"lookups: a payload of 200 KiB", "task_head", `{"lookups":[{"task":"a","event_id":"` + validULID + `","version":2,"type":"t","payload":"` + strings.Repeat("a", 200<<10) + `"}]}`, true},
	{"lookups: an empty list", "task_head", `{"lookups":[]}`, false},
	{"lookups: one without an event id", "task_head", `{"lookups":[{"task":"a"}]}`, false},
	{"lookups: content without its type", "task_head", `{"lookups":[{"task":"a","event_id":"` + validULID + `","version":2,"payload":"1"}]}`, false},
	{"lookups: a bad task", "task_head", `{"lookups":[{"task":"a b","event_id":"` + validULID + `"}]}`, false},
	{"lookups: an unknown member", "task_head", `{"lookups":[{"task":"a","event_id":"` + validULID + `","tasks":["a"]}]}`, false},
	{"lookups: a repeated member", "task_head", `{"lookups":[{"task":"a","task":"b","event_id":"` + validULID + `"}]}`, false},
	{"lookups: a nested value", "task_head", `{"lookups":[{"task":{"a":1},"event_id":"` + validULID + `"}]}`, false},
	{"lookups: a string in the list", "task_head", `{"lookups":["a"]}`, false},
	{"lookups: a list in the list", "task_head", `{"lookups":[[]]}`, false},
	{"lookups: with a task too", "task_head", `{"task":"a","lookups":[{"task":"a","event_id":"` + validULID + `"}]}`, false},
	{"lookups: with tasks too", "task_head", `{"tasks":["a"],"lookups":[{"task":"a","event_id":"` + validULID + `"}]}`, false},
	{"lookups as an object", "task_head", `{"lookups":{"task":"a"}}`, false},
	{"lookups: 1001 of them", "task_head", `{"lookups":[` + strings.TrimSuffix(strings.Repeat(`{"task":"a","event_id":"`+validULID+`"},`, 1001), ",") + `]}`, false},
	{"lookups: 1000 of them", "task_head", `{"lookups":[` + strings.TrimSuffix(strings.Repeat(`{"task":"a","event_id":"`+validULID+`"},`, 1000), ",") + `]}`, true},
	{"lookups: a body over 1 MiB", "task_head", `{"lookups":[{"task":"a","event_id":"` + validULID + `"}]` + strings.Repeat(" ", 1<<20) + `}`, false},
	{"spaces, escapes, null for absent", "acquire", " {\n\"partition\" : 3 , \"hol\\u0064er\":\"worker-a.1\", \"ttl_ms\":null}\n", true},
	{"negative zero", "get", `{"partition":-0}`, true},

	{"empty body", "get", ``, false},
	{"null", "get", `null`, false},
	{"array", "get", `[{"partition":3}]`, false},
	{"string", "task_head", `"report-7"`, false},
	{"truncated", "get", `{"partition":3`, false},
	{"trailing comma", "get", `{"partition":3,}`, false},
	{"second object after the first", "get", `{"partition":3}{"partition":4}`, false},
	{"garbage after the object", "get", `{"partition":3}x`, false},
	{"invalid UTF-8", "task_head", "{\"task\":\"\xff\xfe\"}", false},
	{"NUL in a task id", "task_head", `{"task":"a\u0000b"}`, false},
	{"unknown field", "acquire", `{"partition":1,"holder":"worker-a.1","gen":4}`, false},
	{"field name cased differently", "get", `{"Partition":3}`, false},
	{"duplicate partition", "get", `{"partition":1,"partition":2}`, false},
	{"duplicate holder, one escaped", "acquire", `{"partition":1,"holder":"a","hol\u0064er":"b"}`, false},
	{"duplicate null then value", "get", `{"partition":null,"partition":2}`, false},
	{"partition as a string", "get", `{"partition":"3"}`, false},
	{"partition as a bool", "get", `{"partition":true}`, false},
	{"partition as a float", "get", `{"partition":3.0}`, false},
	{"partition in exponent form", "get", `{"partition":1e2}`, false},
	{"partition negative", "get", `{"partition":-1}`, false},
	{"partition above int32", "get", `{"partition":2147483648}`, false},
	{"partition above int64", "get", `{"partition":99999999999999999999999}`, false},
	{"partition beyond float64", "get", `{"partition":1e400}`, false},
	{"partition missing", "acquire", `{"holder":"worker-a.1"}`, false},
	{"partition null", "get", `{"partition":null}`, false},
	{"holder as a number", "acquire", `{"partition":1,"holder":7}`, false},
	{"holder left out: the subject names it", "acquire", `{"partition":1}`, true},
	{"holder of another than the subject", "acquire", `{"partition":1,"holder":"worker-b.1"}`, false},
	{"request id on an acquire", "acquire", `{"partition":1,"request_id":"` + validULID + `"}`, true},
	{"request id on a renewal", "renew", `{"partition":1,"generation":1,"request_id":"` + validULID + `"}`, false},
	{"request id with a dot", "acquire", `{"partition":1,"request_id":"a.b"}`, false},
	{"holder with a space", "acquire", `{"partition":1,"holder":"a b"}`, false},
	{"generation missing", "renew", `{"partition":1,"holder":"worker-a.1"}`, false},
	{"generation zero", "release", `{"partition":1,"holder":"worker-a.1","generation":0}`, false},
	{"generation huge", "renew", `{"partition":1,"holder":"worker-a.1","generation":18446744073709551616}`, false},
	{"unused generation huge", "get", `{"partition":1,"generation":18446744073709551616}`, false},
	{"ttl below 100 ms", "acquire", `{"partition":1,"holder":"worker-a.1","ttl_ms":99}`, false},
	{"ttl above 300000 ms", "renew", `{"partition":1,"holder":"worker-a.1","generation":1,"ttl_ms":300001}`, false},
	{"nested object", "get", `{"partition":{"partition":3}}`, false},
	{"deeply nested array", "get", `{"partition":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`, false},
	{"deeply nested body", "get", strings.Repeat(`{"a":`, 50000) + "1" + strings.Repeat("}", 50000), false},
	{"3 KiB holder, under the size limit", "acquire", `{"partition":1,"holder":"` + strings.Repeat("h", 3<<10) + `"}`, false},
	{"3 KiB field name", "get", `{"partition":1,"` + strings.Repeat("f", 3<<10) + `":1}`, false},
	{"1 MiB holder", "acquire", `{"partition":1,"holder":"` + mib + `"}`, false},
	{"1 MiB field name", "acquire", `{"` + mib + `":1}`, false},
	{"1 MiB of spaces", "get", `{"partition":3` + strings.Repeat(" ", 1<<20) + `}`, false},
	{"task missing", "task_head", `{}`, false},
	{"task too long", "task_head", `{"task":"` + strings.Repeat("t", 129) + `"}`, false},
	{"event id not a ULID", "task_head", `{"task":"t","event_id":"01JD000000000000000000000U"}`, false},
	{"event id empty", "task_head", `{"task":"t","event_id":""}`, false},
	{"event id as a number", "task_head", `{"task":"t","event_id":1}`, false},
	{"lease member on the task head", "task_head", `{"task":"t","partition":1}`, false},
}

func TestLeaseRequestsAreAcceptedOrRefusedAsInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range requestCases {
		_, err := decodeRequest(tc.op, []byte(tc.body))
		if tc.ok {
			require.NoError(t, err, tc.name)
			continue
		}
		require.Error(t, err, tc.name)
		require.ErrorIs(t, err, errBadRequest, tc.name)
		require.Less(t, len(err.Error()), 200, "%s: the message must not carry the body back: %.300s", tc.name, err)
	}
}

func TestAcceptedLeaseRequestsCarryWhatWasSent(t *testing.T) {
	t.Parallel()
	r, err := decodeLeaseRequest("renew", subjectHolder, []byte(`{"partition":3,"generation":42,"ttl_ms":600}`))
	require.NoError(t, err)
	require.Equal(t, 3, *r.Partition)
	require.Equal(t, "worker-a.1", r.Holder)
	require.EqualValues(t, 42, *r.Generation)
	require.EqualValues(t, 600, *r.TTLMillis)

	h, err := decodeTaskHeadRequest([]byte(`{"task":"report-7","event_id":"`+validULID+`"}`), wire.MaxPayloadDefault)
	require.NoError(t, err)
	require.Equal(t, wire.TaskHeadRequest{Task: "report-7", EventID: validULID}, h)
}

// FuzzLeaseRequest feeds any body to any endpoint's decoder. It must never
// panic; a refusal is a bad request (the reply is invalid) with a short
// message; and what it accepts is valid for the endpoint, reads the same to
// encoding/json, and is accepted again, unchanged, once re-encoded.
func FuzzLeaseRequest(f *testing.F) {
	for _, tc := range requestCases {
		for i, op := range leaseEndpoints {
			if op == tc.op {
				f.Add(uint8(i), []byte(tc.body))
			}
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		op := leaseEndpoints[int(which)%len(leaseEndpoints)]
		got, err := decodeRequest(op, body)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("%s refused %q without a bad request error: %v", op, body, err)
			}
			if len(err.Error()) > 200 {
				t.Fatalf("%s: refusal of %d bytes is %d bytes long", op, len(body), len(err.Error()))
			}
			return
		}
		switch r := got.(type) {
		case wire.LeaseRequest:
			checkLeaseRequest(t, op, body, r)
		case wire.TaskHeadRequest:
			checkTaskHeadRequest(t, body, r)
		}
		again, err := json.Marshal(got)
		require.NoError(t, err)
		back, err := decodeRequest(op, again)
		require.NoError(t, err, "%s: re-encoded %s is refused", op, again)
		require.Equal(t, got, back)
	})
}

func checkLeaseRequest(t *testing.T, op string, body []byte, r wire.LeaseRequest) {
	var std wire.LeaseRequest
	require.NoError(t, json.Unmarshal(body, &std), "%s accepted %q", op, body)
	require.NotNil(t, r.Partition)
	require.GreaterOrEqual(t, *r.Partition, 0)
	require.Equal(t, std.Partition, r.Partition)
	if op != "get" {
		require.Equal(t, subjectHolder, r.Holder, "%s: the holder is the subject's", op)
		require.Contains(t, []string{"", subjectHolder}, std.Holder, "%s accepted a body holder other than the subject's", op)
	}
	require.Equal(t, std.RequestID, r.RequestID)
	if op == "renew" || op == "release" {
		require.NotNil(t, r.Generation)
		require.GreaterOrEqual(t, *r.Generation, int64(1))
		require.Equal(t, std.Generation, r.Generation)
	}
	if r.TTLMillis != nil {
		require.True(t, op == "acquire" || op == "renew")
		require.GreaterOrEqual(t, *r.TTLMillis, int64(wire.TTLMinMillis))
		require.LessOrEqual(t, *r.TTLMillis, int64(wire.TTLMaxMillis))
		require.Equal(t, std.TTLMillis, r.TTLMillis)
	}
}

func checkTaskHeadRequest(t *testing.T, body []byte, r wire.TaskHeadRequest) {
	var std wire.TaskHeadRequest
	require.NoError(t, json.Unmarshal(body, &std), "task_head accepted %q", body)
	require.Equal(t, std, r)
	if len(r.Tasks) > 0 {
		require.Empty(t, r.Task)
		require.Empty(t, r.EventID)
		for _, task := range r.Tasks {
			require.True(t, wire.ValidID(task))
		}
		return
	}
	if len(r.Lookups) > 0 {
		require.Empty(t, r.Task)
		require.Empty(t, r.Tasks)
		require.LessOrEqual(t, len(r.Lookups), 1000)
		for _, l := range r.Lookups {
			require.True(t, wire.ValidID(l.Task))
			require.True(t, wire.ValidEventID(l.EventID))
			if l.Payload != nil {
				require.GreaterOrEqual(t, l.Version, int64(1))
				require.True(t, wire.ValidType(l.Type))
			} else {
				require.Zero(t, l.Version)
				require.Empty(t, l.Type)
			}
		}
		return
	}
	require.True(t, wire.ValidID(r.Task))
	require.True(t, r.EventID == "" || wire.ValidEventID(r.EventID))
}

// FuzzVerdictLookups feeds any batch of lookups to the task head decoder,
// from seeds of the batch form: it must never panic, refuse with a short
// bad request, and accept only lookups a single lookup would accept, read
// as encoding/json reads them and accepted again once re-encoded.
func FuzzVerdictLookups(f *testing.F) {
	for _, tc := range requestCases {
		if strings.Contains(tc.name, "lookups") && len(tc.body) < 4<<10 {
			f.Add([]byte(tc.body))
		}
	}
	f.Add([]byte(`{"lookups":[{"task":"a","event_id":"` + validULID + `","version":1,"type":"t","payload":null}]}`))
	f.Add([]byte(`{"lookups":[{"task":"a","event_id":"` + validULID + `"},{"task":"a","event_id":"` + validULID + `","version":9,"type":"t.x","payload":"\u0000"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := decodeTaskHeadRequest(body, wire.MaxPayloadDefault)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("refused %q without a bad request error: %v", body, err)
			}
			if len(err.Error()) > 200 {
				t.Fatalf("refusal of %d bytes is %d bytes long", len(body), len(err.Error()))
			}
			return
		}
		checkTaskHeadRequest(t, body, got)
		for _, l := range got.Lookups {
			single, err := json.Marshal(wire.TaskHeadRequest{Task: l.Task, EventID: l.EventID, Version: l.Version, Type: l.Type, Payload: l.Payload})
			require.NoError(t, err)
			_, err = decodeTaskHeadRequest(single, wire.MaxPayloadDefault)
			require.NoError(t, err, "a lookup of the batch is refused alone: %s", single)
		}
		again, err := json.Marshal(got)
		require.NoError(t, err)
		back, err := decodeTaskHeadRequest(again, wire.MaxPayloadDefault)
		require.NoError(t, err, "re-encoded %s is refused", again)
		require.Equal(t, got, back)
	})
}
