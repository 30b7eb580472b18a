package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
)

// MaxBatch bounds the operations of one round trip (and so the work of one
// script call).
const MaxBatch = 128

// Runner sends the operations of one Redis client, batched, and renews its
// held leases. It is safe for concurrent use.
type Runner struct {
	rdb     redis.UniversalClient
	sharded bool // not a *redis.Client: its keys may live on several nodes

	mu    sync.Mutex
	queue []*call
	busy  bool // a caller is sending

	// postTimer sends posted operations that no caller sent within
	// PostDelay; postArmed: it is set (or its function has yet to run).
	postTimer *time.Timer
	postArmed bool
	postDelay time.Duration // PostDelay; tests change it

	// The leader's buffers, empty between its batches (used by the one
	// caller that has set busy).
	lbatch   []*call
	lops     []*Op
	lreplies []any
	lerrs    []error

	wd watchdog
}

var runners sync.Map // redis.UniversalClient -> *Runner

// Of returns the Runner of rdb, the same for every caller, so that locks
// and records of one client share batches and one watchdog. A Runner has
// no goroutine once it has had nothing to renew for idleGrace.
func Of(rdb redis.UniversalClient) *Runner {
	if r, ok := runners.Load(rdb); ok {
		return r.(*Runner)
	}
	r, _ := runners.LoadOrStore(rdb, newRunner(rdb))
	return r.(*Runner)
}

func newRunner(rdb redis.UniversalClient) *Runner {
	_, single := rdb.(*redis.Client)
	r := &Runner{rdb: rdb, sharded: !single, postDelay: PostDelay}
	r.wd.r = r
	return r
}

// call is an operation on its way through the queue: a part of its Op
// (one allocation), an Op being sent once.
type call struct {
	op     *Op
	reply  any
	err    error
	state  int           // queued, leading, sending or done
	wake   chan struct{} // signalled when state leaves queued; nil: posted
	posted bool          // nobody waits for the reply
}

const (
	queued  = iota
	leading // promoted to send the queue
	sending // in a batch being sent: its caller waits for the reply
	done
)

// postTimeout bounds a call sent for posted operations alone.
const postTimeout = 5 * time.Second

// PostDelay bounds how long a posted operation waits for a caller of Do or
// Settle to send it with its own before the Runner sends it alone: posted
// releases of jobs that follow each other closely ride the next job's call
// instead of costing a goroutine and a round trip each.
const PostDelay = time.Millisecond

// Do sends op, together with the operations of other callers that arrive
// meanwhile, and returns its reply: an error when the call failed (the
// operation may have been applied if the reply was lost), or when the
// script refused this operation alone (a redis.Error with Redis's message). A caller whose ctx
// ends while its operation waits in the queue withdraws it and returns
// ctx's error; once sent, Do waits for the reply.
func (r *Runner) Do(ctx context.Context, op *Op) (any, error) {
	return r.do(ctx, op, ctx.Done(), 0)
}

// Settle sends op as Do does, for a caller that must not give up when ctx
// ends (a settlement after the handler returned): it keeps ctx's values,
// not its cancellation, and withdraws op, returning
// context.DeadlineExceeded, if it waited in the queue for within. It makes
// no context, and a timer only when op has to wait.
func (r *Runner) Settle(ctx context.Context, op *Op, within time.Duration) (any, error) {
	return r.do(ctx, op, nil, within)
}

// timers are the stopped timers of Settle's waits, for reuse.
var timers sync.Pool

// wakes are the empty wake channels of calls that returned, for reuse.
var wakes sync.Pool

// wakeChan returns an empty wake channel.
func wakeChan() chan struct{} {
	if w, ok := wakes.Get().(chan struct{}); ok {
		return w
	}
	return make(chan struct{}, 1)
}

