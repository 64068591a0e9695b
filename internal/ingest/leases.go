package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Micro service error codes, sent in the Nats-Service-Error-Code header next
// to the contract's JSON error body.
const (
	codeInvalid     = "400"
	codeForbidden   = "403"
	codeNoLease     = "404"
	codeHeld        = "409"
	codeLost        = "412"
	codeUnavailable = "503"
)

// leaseRequestTimeout bounds one request's database work.
const leaseRequestTimeout = 5 * time.Second

// leaseService serves docs/contract.md §1 as the NATS micro service "ledger".
type leaseService struct {
	nc       *nats.Conn
	fair     *fairQueue
	store    *fence.Store
	subjects wire.Subjects
	log      *slog.Logger
	ctx      context.Context
	metrics  *metrics
	outage   outage
	witness  *witness
	view     *leaseView // nil: no view
	// maxPayload is the largest event payload, and so of a verdict
	// lookup's content.
	maxPayload int
	// maxLeases and maxTTL are Config.MaxLeasesPerPrincipal and
	// Config.MaxLeaseTTL; 0 sets no cap.
	maxLeases int
	maxTTL    time.Duration
	// noLookupBatches answers a batch of lookups as an ingest older than
	// it does (a test seam: TestHooks.NoLookupBatches).
	noLookupBatches bool
}

// outage logs a run of unavailable answers once per cause, and once more
// when requests are served again: a failover is one line per cause, not
// one per request.
type outage struct {
	mu     sync.Mutex
	since  time.Time
	failed int
	causes map[string]bool
}

// causeOf names what made err: its SQLSTATE, or its words without the
// numbers (ports, addresses) that differ from one request to the next.
func causeOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return "sqlstate " + pgErr.Code
	}
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, err.Error())
}

func (o *outage) fail(log *slog.Logger, endpoint string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed == 0 {
		o.since, o.causes = time.Now(), map[string]bool{}
	}
	o.failed++
	cause := causeOf(err)
	if o.causes[cause] || len(o.causes) >= 16 {
		return
	}
	o.causes[cause] = true
	level := slog.LevelError
	if fence.IsTransient(err) || errors.Is(err, context.DeadlineExceeded) {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "lease requests failing: the database cannot serve them; answering unavailable until it can",
		slog.String("endpoint", endpoint), slog.String("error", err.Error()))
}

func (o *outage) served(log *slog.Logger) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed == 0 {
		return
	}
	log.Info("lease requests served again", slog.Int("failed", o.failed),
		slog.String("after", time.Since(o.since).Round(time.Millisecond).String()))
	o.failed = 0
}

func startLeaseService(ctx context.Context, nc *nats.Conn, store *fence.Store, cfg Config, log *slog.Logger, m *metrics, w *witness, view *leaseView) (micro.Service, error) {
	ls := &leaseService{nc: nc, fair: newFairQueue(cfg), store: store, subjects: wire.Subjects{Prefix: cfg.Prefix}, log: log,
		ctx: ctx, metrics: m, witness: w, view: view, maxPayload: store.MaxPayload(),
		maxLeases: cfg.MaxLeasesPerPrincipal, maxTTL: cfg.MaxLeaseTTL, noLookupBatches: cfg.hooks != nil && cfg.hooks.noLookupBatches}
	for range cfg.LeaseWorkers {
		go ls.work(ctx)
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        wire.ServiceName,
		Version:     cfg.Version,
		Description: "ledger leases: acquire, renew, release and get partition leases; task heads",
	})
	if err != nil {
		return nil, fmt.Errorf("ingest: add micro service: %w", err)
	}
	// A holder's own operations carry its holder id in the subject, where
	// the NATS server's permissions decide who may send them (docs/contract.md §9).
	for _, ep := range []struct {
		name, subject string
		h             func(ctx context.Context, subject string, body []byte) (any, error)
	}{
		{"acquire", ls.subjects.LeaseAny(wire.LeaseAcquire), ls.acquire},
		{"renew", ls.subjects.LeaseAny(wire.LeaseRenew), ls.renew},
		{"release", ls.subjects.LeaseAny(wire.LeaseRelease), ls.release},
		{"get", ls.subjects.LeaseGet(), ls.get},
		{"task_head", ls.subjects.TaskHead(), ls.taskHead},
	} {
		if err := svc.AddEndpoint(ep.name, ls.handler(ep.name, ep.h), micro.WithEndpointSubject(ep.subject)); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("ingest: add endpoint %s: %w", ep.name, err)
		}
	}
	return svc, nil
}

