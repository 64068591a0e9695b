package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Micro service error codes, sent in the Nats-Service-Error-Code header next
// to the contract's JSON error body.
const (
	codeInvalid     = "400"
	codeNoLease     = "404"
	codeHeld        = "409"
	codeLost        = "412"
	codeUnavailable = "503"
)

// leaseRequestTimeout bounds one request's database work.
const leaseRequestTimeout = 5 * time.Second

// leaseService serves CONTRACT §1 as the NATS micro service "ledger".
type leaseService struct {
	store    *fence.Store
	subjects wire.Subjects
	log      *slog.Logger
	ctx      context.Context
	metrics  *metrics
}

func startLeaseService(ctx context.Context, nc *nats.Conn, store *fence.Store, cfg Config, log *slog.Logger, m *metrics) (micro.Service, error) {
	ls := &leaseService{store: store, subjects: wire.Subjects{Prefix: cfg.Prefix}, log: log,
		ctx: ctx, metrics: m}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        wire.ServiceName,
		Version:     cfg.Version,
		Description: "ledger leases: acquire, renew, release and get partition leases; task heads",
	})
	if err != nil {
		return nil, fmt.Errorf("ingest: add micro service: %w", err)
	}
	for _, ep := range []struct {
		name, subject string
		h             func(context.Context, []byte) (any, error)
	}{
		{"acquire", ls.subjects.LeaseAcquire(), ls.acquire},
		{"renew", ls.subjects.LeaseRenew(), ls.renew},
		{"release", ls.subjects.LeaseRelease(), ls.release},
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

// handler answers a request inside micro's callback. Micro records the
// reply's error for its stats after the callback returns, so replying from
// another goroutine would race with it; each endpoint is served in order,
// and several ingest processes share the load through the queue group.
func (ls *leaseService) handler(name string, h func(context.Context, []byte) (any, error)) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		ctx, cancel := context.WithTimeout(ls.ctx, leaseRequestTimeout)
		defer cancel()
		reply, err := h(ctx, req.Data())
		if err != nil {
			ls.replyError(name, req, err)
			return
		}
		ls.metrics.lease(name, "ok")
		b, _ := json.Marshal(reply)
		if err := req.Respond(b); err != nil {
			ls.log.Warn("lease reply failed", slog.String("endpoint", name), slog.String("error", err.Error()))
		}
	})
}

func (ls *leaseService) replyError(name string, req micro.Request, err error) {
	body := wire.ErrorReply{Error: wire.ErrCodeInvalid, Message: err.Error()}
	code := codeInvalid
	var le *fence.LeaseError
	switch {
	case errors.As(err, &le):
		body.Error = le.Code()
		code = map[string]string{wire.ErrCodeHeld: codeHeld, wire.ErrCodeLost: codeLost,
			wire.ErrCodeNoLease: codeNoLease, wire.ErrCodeInvalid: codeInvalid}[body.Error]
		if cur := le.Current; cur != nil {
			body.Holder, body.Generation, body.ExpiresAt = cur.Holder, cur.Generation, wire.FormatTime(cur.ExpiresAt)
		}
	case errors.Is(err, errBadRequest):
	default:
		body.Error, code = wire.ErrCodeUnavailable, codeUnavailable
		body.Message = "the ledger's database is unavailable, retry: " + err.Error()
		ls.log.Warn("lease request failed", slog.String("endpoint", name), slog.String("error", err.Error()))
	}
	ls.metrics.lease(name, body.Error)
	b, _ := json.Marshal(body)
	if rerr := req.Error(code, body.Message, b); rerr != nil {
		ls.log.Warn("lease error reply failed", slog.String("endpoint", name), slog.String("error", rerr.Error()))
	}
}

var errBadRequest = errors.New("bad request")

func decodeLeaseRequest(data []byte, needHolder, needGeneration bool) (wire.LeaseRequest, error) {
	var r wire.LeaseRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("%w: body is not a lease request: %v", errBadRequest, err)
	}
	switch {
	case r.Partition == nil:
		return r, fmt.Errorf("%w: partition is required", errBadRequest)
	case needHolder && r.Holder == "":
		return r, fmt.Errorf("%w: holder is required", errBadRequest)
	case needGeneration && r.Generation == nil:
		return r, fmt.Errorf("%w: generation is required", errBadRequest)
	}
	return r, nil
}

func ttlOf(r wire.LeaseRequest) (time.Duration, error) {
	if r.TTLMillis == nil {
		return 0, nil
	}
	ms := *r.TTLMillis
	if ms < wire.TTLMinMillis || ms > wire.TTLMaxMillis {
		return 0, fmt.Errorf("%w: ttl_ms %d is outside [%d, %d]", errBadRequest, ms, wire.TTLMinMillis, wire.TTLMaxMillis)
	}
	return time.Duration(ms) * time.Millisecond, nil
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

func (ls *leaseService) acquire(ctx context.Context, data []byte) (any, error) {
	r, err := decodeLeaseRequest(data, true, false)
	if err != nil {
		return nil, err
	}
	ttl, err := ttlOf(r)
	if err != nil {
		return nil, err
	}
	l, err := ls.store.Acquire(ctx, *r.Partition, r.Holder, ttl)
	if err != nil {
		return nil, err
	}
	ls.log.Info("lease granted", slog.Int("partition", l.Partition), slog.String("holder", l.Holder),
		slog.Int64("generation", l.Generation))
	if l.Generation > 1 {
		ls.metrics.takeover()
	}
	return leaseReply(l, false), nil
}

func (ls *leaseService) renew(ctx context.Context, data []byte) (any, error) {
	r, err := decodeLeaseRequest(data, true, true)
	if err != nil {
		return nil, err
	}
	ttl, err := ttlOf(r)
	if err != nil {
		return nil, err
	}
	l, err := ls.store.Renew(ctx, *r.Partition, r.Holder, *r.Generation, ttl)
	if err != nil {
		return nil, err
	}
	return leaseReply(l, false), nil
}

func (ls *leaseService) release(ctx context.Context, data []byte) (any, error) {
	r, err := decodeLeaseRequest(data, true, true)
	if err != nil {
		return nil, err
	}
	if err := ls.store.Release(ctx, *r.Partition, r.Holder, *r.Generation); err != nil {
		return nil, err
	}
	return wire.ReleaseReply{Partition: *r.Partition, Released: true}, nil
}

func (ls *leaseService) get(ctx context.Context, data []byte) (any, error) {
	r, err := decodeLeaseRequest(data, false, false)
	if err != nil {
		return nil, err
	}
	l, err := ls.store.Get(ctx, *r.Partition)
	if err != nil {
		return nil, err
	}
	return leaseReply(l, true), nil
}

func (ls *leaseService) taskHead(ctx context.Context, data []byte) (any, error) {
	var r wire.TaskHeadRequest
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: body is not {\"task\":...}: %v", errBadRequest, err)
	}
	h, err := ls.store.TaskHead(ctx, r.Task)
	if err != nil {
		return nil, err
	}
	reply := wire.TaskHeadReply{Task: r.Task, Version: h.Version, Seq: h.Seq}
	if h.Known {
		p := h.Partition
		reply.Partition = &p
	}
	return reply, nil
}
