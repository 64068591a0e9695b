package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/conformance"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/streams"
)

// casesDir holds the cases every client runs.
const casesDir = "../../conformance/cases"

// TestTheLedgerPassesEveryConformanceCase runs each case against a fresh
// ledger: the real ingest, lease service and projector on PostgreSQL and
// an embedded NATS server.
func TestTheLedgerPassesEveryConformanceCase(t *testing.T) {
	t.Parallel()
	runEveryCase(t)
}

// The same cases against a ledger that gives each of their principals an
// inbox stream of its own (docs/operations.md, "Inboxes per principal")
// in place of the one LEDGER_IN: a client sees the same contract.
// Switch: the cases' acks expecting "LEDGER_IN" where they say "$inbox".
func TestTheLedgerWithInboxesPassesEveryConformanceCase(t *testing.T) {
	t.Parallel()
	runEveryCase(t, "conf-a", "conf-b", "conf-c")
}

// runEveryCase runs each case against a fresh ledger of its own, with
// inboxes for those principals (startLedger).
func runEveryCase(t *testing.T, inboxes ...string) {
	cases, err := conformance.Load(casesDir)
	require.NoError(t, err)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			run(t, startLedger(t, inboxes...), c)
		})
	}
}

// startLedger starts a ledger as the cases expect it and returns a
// connection to it; with inboxes, those principals have inbox streams of
// their own and there is no LEDGER_IN.
func startLedger(t *testing.T, inboxes ...string) *nats.Conn {
	db := dbtest.New(t)
	ns := natstest.Start(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	if len(inboxes) > 0 {
		js, err := jetstream.New(ns.Conn(t))
		require.NoError(t, err)
		require.NoError(t, streams.Apply(context.Background(), js, streams.Options{
			Partitions: store.Partitions(), Principals: inboxes}))
	}
	in, err := ingest.New(ingest.Config{GapWindow: conformance.GapWindowMillis * time.Millisecond},
		ingest.Deps{NC: ns.Conn(t), Store: store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	require.NoError(t, in.Start(context.Background()))
	t.Cleanup(in.Stop)
	pr, err := projector.New(projector.Config{}, projector.Deps{NC: ns.Conn(t), Pool: db.Pool, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	require.NoError(t, pr.Start(context.Background()))
	t.Cleanup(pr.Stop)
	return ns.Conn(t)
}

// receipts collects every receipt by event id, in arrival order.
type receipts struct {
	mu   sync.Mutex
	byID map[string][]map[string]any
}

// get is the n-th receipt of event id (from 0), nil until it came.
func (r *receipts) get(id string, n int) map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n >= len(r.byID[id]) {
		return nil
	}
	return r.byID[id][n]
}

func (r *receipts) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID[id])
}

func run(t *testing.T, nc *nats.Conn, c conformance.Case) {
	rs := &receipts{byID: map[string][]map[string]any{}}
	sub, err := nc.Subscribe("ledger.receipt.>", func(m *nats.Msg) {
		// A batched receipt (contract §3) is an array of receipts.
		var list []map[string]any
		var r map[string]any
		if json.Unmarshal(m.Data, &r) == nil {
			list = append(list, r)
		} else if json.Unmarshal(m.Data, &list) != nil {
			return
		}
		rs.mu.Lock()
		for _, r := range list {
			id, _ := r["event_id"].(string)
			rs.byID[id] = append(rs.byID[id], r)
		}
		rs.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	defer func() { _ = sub.Unsubscribe() }()

	for i, s := range c.Steps {
		where := fmt.Sprintf("%s step %d (%s %s %s)", c.Name, i+1, s.Step, s.Subject, s.Note)
		switch s.Step {
		case "request":
			m, err := nc.Request(s.Subject, s.Body, 5*time.Second)
			require.NoError(t, err, where)
			for k, v := range s.Expect.Headers {
				require.Equal(t, v, m.Header.Get(k), "%s: header %s", where, k)
			}
			matchJSON(t, where, "body", s.Expect.Body, m.Data)
		case "publish":
			body, err := s.PublishBody()
			require.NoError(t, err, where)
			msg := nats.NewMsg(s.Subject)
			msg.Data = body
			for k, v := range s.Headers {
				msg.Header.Set(k, v)
			}
			id := conformance.EventID(s.Headers["Nats-Msg-Id"])
			before := rs.count(id)
			ack, err := nc.RequestMsg(msg, 5*time.Second)
			require.NoError(t, err, where)
			matchJSON(t, where, "ack", s.Expect.Ack, ack.Data)
			if s.Expect.Receipt != nil {
				awaitReceipt(t, where, rs, id, before, s.Expect.Receipt)
			}
		case "receipt":
			awaitReceipt(t, where, rs, s.EventID, 0, s.Expect.Receipt)
		case "projection":
			awaitProjection(t, where, nc, s.Task, s.Expect.Value)
		case "sleep":
			time.Sleep(time.Duration(s.Millis) * time.Millisecond)
		}
	}
}

func matchJSON(t *testing.T, where, what string, want any, data []byte) {
	t.Helper()
	if want == nil {
		return
	}
	var got any
	require.NoError(t, json.Unmarshal(data, &got), "%s: %s %q", where, what, data)
	if d := conformance.Match(what, want, got); d != "" {
		t.Fatalf("%s: %s\n%s: %s", where, d, what, data)
	}
}

func awaitReceipt(t *testing.T, where string, rs *receipts, id string, n int, want any) {
	t.Helper()
	deadline := time.Now().Add(conformance.GapWindowMillis*time.Millisecond + 8*time.Second)
	for rs.get(id, n) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no receipt of event %s", where, id)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := any(rs.get(id, n))
	if d := conformance.Match("receipt", want, got); d != "" {
		b, _ := json.Marshal(got)
		t.Fatalf("%s: %s\nreceipt: %s", where, d, b)
	}
}

func awaitProjection(t *testing.T, where string, nc *nats.Conn, task string, want any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := nc.Request("$JS.API.DIRECT.GET.KV_ledger_tasks.$KV.ledger_tasks."+task, nil, 5*time.Second)
		last := "no value"
		if err == nil && m.Header.Get("Status") != "404" {
			var got any
			if err := json.Unmarshal(m.Data, &got); err != nil {
				last = err.Error()
			} else if last = conformance.Match("value", want, got); last == "" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: projection of %s: %s", where, task, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