// handler admits a request to the fair queue (fair.go), or refuses it at
// once; a worker goroutine serves it later.
func (ls *leaseService) handler(name string, h func(context.Context, string, []byte) (any, error)) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		// A request nobody waits for the answer of changes nothing: a lease
		// taken or released without its reply would act for a requester
		// that cannot learn what happened (or aims the reply elsewhere).
		if req.Reply() == "" {
			ls.metrics.lease(name, "no_reply")
			return
		}
		subject, data, reply := req.Subject(), req.Data(), req.Reply()
		var holder string
		if classOf(name) == classRenew || name == wire.LeaseAcquire {
			holder, _ = ls.subjects.ParseLease(name, subject)
		}
		j := &fairJob{principal: requesterOf(holder, nats.Header(req.Headers()), reply), endpoint: name, class: classOf(name)}
		j.serve = func(ctx context.Context) { ls.serve(ctx, name, h, subject, data, reply) }
		if code := ls.fair.admit(j); code != "" {
			ls.refuse(name, j.principal, code, req)
		}
	})
}

// serve answers one admitted request.
func (ls *leaseService) serve(ctx context.Context, name string, h func(context.Context, string, []byte) (any, error), subject string, data []byte, reply string) {
	ctx, cancel := context.WithTimeout(ctx, leaseRequestTimeout)
	defer cancel()
	out, err := h(ctx, subject, data)
	if err != nil {
		ls.replyError(name, reply, err)
		return
	}
	ls.metrics.lease(name, "ok")
	ls.outage.served(ls.log)
	b, _ := json.Marshal(out)
	ls.respond(name, &nats.Msg{Subject: reply, Data: b})
}

func (ls *leaseService) respond(name string, m *nats.Msg) {
	if err := ls.nc.PublishMsg(m); err != nil {
		ls.log.Warn("lease reply failed", slog.String("endpoint", name), slog.String("error", err.Error()))
	}
}

func (ls *leaseService) replyError(name, reply string, err error) {
	body := wire.ErrorReply{Error: wire.ErrCodeInvalid, Message: err.Error()}
	code := codeInvalid
	var le *fence.LeaseError
	switch {
	case errors.As(err, &le):
		body.Error = le.Code()
		code = map[string]string{wire.ErrCodeHeld: codeHeld, wire.ErrCodeLost: codeLost,
			wire.ErrCodeNoLease: codeNoLease, wire.ErrCodeInvalid: codeInvalid,
			wire.ErrCodeForbidden: codeForbidden}[body.Error]
		if cur := le.Current; cur != nil {
			body.Holder, body.Generation, body.ExpiresAt = cur.Holder, cur.Generation, wire.FormatTime(cur.ExpiresAt)
		}
		body.Revoked, body.Cordoned = operatorAction(le.Revoked), operatorAction(le.Cordon)
	case errors.Is(err, errBadRequest):
	default:
		// The database's own words go to the log only: they name hosts,
		// users, databases, tables and statements, none of which is the
		// requester's business or anything it could act on.
		body.Error, code = wire.ErrCodeUnavailable, codeUnavailable
		body.Message = unavailableMessage
		ls.outage.fail(ls.log, name, err)
	}
	if name == "get" {
		body.Partitions = ls.store.Partitions()
	}
	ls.metrics.lease(name, body.Error)
	b, _ := json.Marshal(body)
	m := &nats.Msg{Subject: reply, Data: b, Header: nats.Header{}}
	m.Header.Set(micro.ErrorHeader, body.Message)
	m.Header.Set(micro.ErrorCodeHeader, code)
	ls.respond(name, m)
}

