package worker

import (
	"context"
	"fmt"

	"github.com/flowness/ledger/pkg/wire"
)

// maxHeadsPerRequest is the most tasks one head request asks for (the
// service's limit).
const maxHeadsPerRequest = 1000

// headBatcher asks the ledger for task heads on behalf of every publisher
// of the client, many tasks in one request (coalescer): a worker starting
// on thousands of fresh tasks asks once per round trip instead of once per
// task. Without it, the first event of every task waited for a round trip
// of its own, and a run over fresh tasks started at a third of its steady
// rate.
type headBatcher struct {
	c *Client
	q coalescer[*headCall]
}

func newHeadBatcher(c *Client) *headBatcher {
	b := &headBatcher{c: c}
	b.q.take = func(wait []*headCall) int { return min(len(wait), maxHeadsPerRequest) }
	b.q.ask = b.ask
	return b
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
	b.q.add(call)
	select {
	case <-call.done:
		return call.reply, call.err
	case <-ctx.Done():
		return wire.TaskHeadReply{}, fmt.Errorf("worker: head of task %s: %w", task, ctx.Err())
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