// do is Do, withdrawing op from the queue when cancelled is closed (with ctx's
// cause) or, for within > 0, after within (context.DeadlineExceeded).
func (r *Runner) do(ctx context.Context, op *Op, cancelled <-chan struct{}, within time.Duration) (any, error) {
	c := &op.call
	*c = call{op: op}
	r.mu.Lock()
	if r.busy {
		c.wake = wakeChan()
		defer wakes.Put(c.wake) // empty once do returns: one signal, taken
		r.queue = append(r.queue, c)
		r.mu.Unlock()
		var timeout <-chan time.Time
		if within > 0 {
			t, _ := timers.Get().(*time.Timer)
			if t == nil {
				t = time.NewTimer(within)
			} else {
				t.Reset(within)
			}
			defer func() {
				t.Stop() // no stale tick after Stop (Go 1.23 timers)
				timers.Put(t)
			}()
			timeout = t.C
		}
		var gaveUp error
		select {
		case <-c.wake:
		case <-cancelled:
			gaveUp = context.Cause(ctx)
		case <-timeout:
			gaveUp = context.DeadlineExceeded
		}
		if gaveUp != nil {
			r.mu.Lock()
			if c.state == queued {
				for i, q := range r.queue {
					if q == c {
						r.queue = append(r.queue[:i], r.queue[i+1:]...)
						break
					}
				}
				r.mu.Unlock()
				return nil, gaveUp
			}
			r.mu.Unlock()
			<-c.wake
		}
		r.mu.Lock()
		if c.state == done {
			r.mu.Unlock()
			return c.reply, c.err
		}
		// Promoted to lead.
	} else {
		r.busy = true
		r.queue = append(r.queue, c)
		if r.postArmed && r.postTimer.Stop() { // the posted ones go now
			r.postArmed = false
		}
	}
	r.lead(context.WithoutCancel(ctx), c)
	return c.reply, c.err
}

// Post queues op to be sent as Do would, without waiting for it or its
// reply: for an operation whose reply changes nothing for the caller (a
// release). It is sent before every operation queued after it (Send keeps
// the order of the operations of one slot that can depend on each other):
// with the call in flight's successor if there is one, else with the next
// call of Do or Settle, or alone once PostDelay has passed without one.
func (r *Runner) Post(op *Op) {
	c := &op.call
	*c = call{op: op, posted: true}
	r.mu.Lock()
	r.queue = append(r.queue, c)
	if !r.busy {
		r.armPost()
	}
	r.mu.Unlock()
}

// armPost, called with r.mu held while nobody sends, has the queue's posted
// operations sent after PostDelay unless a caller sends them first.
func (r *Runner) armPost() {
	if r.postArmed {
		return
	}
	r.postArmed = true
	if r.postTimer == nil {
		r.postTimer = time.AfterFunc(r.postDelay, r.sendPosted)
		return
	}
	r.postTimer.Reset(r.postDelay)
}

// sendPosted sends the queue's posted operations if nobody is sending.
func (r *Runner) sendPosted() {
	r.mu.Lock()
	r.postArmed = false
	if r.busy || len(r.queue) == 0 {
		r.mu.Unlock()
		return
	}
	r.busy = true
	ctx, cancel := context.WithTimeout(context.Background(), postTimeout)
	defer cancel()
	r.lead(ctx, nil)
}

// lead, called with r.mu held and r.busy set, sends the queue's operations
// in calls of at most MaxBatch, from its head, until c's reply is in (all
// that were queued, for c nil), then hands the lead to the first caller
// still waiting in the queue (if only posted operations are left, they are
// sent by the next caller or after PostDelay), and returns with r.mu
// released.
func (r *Runner) lead(ctx context.Context, c *call) {
	for {
		n := min(len(r.queue), MaxBatch)
		batch := append(r.lbatch[:0], r.queue[:n]...)
		r.queue = append(r.queue[:0], r.queue[n:]...)
		for _, b := range batch {
			if b != c {
				b.state = sending // sent: no longer withdrawn
			}
		}
		r.mu.Unlock()

		ops := r.lops[:0]
		for _, b := range batch {
			ops = append(ops, b.op)
		}
		replies, errs := r.send(ctx, ops, r.lreplies, r.lerrs)

		r.mu.Lock()
		for i, b := range batch {
			b.reply, b.err, b.state = replies[i], errs[i], done
			if b != c && b.wake != nil {
				b.wake <- struct{}{}
			}
		}
		clear(batch)
		clear(ops)
		clear(replies)
		clear(errs)
		r.lbatch, r.lops, r.lreplies, r.lerrs = batch[:0], ops[:0], replies[:0], errs[:0]
		if c != nil && c.state == done || len(r.queue) == 0 {
			break
		}
	}
	for _, q := range r.queue {
		if q.wake != nil {
			q.state = leading
			q.wake <- struct{}{}
			r.mu.Unlock()
			return
		}
	}
	r.busy = false
	if len(r.queue) > 0 {
		r.armPost()
	}
	r.mu.Unlock()
}