// unavailableMessage is the whole message of an unavailable reply; the
// cause is logged.
const unavailableMessage = "the ledger's database could not serve the request; nothing changed; retry"

// errBadRequest marks a request refused before it reached the database;
// the reply is invalid, with the error's message.
var errBadRequest = errors.New("bad request")

// maxRequestBody bounds a request body (but a task head request's, which
// may list many tasks: maxTaskHeadsBody): the largest valid one is about 150
// bytes, so anything much larger is refused before it is parsed.
const maxRequestBody = 4 << 10

// maxTaskHeadsBody bounds a task head request: fence.MaxTaskHeads ids of at
// most 128 bytes each, quoted and separated.
const maxTaskHeadsBody = fence.MaxTaskHeads*(wire.MaxIDLen+3) + 64

// maxLookupBody bounds a verdict lookup that carries the event's content:
// a payload of the deployment's largest, escaped as a JSON string (at most
// twice its size), and the other members.
func maxLookupBody(maxPayload int) int { return max(maxTaskHeadsBody, 2*maxPayload+maxRequestBody) }

// maxLookupsBody bounds a batch of lookups: NATS's default max_payload, or
// one lookup's bound if larger. A client splits a larger batch; the NATS
// server's own max_payload may bound it lower.
func maxLookupsBody(maxPayload int) int { return max(1<<20, maxLookupBody(maxPayload)) }

// Kinds of request body members.
const (
	memberInt = iota + 1
	memberString
	memberStringList // an array of strings, no deeper
	memberLookupList // an array of flat objects of lookupMembers
)

var (
	leaseMembers = map[string]int{"partition": memberInt, "holder": memberString, "generation": memberInt,
		"ttl_ms": memberInt, "request_id": memberString}
	taskHeadMembers = map[string]int{"task": memberString, "event_id": memberString, "tasks": memberStringList,
		"version": memberInt, "type": memberString, "payload": memberString, "lookups": memberLookupList}
	// lookupMembers are the members of one lookup of a batch: a single
	// lookup's, so one rule reads both.
	lookupMembers = map[string]int{"task": memberString, "event_id": memberString,
		"version": memberInt, "type": memberString, "payload": memberString}
)

// flatLists are the array members of a request body.
type flatLists struct {
	strings map[string][]string
	// lookups is the lookups member, each a flat object's members.
	lookups []map[string]string
	has     map[string]bool
}

// decodeLeaseRequest decodes and checks the body of an acquire, renew,
// release or get request (op); holder is the holder its subject names
// (empty for get). It checks the members op uses (partition within
// [0, 2^31), generation >= 1, ttl_ms within the contract's bounds, a holder
// in the body that must be the subject's) and ignores the others, which the
// contract lets a body carry. Every refusal wraps errBadRequest. The
// partition's upper bound, the deployment's partition count, is the
// store's to check.
func decodeLeaseRequest(op, holder string, data []byte) (wire.LeaseRequest, error) {
	var r wire.LeaseRequest
	m, _, err := decodeFlatObject(data, leaseMembers, maxRequestBody)
	if err != nil {
		return r, err
	}
	p, ok, err := intMember(m, "partition", 0, math.MaxInt32)
	switch {
	case err != nil:
		return r, err
	case !ok:
		return r, fmt.Errorf("%w: partition is required", errBadRequest)
	}
	partition := int(p)
	r.Partition = &partition
	if op != "get" {
		if h, ok := m["holder"]; ok && h != holder {
			return r, fmt.Errorf("%w: holder %s in the body is not the subject's, %q", errBadRequest, quoteShort(h), holder)
		}
		r.Holder = holder
	}
	if id, ok := m["request_id"]; ok {
		switch {
		case op != wire.LeaseAcquire:
			return r, fmt.Errorf("%w: request_id is allowed only on an acquire, not on a %s", errBadRequest, op)
		case !wire.ValidID(id) || len(id) > 64:
			return r, fmt.Errorf("%w: request_id %s is not 1..64 of [A-Za-z0-9_-]", errBadRequest, quoteShort(id))
		}
		r.RequestID = id
	}
	if op == "renew" || op == "release" {
		g, ok, err := intMember(m, "generation", 1, math.MaxInt64)
		switch {
		case err != nil:
			return r, err
		case !ok:
			return r, fmt.Errorf("%w: generation is required", errBadRequest)
		}
		r.Generation = &g
	}
	if op == "acquire" || op == "renew" {
		ttl, ok, err := intMember(m, "ttl_ms", wire.TTLMinMillis, wire.TTLMaxMillis)
		if err != nil {
			return r, err
		}
		if ok {
			r.TTLMillis = &ttl
		}
	}
	return r, nil
}

