package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// MaxBatch bounds the operations of one round trip (and so the work of one
// script call).
const MaxBatch = 128

// Runner sends the operations of one Redis client, batched, and renews its
// held leases. It is safe for concurrent use.
type Runner struct {
	rdb redis.UniversalClient

	mu    sync.Mutex
	queue []*call
	busy  bool // a caller is sending

	wd watchdog
}

var runners sync.Map // redis.UniversalClient -> *Runner

// Of returns the Runner of rdb, the same for every caller, so that locks
// and records of one client share batches and one watchdog. A Runner has
// no goroutine while it has nothing to renew.
func Of(rdb redis.UniversalClient) *Runner {
	if r, ok := runners.Load(rdb); ok {
		return r.(*Runner)
	}
	r, _ := runners.LoadOrStore(rdb, newRunner(rdb))
	return r.(*Runner)
}

func newRunner(rdb redis.UniversalClient) *Runner {
	r := &Runner{rdb: rdb}
	r.wd.r = r
	return r
}

type call struct {
	op    *Op
	reply any
	err   error
	state int           // queued, leading or done
	wake  chan struct{} // signalled when state leaves queued
}

const (
	queued = iota
	leading
	done
)

// Do sends op, together with the operations of other callers that arrive
// meanwhile, and returns its reply: an error when the call failed (the
// operation may have been applied if the reply was lost), or when the
// script refused this operation alone (a redis.Error). A caller whose ctx
// ends while its operation waits in the queue withdraws it and returns
// ctx's error; once sent, Do waits for the reply.
func (r *Runner) Do(ctx context.Context, op *Op) (any, error) {
	c := &call{op: op}
	r.mu.Lock()
	if r.busy {
		c.wake = make(chan struct{}, 1)
		r.queue = append(r.queue, c)
		r.mu.Unlock()
		select {
		case <-c.wake:
		case <-ctx.Done():
			r.mu.Lock()
			if c.state == queued {
				for i, q := range r.queue {
					if q == c {
						r.queue = append(r.queue[:i], r.queue[i+1:]...)
						break
					}
				}
				r.mu.Unlock()
				return nil, context.Cause(ctx)
			}
			r.mu.Unlock()
			<-c.wake
		}
		r.mu.Lock()
		if c.state == done {
			r.mu.Unlock()
			return c.reply, c.err
		}
		// Promoted: c is at the head of the queue.
	} else {
		r.busy = true
		r.queue = append(r.queue, c)
	}
	n := min(len(r.queue), MaxBatch)
	batch := make([]*call, n)
	copy(batch, r.queue)
	r.queue = append(r.queue[:0], r.queue[n:]...)
	r.mu.Unlock()

	ops := make([]*Op, n)
	for i, b := range batch {
		ops[i] = b.op
	}
	replies, errs := r.Send(context.WithoutCancel(ctx), ops)

	r.mu.Lock()
	for i, b := range batch {
		b.reply, b.err, b.state = replies[i], errs[i], done
		if b != c {
			b.wake <- struct{}{}
		}
	}
	if len(r.queue) > 0 {
		next := r.queue[0]
		next.state = leading
		next.wake <- struct{}{}
	} else {
		r.busy = false
	}
	r.mu.Unlock()
	return c.reply, c.err
}

// Send runs ops at once, one script call per cluster slot, the calls in
// one pipeline, and returns each operation's reply and error. Operations
// that take (a lock, a record) go in other script calls than those that
// finish, release or extend: under maxmemory Redis refuses a script whose
// first write needs memory, and the latter must still run then (their
// first write is a PEXPIRE or a DEL).
func (r *Runner) Send(ctx context.Context, ops []*Op) ([]any, []error) {
	replies, errs := make([]any, len(ops)), make([]error, len(ops))
	if len(ops) == 0 {
		return replies, errs
	}
	// Group by slot, keeping each group's order.
	var order []int
	groups := map[int][]int{}
	one := true // the usual case: every operation in one group
	for _, op := range ops[1:] {
		if op.slot != ops[0].slot || op.grows != ops[0].grows {
			one = false
			break
		}
	}
	for i, op := range ops {
		if one {
			if i == 0 {
				order = append(order, 0)
				groups[0] = make([]int, len(ops))
			}
			groups[0][i] = i
			continue
		}
		g := op.slot * 2
		if op.grows {
			g++
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], i)
	}
	type sent struct {
		idx  []int
		keys []string
		args []any
		cmd  *redis.Cmd
	}
	calls := make([]*sent, 0, len(order))
	for _, slot := range order {
		s := &sent{idx: groups[slot]}
		s.keys = make([]string, 0, len(s.idx))
		s.args = make([]any, 0, 4*len(s.idx))
		for _, i := range s.idx {
			s.keys = append(s.keys, ops[i].keys...)
			s.args = append(s.args, ops[i].args...)
		}
		calls = append(calls, s)
	}
	if len(calls) == 1 {
		s := calls[0]
		s.cmd = opsScript.Run(ctx, r.rdb, s.keys, s.args...) // EVALSHA, EVAL on NOSCRIPT
	} else {
		pipe := r.rdb.Pipeline()
		for _, s := range calls {
			s.cmd = opsScript.EvalSha(ctx, pipe, s.keys, s.args...)
		}
		_, _ = pipe.Exec(ctx)
		// The script is not cached on some node (a restart): send those
		// calls again with the script, only those (the others ran).
		var again []*sent
		for _, s := range calls {
			if err := s.cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				again = append(again, s)
			}
		}
		if len(again) > 0 {
			pipe := r.rdb.Pipeline()
			for _, s := range again {
				s.cmd = opsScript.Eval(ctx, pipe, s.keys, s.args...)
			}
			_, _ = pipe.Exec(ctx)
		}
	}
	for _, s := range calls {
		v, err := s.cmd.Slice()
		if err == nil && len(v) != len(s.idx) {
			err = fmt.Errorf("guard: %d replies to %d operations", len(v), len(s.idx))
		}
		for j, i := range s.idx {
			if err != nil {
				errs[i] = err
				continue
			}
			if e, ok := v[j].(redis.Error); ok {
				errs[i] = e
				continue
			}
			replies[i] = v[j]
		}
	}
	return replies, errs
}

// ErrReply is returned for a reply of an unexpected shape.
var ErrReply = errors.New("guard: unexpected reply")

// Strings returns a reply that is an array of strings.
func Strings(v any, n int) ([]string, error) {
	a, ok := v.([]any)
	if !ok || len(a) != n {
		return nil, fmt.Errorf("%w %v", ErrReply, v)
	}
	out := make([]string, n)
	for i, x := range a {
		s, ok := x.(string)
		if !ok {
			return nil, fmt.Errorf("%w %v", ErrReply, v)
		}
		out[i] = s
	}
	return out, nil
}

// Int returns a reply that is an integer.
func Int(v any) (int64, error) {
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("%w %v", ErrReply, v)
	}
	return n, nil
}