// Send runs ops at once and returns each operation's reply and error: one
// script call per cluster slot (one for every slot on a *redis.Client,
// which has a single node), the calls in one pipeline. In a call, the
// operations that take (a lock, a record) come before those that finish,
// release or extend: under maxmemory Redis refuses a script's first write
// if it needs memory, and only until the script has written, so takes sent
// first are refused and write nothing while the others, after them, still
// run (ops.lua makes their first write a PEXPIRE that needs no memory). A
// take of a key that another operation of the batch also has would then run
// before it (an acquire before the posted release of its key): such takes go
// in a second call of the slot, after the first.
func (r *Runner) Send(ctx context.Context, ops []*Op) ([]any, []error) {
	return r.send(ctx, ops, nil, nil)
}

// send is Send, setting the replies and errors in replies and errs (empty,
// grown to len(ops) if they are shorter) and returning them.
func (r *Runner) send(ctx context.Context, ops []*Op, replies []any, errs []error) ([]any, []error) {
	if cap(replies) < len(ops) {
		replies = make([]any, len(ops))
	}
	if cap(errs) < len(ops) {
		errs = make([]error, len(ops))
	}
	replies, errs = replies[:len(ops)], errs[:len(ops)]
	if len(ops) == 0 {
		return replies, errs
	}
	if r.sharded {
		for _, op := range ops {
			op.slot = keyslot.Of(op.key[0])
		}
	}
	calls := plan(ops)
	if len(calls) == 1 {
		args := gather(ops, calls[0])
		cmd := scriptCmd(ctx, args, false)
		_ = r.rdb.Process(ctx, cmd)
		if noScript(cmd.Err()) {
			cmd = scriptCmd(ctx, args, true)
			_ = r.rdb.Process(ctx, cmd)
		}
		v, err := cmd.Slice()
		if forbidden(err, calls[0]) {
			r.sendAlone(ctx, ops, calls[0], replies, errs)
			return replies, errs
		}
		deliver(replies, errs, calls[0], v, err)
		return replies, errs
	}
	r.sendCalls(ctx, ops, calls, replies, errs)
	return replies, errs
}

// forbidden reports whether the call of ops idx was refused whole by the
// ACL, before its script ran: Redis checks every key of KEYS first, so one
// forbidden key refuses the call with NOPERM, nothing written (ops.lua
// itself never raises an error: its refusals are per operation).
func forbidden(err error, idx []int) bool {
	var rerr redis.Error
	return len(idx) > 1 && errors.As(err, &rerr) && strings.HasPrefix(err.Error(), "NOPERM")
}

// sendAlone sends each operation of ops idx as a call of its own, in one
// pipeline in their order, so that only the forbidden ones fail.
func (r *Runner) sendAlone(ctx context.Context, ops []*Op, idx []int, replies []any, errs []error) {
	calls := make([][]int, len(idx))
	for j, i := range idx {
		calls[j] = []int{i}
	}
	r.sendCalls(ctx, ops, calls, replies, errs)
}