// decodeTaskHeadRequest decodes and checks the body of a task head request:
// a valid task id and, optionally, an event id (a ULID) with the event's
// content; or a list of tasks; or a list of lookups.
func decodeTaskHeadRequest(data []byte, maxPayload int) (wire.TaskHeadRequest, error) {
	var r wire.TaskHeadRequest
	m, lists, err := decodeFlatObject(data, taskHeadMembers, maxLookupsBody(maxPayload))
	if err != nil {
		return r, err
	}
	if lists.has["lookups"] {
		return decodeLookups(m, lists, maxPayload)
	}
	if len(data) > maxLookupBody(maxPayload) {
		return r, fmt.Errorf("%w: body of %d bytes is larger than %d", errBadRequest, len(data), maxLookupBody(maxPayload))
	}
	if _, hasContent := m["payload"]; !hasContent && len(data) > maxTaskHeadsBody {
		return r, fmt.Errorf("%w: body of %d bytes is larger than %d", errBadRequest, len(data), maxTaskHeadsBody)
	}
	if tasks, ok := lists.strings["tasks"]; ok {
		// A batch of heads: a worker starting on many tasks at once.
		_, single := m["task"]
		_, hasVersion := m["version"]
		_, hasType := m["type"]
		_, hasPayload := m["payload"]
		if single || m["event_id"] != "" || hasVersion || hasType || hasPayload {
			return r, fmt.Errorf("%w: tasks goes without task, event_id and content", errBadRequest)
		}
		if len(tasks) == 0 || len(tasks) > fence.MaxTaskHeads {
			return r, fmt.Errorf("%w: tasks must list 1..%d task ids, not %d", errBadRequest, fence.MaxTaskHeads, len(tasks))
		}
		for _, task := range tasks {
			if !wire.ValidID(task) {
				return r, fmt.Errorf("%w: task %s is not 1..128 of [A-Za-z0-9_-]", errBadRequest, quoteShort(task))
			}
		}
		r.Tasks = tasks
		return r, nil
	}
	l, err := decodeLookup(m, maxPayload, false)
	if err != nil {
		return r, err
	}
	r.Task, r.EventID, r.Version, r.Type, r.Payload = l.Task, l.EventID, l.Version, l.Type, l.Payload
	return r, nil
}

// decodeLookups checks a batch of lookups: each by a single lookup's rule,
// with its event id required. The list goes alone.
func decodeLookups(m map[string]string, lists flatLists, maxPayload int) (wire.TaskHeadRequest, error) {
	var r wire.TaskHeadRequest
	if len(m) > 0 || lists.has["tasks"] {
		return r, fmt.Errorf("%w: lookups goes alone, each lookup with its own task and event_id", errBadRequest)
	}
	if len(lists.lookups) == 0 {
		return r, fmt.Errorf("%w: lookups must list 1..%d lookups, not 0", errBadRequest, fence.MaxLookups)
	}
	r.Lookups = make([]wire.VerdictLookup, len(lists.lookups))
	for i, lm := range lists.lookups {
		l, err := decodeLookup(lm, maxPayload, true)
		if err != nil {
			return wire.TaskHeadRequest{}, fmt.Errorf("lookup %d: %w", i, err)
		}
		r.Lookups[i] = l
	}
	return r, nil
}

