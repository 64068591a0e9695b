package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/flowness/ledger/pkg/wire"
)

// maxHeadsPerRequest is the most tasks one head request asks for (the
// service's limit).
const maxHeadsPerRequest = 1000

// headBatcher asks the ledger for task heads on behalf of every publisher
// of the client, many tasks in one request. A lookup that arrives while a
// request is in flight waits for the next one, which carries every lookup
// that arrived meanwhile: an idle client asks at once, a busy one (a
// worker starting on thousands of fresh tasks) asks once per round trip
// instead of once per task. Without it, the first event of every task waited
// for a round trip of its own, and a run over fresh tasks started at a
// third of its steady rate.
type headBatcher struct {
	c    *Client
	mu   sync.Mutex
	wait []*headCall
	busy bool // a request is in flight; new calls wait for the next one
}

type headCall struct {
	task  string
	done  chan struct{}
	reply wire.TaskHeadReply
	err   error
}

// lookup returns task's head, asked together with whatever other lookups
// are waiting; it returns early when ctx ends.
func (b *headBatcher) lookup(ctx context.Context, task string) (wire.TaskHeadReply, error) {
	call := &headCall{task: task, done: make(chan struct{})}
	b.mu.Lock()
	b.wait = append(b.wait, call)
	start := !b.busy
	b.busy = true
	b.mu.Unlock()
	if start {
		go b.run()
	}
	select {
	case <-call.done:
		return call.reply, call.err
	case <-ctx.Done():
		return wire.TaskHeadReply{}, fmt.Errorf("worker: head of task %s: %w", task, ctx.Err())
	}
}

// run sends requests while lookups wait, then goes idle.
func (b *headBatcher) run() {
	for {
		b.mu.Lock()
		calls := b.wait
		if len(calls) > maxHeadsPerRequest {
			calls, b.wait = calls[:maxHeadsPerRequest], calls[maxHeadsPerRequest:]
		} else {
			b.wait = nil
		}
		if len(calls) == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.ask(calls)
	}
}

// ask sends one request for calls' tasks and settles each call.
func (b *headBatcher) ask(calls []*headCall) {
	tasks := make([]string, len(calls))
	for i, call := range calls {
		tasks[i] = call.task
	}
	var r wire.TaskHeadsReply
	err := b.c.request(b.c.ctx, b.c.subj.TaskHead(), wire.TaskHeadRequest{Tasks: tasks}, &r)
	if err == nil && len(r.Heads) != len(calls) {
		err = fmt.Errorf("%w: %d heads answered for %d tasks", ErrUnavailable, len(r.Heads), len(calls))
	}
	for i, call := range calls {
		switch {
		case err != nil:
			call.err = fmt.Errorf("worker: head of task %s: %w", call.task, err)
		case r.Heads[i].Task != call.task:
			call.err = fmt.Errorf("worker: head of task %s: the service answered for task %q: %w", call.task, r.Heads[i].Task, ErrUnavailable)
		default:
			call.reply = r.Heads[i]
		}
		close(call.done)
	}
}