// sendCalls runs the script calls of ops, one per calls element, in one
// pipeline, and sets each operation's reply and error.
func (r *Runner) sendCalls(ctx context.Context, ops []*Op, calls [][]int, replies []any, errs []error) {
	type sent struct {
		idx  []int
		args []any
		cmd  *redis.Cmd
	}
	sends := make([]sent, len(calls))
	pipe := r.rdb.Pipeline()
	for i, idx := range calls {
		s := &sends[i]
		s.idx, s.args = idx, gather(ops, idx)
		s.cmd = scriptCmd(ctx, s.args, false)
		_ = pipe.Process(ctx, s.cmd)
	}
	_, _ = pipe.Exec(ctx)
	// The script is not cached on some node (a restart): send those calls
	// again with the script, only those (the others ran).
	var again redis.Pipeliner
	for i := range sends {
		if s := &sends[i]; noScript(s.cmd.Err()) {
			if again == nil {
				again = r.rdb.Pipeline()
			}
			s.cmd = scriptCmd(ctx, s.args, true)
			_ = again.Process(ctx, s.cmd)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for _, s := range sends {
		v, err := s.cmd.Slice()
		if forbidden(err, s.idx) {
			r.sendAlone(ctx, ops, s.idx, replies, errs)
			continue
		}
		deliver(replies, errs, s.idx, v, err)
	}
}

// Boxed once: the script's digest and source, as command arguments.
var (
	shaArg any = opsScript.Hash()
	srcArg any = opsLua
)

// scriptCmd returns the command that runs ops.lua with args (from
// gather): EVALSHA, or EVAL with the script's source.
func scriptCmd(ctx context.Context, args []any, eval bool) *redis.Cmd {
	if eval {
		args[0], args[1] = "eval", srcArg
	} else {
		args[0], args[1] = "evalsha", shaArg
	}
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// noScript reports whether err says that Redis does not have the script.
func noScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// plan returns the script calls of ops (Send), each as the indexes of its
// operations in the order they run: per slot, in the order the slots come,
// the takes then the others; and then, per slot, the takes of a key that
// one of the others also has.
func plan(ops []*Op) [][]int {
	var calls, late [][]int
	for i, op := range ops {
		seen := false
		for _, c := range calls {
			if ops[c[0]].slot == op.slot {
				seen = true
				break
			}
		}
		if seen {
			continue
		}
		n, nt := 0, 0
		for j := i; j < len(ops); j++ {
			if o := ops[j]; o.slot == op.slot {
				n++
				if o.grows {
					nt++
				}
			}
		}
		idx := make([]int, 0, n) // the takes, then the others
		for j := i; j < len(ops); j++ {
			if o := ops[j]; o.slot == op.slot && o.grows {
				idx = append(idx, j)
			}
		}
		for j := i; j < len(ops); j++ {
			if o := ops[j]; o.slot == op.slot && !o.grows {
				idx = append(idx, j)
			}
		}
		if nt > 0 && nt < n {
			others := idx[nt:]
			kept := idx[:0]
			var after []int
			for _, j := range idx[:nt] {
				if shares(ops[j], ops, others) {
					after = append(after, j)
				} else {
					kept = append(kept, j)
				}
			}
			if len(after) > 0 {
				idx = append(kept, others...) // copy moves them down
				late = append(late, after)
			}
		}
		calls = append(calls, idx)
	}
	return append(calls, late...)
}

// shares reports whether op has a key of one of ops idx.
func shares(op *Op, ops []*Op, idx []int) bool {
	for _, j := range idx {
		for _, k := range ops[j].keys() {
			for _, l := range op.keys() {
				if k == l {
					return true
				}
			}
		}
	}
	return false
}

// gather returns the arguments of the script call of ops idx: two slots
// for the command and the script (scriptCmd), the number of keys, the
// operations' keys, then their arguments.
func gather(ops []*Op, idx []int) []any {
	nk, na := 0, 0
	for _, i := range idx {
		nk, na = nk+ops[i].nkeys, na+ops[i].nargs
	}
	args := make([]any, 3, 3+nk+na)
	args[2] = nk
	for _, i := range idx {
		for _, k := range ops[i].keys() {
			args = append(args, k)
		}
	}
	for _, i := range idx {
		args = append(args, ops[i].args()...)
	}
	return args
}

// deliver sets the replies and errors of ops idx from the reply v (or
// error err) of their script call.
func deliver(replies []any, errs []error, idx []int, v []any, err error) {
	if err == nil && len(v) != len(idx) {
		err = fmt.Errorf("guard: %d replies to %d operations", len(v), len(idx))
	}
	for j, i := range idx {
		if err != nil {
			errs[i] = err
		} else if e, ok := v[j].([]any); ok && len(e) == 1 {
			errs[i] = refusal(fmt.Sprint(e[0]))
		} else {
			replies[i] = v[j]
		}
	}
}

// refusal is the error of an operation that the script refused alone: a
// redis.Error with Redis's message (OOM, NOPERM, ERR ...).
type refusal string

func (e refusal) Error() string { return string(e) }

// RedisError marks refusal as a redis.Error.
func (refusal) RedisError() {}

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