// decodeLookup checks a task, an event id (required if needID) and the
// event's content: the members of a single lookup, or of one in a batch.
func decodeLookup(m map[string]string, maxPayload int, needID bool) (wire.VerdictLookup, error) {
	var l wire.VerdictLookup
	_, hasVersion := m["version"]
	_, hasType := m["type"]
	payload, hasPayload := m["payload"]
	if hasVersion || hasType || hasPayload {
		// The event's content, for its verdict (contract v3).
		if m["event_id"] == "" || !hasVersion || !hasType || !hasPayload {
			return l, fmt.Errorf("%w: version, type and payload go together, with event_id", errBadRequest)
		}
		var err error
		if l.Version, err = wire.ParseInt(m["version"]); err != nil || l.Version < 1 {
			return l, fmt.Errorf("%w: version %s is not an integer of at least 1", errBadRequest, quoteShort(m["version"]))
		}
		if l.Type = m["type"]; !wire.ValidType(l.Type) {
			return l, fmt.Errorf("%w: type %s is not 1..64 of [A-Za-z0-9_.:-]", errBadRequest, quoteShort(l.Type))
		}
		if len(payload) > maxPayload {
			return l, fmt.Errorf("%w: payload of %d bytes is larger than %d", errBadRequest, len(payload), maxPayload)
		}
		l.Payload = &payload
	}
	l.Task = m["task"]
	if !wire.ValidID(l.Task) {
		return l, fmt.Errorf("%w: task %s is not 1..128 of [A-Za-z0-9_-]", errBadRequest, quoteShort(l.Task))
	}
	id, ok := m["event_id"]
	switch {
	case !ok && needID:
		return l, fmt.Errorf("%w: a lookup needs its event_id", errBadRequest)
	case ok && !wire.ValidEventID(id):
		return l, fmt.Errorf("%w: event_id %s is not a ULID", errBadRequest, quoteShort(id))
	}
	l.EventID = id
	return l, nil
}

// decodeFlatObject reads data as exactly one JSON object whose members are
// all named in members, each at most once, each a scalar of its kind or
// null (which counts as absent). It returns the non-null members: strings
// unescaped, integers as their literal. It is stricter than encoding/json
// on purpose: a repeated name, or one cased differently, could be read one
// way by a proxy or another client and another way here; and a nested
// value is refused at its first bracket, so no depth costs anything. The
// one nesting allowed is a list of lookups, each a flat object.
func decodeFlatObject(data []byte, members map[string]int, maxBody int) (map[string]string, flatLists, error) {
	var lists flatLists
	if len(data) > maxBody {
		return nil, lists, fmt.Errorf("%w: body of %d bytes is larger than %d", errBadRequest, len(data), maxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, lists, fmt.Errorf("%w: body is not a JSON object", errBadRequest)
	}
	out, err := readMembers(dec, members, &lists)
	if err != nil {
		return nil, lists, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, lists, fmt.Errorf("%w: data after the JSON object", errBadRequest)
	}
	return out, lists, nil
}

// readMembers reads the rest of an object (its '{' read) as
// decodeFlatObject does; lists takes its array members, and is nil inside
// a lookup, where none is allowed.
func readMembers(dec *json.Decoder, members map[string]int, lists *flatLists) (map[string]string, error) {
	out := make(map[string]string, len(members))
	seen := make(map[string]bool, len(members))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: body is not a JSON object: %v", errBadRequest, err)
		}
		name, _ := t.(string) // inside an object, Token yields names here
		kind, known := members[name]
		switch {
		case !known:
			return nil, fmt.Errorf("%w: unknown field %s", errBadRequest, quoteShort(name))
		case seen[name]:
			return nil, fmt.Errorf("%w: field %s appears twice", errBadRequest, name)
		}
		seen[name] = true
		v, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: value of %s is not JSON: %v", errBadRequest, name, err)
		}
		if v == json.Delim('[') && (kind == memberStringList || kind == memberLookupList) {
			if err := readList(dec, name, kind, lists); err != nil {
				return nil, err
			}
			continue
		}
		switch v := v.(type) {
		case nil:
		case string:
			if kind != memberString {
				return nil, fmt.Errorf("%w: %s must be %s", errBadRequest, name, kindNames[kind])
			}
			out[name] = v
		case json.Number:
			if kind != memberInt {
				return nil, fmt.Errorf("%w: %s must be %s", errBadRequest, name, kindNames[kind])
			}
			// Every integer member is checked, used or not, so what is
			// accepted reads the same to any JSON decoder that fits int64.
			if _, err := strconv.ParseInt(v.String(), 10, 64); err != nil {
				return nil, fmt.Errorf("%w: %s %s is not a 64-bit integer", errBadRequest, name, quoteShort(v.String()))
			}
			out[name] = v.String()
		default: // a bool, or the start of an object or array
			return nil, fmt.Errorf("%w: %s must be %s", errBadRequest, name, kindNames[kind])
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("%w: body is not a JSON object: %v", errBadRequest, err)
	}
	return out, nil
}

var kindNames = map[int]string{memberInt: "an integer", memberString: "a string",
	memberStringList: "an array of strings", memberLookupList: "an array of lookups"}

// readList reads the rest of an array member (its '[' read) into lists.
func readList(dec *json.Decoder, name string, kind int, lists *flatLists) error {
	if lists.has == nil {
		lists.has = map[string]bool{}
	}
	lists.has[name] = true
	if kind == memberStringList {
		list, err := readStringList(dec, name)
		if lists.strings == nil {
			lists.strings = map[string][]string{}
		}
		lists.strings[name] = list
		return err
	}
	for dec.More() {
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return fmt.Errorf("%w: %s must be an array of objects", errBadRequest, name)
		}
		if len(lists.lookups) == fence.MaxLookups {
			return fmt.Errorf("%w: %s must list 1..%d lookups, not more", errBadRequest, name, fence.MaxLookups)
		}
		m, err := readMembers(dec, lookupMembers, nil)
		if err != nil {
			return fmt.Errorf("lookup %d: %w", len(lists.lookups), err)
		}
		lists.lookups = append(lists.lookups, m)
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return fmt.Errorf("%w: value of %s is not JSON: %v", errBadRequest, name, err)
	}
	return nil
}

// readStringList reads the rest of an array of strings (its '[' read): a
// nested value or another kind is refused at its first token.
func readStringList(dec *json.Decoder, name string) ([]string, error) {
	var list []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: value of %s is not JSON: %v", errBadRequest, name, err)
		}
		str, ok := t.(string)
		if !ok {
			return nil, fmt.Errorf("%w: %s must be an array of strings", errBadRequest, name)
		}
		list = append(list, str)
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return nil, fmt.Errorf("%w: value of %s is not JSON: %v", errBadRequest, name, err)
	}
	return list, nil
}

// intMember parses member name of m as an integer in [lo, hi].
func intMember(m map[string]string, name string, lo, hi int64) (int64, bool, error) {
	lit, ok := m[name]
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(lit, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, false, fmt.Errorf("%w: %s %s is out of range [%d, %d]", errBadRequest, name, quoteShort(lit), lo, hi)
	case err != nil:
		return 0, false, fmt.Errorf("%w: %s %s is not an integer", errBadRequest, name, quoteShort(lit))
	case n < lo || n > hi:
		return 0, false, fmt.Errorf("%w: %s %s is out of range [%d, %d]", errBadRequest, name, quoteShort(lit), lo, hi)
	}
	return n, true, nil
}

// quoteShort quotes s for an error message, cut to 40 bytes: a reply stays
// small whatever the request carried.
func quoteShort(s string) string {
	if len(s) <= 40 {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:40]), len(s))
}

// ttlOf is the TTL a request asked for, or 0 for the store's default.
func ttlOf(r wire.LeaseRequest) time.Duration {
	if r.TTLMillis == nil {
		return 0
	}
	return time.Duration(*r.TTLMillis) * time.Millisecond
}

// headReply is a task's head as the contract tells it.
func headReply(h fence.Head) wire.TaskHeadReply {
	r := wire.TaskHeadReply{Task: h.Task, Version: h.Version, Seq: h.Seq}
	if h.Known {
		p, typ, kind := h.Partition, h.Type, h.Kind
		r.Partition, r.Type, r.Kind = &p, &typ, &kind
	}
	if h.Owner != "" {
		owner := h.Owner
		r.Owner = &owner
	}
	return r
}

func leaseReply(l fence.Lease, withValid bool) wire.LeaseReply {
	r := wire.LeaseReply{Partition: l.Partition, Holder: l.Holder, Generation: l.Generation,
		ExpiresAt: wire.FormatTime(l.ExpiresAt), TTLMillis: l.TTL.Milliseconds()}
	if withValid {
		v := l.Valid
		r.Valid = &v
	}
	return r
}

func (ls *leaseService) acquire(ctx context.Context, subject string, data []byte) (any, error) {
	holder, err := ls.subjects.ParseLease(wire.LeaseAcquire, subject)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	r, err := decodeLeaseRequest(wire.LeaseAcquire, holder, data)
	if err != nil {
		return nil, err
	}
	if err := ls.withinCaps(ctx, r); err != nil {
		return nil, err
	}
	floor, err := ls.witness.floor(ctx, *r.Partition)
	if err != nil {
		return nil, err
	}
	l, err := ls.store.Acquire(ctx, *r.Partition, r.Holder, ttlOf(r), fence.WithRequestID(r.RequestID),
		fence.WithGenerationFloor(floor))
	if err != nil {
		return nil, err
	}
	// The grant is witnessed before anyone learns of it: a retry of the
	// request gets the same grant and witnesses it again.
	if err := ls.witness.grant(ctx, l.Partition, l.Generation); err != nil {
		return nil, err
	}
	ls.log.Info("lease granted", slog.Int("partition", l.Partition), slog.String("holder", l.Holder),
		slog.Int64("generation", l.Generation))
	ls.view.granted(l)
	if l.Generation > 1 {
		ls.metrics.takeover()
	}
	return leaseReply(l, false), nil
}

// withinCaps refuses an acquire beyond this deployment's caps: a TTL
// above MaxLeaseTTL, or a principal that already holds MaxLeasesPerPrincipal
// unexpired leases of other partitions. The count is read from the lease
// table as the acquire begins; two acquires of one principal racing on
// several ingests may pass it together, so the cap can be exceeded by the
// number of ingests at most.
func (ls *leaseService) withinCaps(ctx context.Context, r wire.LeaseRequest) error {
	if err := ls.withinTTLCap(r); err != nil || ls.maxLeases == 0 {
		return err
	}
	leases, err := ls.store.Leases(ctx)
	if err != nil {
		return err
	}
	principal, held := wire.Principal(r.Holder), 0
	for _, l := range leases {
		if l.Valid && l.Partition != *r.Partition && wire.Principal(l.Holder) == principal {
			held++
		}
	}
	if held >= ls.maxLeases {
		return fmt.Errorf("%w: principal %s holds %d leases, the most this deployment allows one principal", errBadRequest, principal, held)
	}
	return nil
}

// withinTTLCap refuses a ttl_ms above MaxLeaseTTL.
func (ls *leaseService) withinTTLCap(r wire.LeaseRequest) error {
	if ls.maxTTL != 0 && ttlOf(r) > ls.maxTTL {
		return fmt.Errorf("%w: ttl_ms %d is above %d, the most this deployment allows", errBadRequest, ttlOf(r).Milliseconds(), ls.maxTTL.Milliseconds())
	}
	return nil
}

func (ls *leaseService) renew(ctx context.Context, subject string, data []byte) (any, error) {
	holder, err := ls.subjects.ParseLease(wire.LeaseRenew, subject)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	r, err := decodeLeaseRequest(wire.LeaseRenew, holder, data)
	if err != nil {
		return nil, err
	}
	if err := ls.withinTTLCap(r); err != nil {
		return nil, err
	}
	l, err := ls.store.Renew(ctx, *r.Partition, r.Holder, *r.Generation, ttlOf(r))
	if err != nil {
		return nil, err
	}
	ls.view.granted(l)
	return leaseReply(l, false), nil
}

func (ls *leaseService) release(ctx context.Context, subject string, data []byte) (any, error) {
	holder, err := ls.subjects.ParseLease(wire.LeaseRelease, subject)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	r, err := decodeLeaseRequest(wire.LeaseRelease, holder, data)
	if err != nil {
		return nil, err
	}
	if err := ls.store.Release(ctx, *r.Partition, r.Holder, *r.Generation); err != nil {
		return nil, err
	}
	ls.view.released(*r.Partition, r.Holder, *r.Generation)
	return wire.ReleaseReply{Partition: *r.Partition, Released: true}, nil
}

func (ls *leaseService) get(ctx context.Context, _ string, data []byte) (any, error) {
	r, err := decodeLeaseRequest("get", "", data)
	if err != nil {
		return nil, err
	}
	l, err := ls.store.Get(ctx, *r.Partition)
	if err != nil {
		return nil, err
	}
	reply := leaseReply(l, true)
	reply.Partitions = ls.store.Partitions()
	return reply, nil
}

func (ls *leaseService) taskHead(ctx context.Context, _ string, data []byte) (any, error) {
	r, err := decodeTaskHeadRequest(data, ls.maxPayload)
	if err != nil {
		return nil, err
	}
	if len(r.Lookups) > 0 {
		return ls.lookups(ctx, r.Lookups)
	}
	if len(r.Tasks) > 0 {
		heads, err := ls.store.TaskHeads(ctx, r.Tasks)
		if err != nil {
			return nil, err
		}
		out := wire.TaskHeadsReply{Heads: make([]wire.TaskHeadReply, len(heads))}
		for i, h := range heads {
			out.Heads[i] = headReply(h)
		}
		return out, nil
	}
	h, err := ls.store.TaskHead(ctx, r.Task)
	if err != nil {
		return nil, err
	}
	reply := headReply(h)
	if r.EventID == "" {
		return reply, nil
	}
	// A worker whose receipt was lost learns the event's verdict here.
	var content *fence.Content
	if r.Payload != nil {
		content = &fence.Content{Version: r.Version, Type: r.Type, Payload: []byte(*r.Payload)}
	}
	rec, found, err := ls.store.VerdictFor(ctx, r.Task, r.EventID, content)
	if err != nil {
		return nil, err
	}
	return eventReply(reply, rec, found), nil
}

// eventReply is a lookup's answer: the task's head, and the verdict
// recorded for the event if found.
func eventReply(head wire.TaskHeadReply, rec fence.Recorded, found bool) wire.TaskHeadEventReply {
	out := wire.TaskHeadEventReply{TaskHeadReply: head}
	if found {
		out.Event = &wire.EventVerdict{EventID: rec.EventID, Verdict: rec.Verdict, Reason: rec.Reason, Seq: rec.Seq}
	}
	return out
}

// lookups answers a batch of verdict lookups in one round trip to the
// database: after a loss a worker has thousands to ask, and one request
// each would be refused busy by the principal's fair share.
func (ls *leaseService) lookups(ctx context.Context, asked []wire.VerdictLookup) (any, error) {
	if ls.noLookupBatches {
		// What an ingest older than the batch form answers.
		return nil, fmt.Errorf("%w: unknown field %s", errBadRequest, quoteShort("lookups"))
	}
	lookups := make([]fence.Lookup, len(asked))
	for i, l := range asked {
		lookups[i] = fence.Lookup{Task: l.Task, EventID: l.EventID}
		if l.Payload != nil {
			lookups[i].Content = &fence.Content{Version: l.Version, Type: l.Type, Payload: []byte(*l.Payload)}
		}
	}
	looked, err := ls.store.VerdictsFor(ctx, lookups)
	if err != nil {
		return nil, err
	}
	out := wire.TaskHeadEventsReply{Heads: make([]wire.TaskHeadEventReply, len(looked))}
	for i, l := range looked {
		out.Heads[i] = eventReply(headReply(l.Head), l.Recorded, l.Found)
	}
	return out, nil
}
