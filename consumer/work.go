package consumer

// Work: each job taken in runs through the middleware chain and the
// handler, and its result goes to settlement (settle.go).

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/stream"
)

// task is one running job.
type task struct {
	id  string
	d   delivery
	job *stream.Job
	// ctx is the handler's context, cancelled with cancel; its parent is
	// vctx, which carries the task (one allocation less per job than
	// context.WithValue).
	ctx    context.Context
	vctx   jobCtx
	cancel context.CancelCauseFunc
	lease  lease // guarded by Consumer.mu
	// finished: the handler has returned and the job is being settled; no
	// more heartbeats. Guarded by Consumer.mu.
	finished bool
	// orphaned: the entry was deleted or trimmed from the stream while the
	// job ran, and has been reported lost; no more heartbeats. Guarded by
	// Consumer.mu.
	orphaned bool
	// start is when the handler started (zero: not started); guarded by
	// Consumer.mu. ran is how long it ran, set with finished.
	start time.Time
	ran   time.Duration
	// done holds the channel closed once t's worker is done with it (see
	// doneChan), made only when someone waits for it (the drain): closed
	// when the task ends first, so that a job costs no channel.
	done atomic.Pointer[chan struct{}]
	// policy is the consumer's, for Decide.
	policy *policy
	// suspect: the job was delivered before (see Config.MaxCrashes); it
	// runs alone and settles synchronously.
	suspect bool
	// result is what the handler recorded with SetResult.
	result atomic.Pointer[string]
	// room: the job holds a place in the workers' queue (see takeRoom),
	// which its worker frees, unless its retry was queued: the retry loop
	// frees it once settled, so that a consumer holds no more entries
	// pending than Concurrency + Prefetch while its retries wait. Set and
	// read by the worker's goroutine.
	room bool
}

// delivery is an entry this consumer now owns.
type delivery struct {
	id         string
	fields     []string // names and values (see entry)
	deliveries int
	at         time.Time // when the read that delivered it was sent
	// cancelled: re-read or reclaimed with its record cancelling for this
	// entry (see markCancelled): settled cancelled without running.
	cancelled bool
	// cut: reclaimed or re-read over the size limit, cut short in Redis
	// (fields then hold what its dead letter records).
	cut *claim.Cut
}

// dispatch takes in the job of d. For a fresh delivery (a new entry read
// by this consumer) the caller holds a place in the workers' queue (see
// takeRoom), which the worker that runs the job frees; otherwise (the
// consumer's own pending entries, entries reclaimed) it holds a worker slot.
// An entry delivered before is a suspect: it gives its place or slot back
// and waits for the suspect runner (see suspect.go). The entry is decoded by
// the worker, so that the read loop spends as little as possible per entry.
// d's lease is checked against now: the clock read once per read for
// fresh entries, whose dispatch never waits.
func (c *Consumer) dispatch(d delivery, fresh bool, now time.Time) {
	free := c.release
	if fresh {
		free = c.freeRoom
	}
	if c.lateDelivery(d, now) {
		free(1)
		return
	}
	t := &task{id: d.id, d: d, lease: lease{renewed: d.at}, suspect: c.isSuspect(d, fresh), policy: &c.r.pol}
	t.vctx = jobCtx{Context: c.base, t: t, values: c.values}
	ctx, cancel := context.WithCancelCause(&t.vctx)
	t.ctx, t.cancel = ctx, cancel
	if d.cancelled {
		cancel(ErrCancelled) // work settles it without running it
	}
	c.mu.Lock()
	_, running := c.inflight[d.id]
	if !running {
		c.inflight[d.id] = t
		c.trackLease(t)
	}
	c.mu.Unlock()
	switch {
	case running:
		// This consumer's own sweep reclaimed a job it is still running or
		// acknowledging (its heartbeat is disabled or failed): the entry is
		// still ours and the running task settles it; a second copy must
		// not start.
		cancel(nil)
		free(1)
	case t.suspect:
		free(1)
		c.suspects.push(suspectRun{ctx: ctx, t: t, d: d})
	case fresh:
		c.ready <- t // never blocks: the queue has a place for every fresh job held
	default:
		go func() {
			defer c.release(1)
			if c.holdWhilePaused(t) {
				c.work(ctx, t, d, "")
			}
		}()
	}
}

// isSuspect reports whether d's job is a suspect (see suspect.go): delivered
// again, or rescheduled by a suspect's run. In a Pool, where only a running
// job holds a slot of the pool's budget, every entry not fresh is one too
// (on Redis it is anyway: re-reading and reclaiming count a delivery), so
// that the slots taken for the reads of owned entries (intake.go) only size
// those reads.
func (c *Consumer) isSuspect(d delivery, fresh bool) bool {
	return d.deliveries > 1 || stream.Field(d.fields, stream.FieldSuspect) == "1" || (!fresh && c.share != nil)
}

// runWorker is one of the consumer's Concurrency workers: it runs fresh
// jobs from the queue, one at a time, until ctx is done. A job queued when
// ctx is done is given back without running.
//
// In a Pool, a worker keeps its slot of the pool's budget from one job to
// the next while jobs are queued (see share.keep), and gives it back when
// none is.
func (c *Consumer) runWorker(ctx context.Context) {
	held := false // a slot of the pool's budget, kept from the previous job
	pooled := c.share != nil
	for {
		if held {
			select {
			case t := <-c.ready:
				held = c.runQueued(ctx, t, true)
				continue
			default:
				c.share.release(1)
				held = false
			}
		}
		select {
		case t := <-c.ready:
			held = c.runQueued(ctx, t, false) && pooled
		case <-ctx.Done():
			return
		}
	}
}

// runQueued runs queued job t once it has a worker slot, unless the
// consumer stopped (t is given back) or t's lease ended while it waited (t
// is left for another consumer to take over). It takes the slot under the
// gate, shared, so that no fresh job starts while a suspect waits to run
// alone (see suspect.go). In a Pool it also takes a slot of the pool's
// budget (budget.go), or keeps the one its worker held (held), and returns
// whether it holds one still.
func (c *Consumer) runQueued(ctx context.Context, t *task, held bool) bool {
	if t.ctx.Err() == nil && c.pause.holds(t.d.fields) {
		if held {
			c.share.release(1)
		}
		c.parkQueued(ctx, t) // keeps its place (see pause.go)
		return false
	}
	t.room = true
	defer func() {
		if t.room {
			c.freeRoom(1)
		}
	}()
	slot := false
	if held && c.gate.TryRLock() {
		select {
		case <-c.slots:
			slot = true
		default:
		}
		c.gate.RUnlock()
	}
	if held && !slot {
		// A suspect waits to run alone: it needs the budget's slot too.
		c.share.release(1)
		held = false
	}
	if !slot {
		c.gate.RLock()
		select {
		case <-c.slots:
			slot = true
		case <-ctx.Done():
		}
		c.gate.RUnlock()
	}
	switch {
	case slot && held:
		held = c.share.keep(ctx)
	case slot:
		held = c.share.acquire(ctx)
	}
	if slot && !held {
		c.release(1)
		slot = false
	}
	if slot {
		defer c.release(1)
	}
	if ctx.Err() != nil {
		c.giveBack([]string{t.id})
		c.endTask(t)
		return held
	}
	if !c.startable(t) {
		c.endTask(t)
		return held
	}
	c.work(t.ctx, t, t.d, "")
	return held
}

// startable reports whether queued job t may start: its lease has not
// ended (the process may have stalled while it waited; its heartbeat may
// have failed) and its entry is still in the stream.
func (c *Consumer) startable(t *task) bool {
	c.mu.Lock()
	lost, orphaned := t.lease.lost, t.orphaned
	ended := !time.Now().Before(c.leaseEnd(t))
	if !lost && !orphaned && ended {
		t.lease.lost = true
	}
	c.mu.Unlock()
	switch {
	case orphaned: // reported lost by the heartbeat
		return false
	case lost: // the lease watcher cancelled it, and logged that
		return false
	case ended:
		c.stats.leaseLost.Add(1)
		c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "queued job's lease ended before a worker could start it; not starting it here",
			c.entryAttrs(t.id, errKindLeaseLost, "")...)
		return false
	}
	return true
}

// decode returns d's job, or the dead-letter reason and error of an entry
// that must not reach the handler.
func (c *Consumer) decode(d delivery) (job *stream.Job, reason string, deadError error) {
	if d.cut != nil {
		return nil, ReasonMalformed, stream.OversizeError(d.id, d.cut.Field, d.cut.Size, c.r.MaxEntryBytes)
	}
	job, err := stream.DecodeFields(d.id, d.fields, c.r.MaxEntryBytes)
	if err != nil {
		return nil, ReasonMalformed, err
	}
	job.Stream = c.r.Stream
	job.Group = c.r.Group
	job.Deliveries = d.deliveries
	job.AttemptLimit = attemptLimit(job, c.r.MaxAttempts)
	return job, "", nil
}

// verdict is the decision for a job dead-lettered without running: reason
// is ReasonMalformed (job nil) or ReasonCrashed. It is final whatever became
// of ctx meanwhile: a lease that ended while the job waited (its heartbeat
// late under load) would make Decide call it abandoned, and the dead letter
// was then written with no reason. Settling it is safe all the same: the
// dead-letter script is owner-checked, so a job another consumer took over
// is not settled here.
func verdict(ctx context.Context, job *stream.Job, d delivery, reason string, err error) Decision {
	dec := Decide(context.WithoutCancel(ctx), job, Dead(reason, err))
	if job == nil {
		dec.Attempt = d.deliveries
	}
	return dec
}

// runEnd is how a job's run ended.
type runEnd int

const (
	endSettled     runEnd = iota // done or dead-lettered (or the settlement was attempted)
	endRescheduled               // retried or snoozed: the job comes back as a new entry
	endShutdown                  // given back at shutdown
	endLeaseLost                 // lost to another consumer
)

// work runs the job of d and settles it. crashed, when not empty, is the
// error of a job that must be dead-lettered with reason crashed instead of
// running (see suspect.go).
func (c *Consumer) work(ctx context.Context, t *task, d delivery, crashed string) runEnd {
	defer t.end()
	defer t.cancel(nil)
	job, reason, deadError := c.decode(d)
	if crashed != "" && reason == "" {
		reason, deadError = ReasonCrashed, errors.New(crashed)
	}
	// Cancelled before it started (queued, held, a suspect): it never runs.
	early := reason == "" && errors.Is(context.Cause(ctx), ErrCancelled)
	c.mu.Lock()
	t.job = job
	t.finished = reason != "" || early
	if reason == "" && !early {
		t.start = time.Now()
	}
	c.mu.Unlock()
	if reason != "" {
		dec := verdict(ctx, job, d, reason, deadError)
		r := c.deadRequest(ctx, d, dec.Reason, dec.Err, dec.Attempt, job)
		r.room, t.room = t.room, false
		c.settleDead(ctx, r, t.suspect) // the retry loop leaves the in-flight set
		return endSettled
	}
	var err error
	if early {
		err = context.Cause(ctx)
	} else {
		var stop context.CancelFunc = func() {}
		if c.r.MaxRuntime > 0 {
			ctx, stop = context.WithTimeout(ctx, c.r.MaxRuntime)
		}
		err = c.call(ctx, job)
		stop()
		c.mu.Lock()
		t.finished = true
		t.ran = time.Since(t.start)
		c.mu.Unlock()
		c.noteRunTime(t.ran)
	}
	cause := context.Cause(ctx)
	forget := true // leave the in-flight set now, or (acks) once acknowledged
	defer func() {
		if forget {
			c.mu.Lock()
			delete(c.inflight, t.id)
			c.mu.Unlock()
		}
	}()
	dec := Decide(ctx, job, err)
	switch {
	case dec.Kind == KindAbandoned && errors.Is(cause, ErrLeaseLost):
		c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "job's lease was lost to another consumer; not settling it here",
			c.jobAttrs(t.id, job, t.ran, errKindLeaseLost, errText(err))...)
		return endLeaseLost
	case dec.Kind == KindAbandoned:
		c.giveBack([]string{t.id})
		return endShutdown
	case (dec.Kind == KindAck || dec.Kind == KindCancelled) && t.suspect:
		// A suspect is acknowledged before the next one starts (not once
		// Run has returned: it then stays pending, as Run said).
		c.logCancelled(t, job, dec, early)
		select {
		case <-c.ackDone:
		default:
			forget = false
			c.flushAcks([]ackItem{c.ackOf(t, job, dec.Kind == KindCancelled)}, nil, true)
		}
	case dec.Kind == KindAck || dec.Kind == KindCancelled:
		// The job stays in the in-flight set until the ack loop has
		// acknowledged it, so that this consumer's own sweep cannot start
		// it again in between.
		c.logCancelled(t, job, dec, early)
		forget = !c.queueAck(c.ackOf(t, job, dec.Kind == KindCancelled))
	case dec.Kind == KindRetry || dec.Kind == KindSnooze:
		forget = false // the retry loop does, once it has run the job's batch
		r := c.retryRequest(ctx, job, d, dec)
		r.room, t.room = t.room, false
		if c.reschedule(r) {
			return endRescheduled
		}
	case dec.Kind == KindDead:
		forget = false // the retry loop does, once it has run the job's batch
		r := c.deadRequest(ctx, d, dec.Reason, dec.Err, dec.Attempt, job)
		r.room, t.room = t.room, false
		c.settleDead(ctx, r, t.suspect)
	}
	return endSettled
}

// logCancelled logs a job settled as cancelled (dec), which had not
// started (early) or whose handler returned after the cancel.
func (c *Consumer) logCancelled(t *task, job *stream.Job, dec Decision, early bool) {
	if dec.Kind != KindCancelled {
		return
	}
	msg := "cancelled job's handler returned; settled as cancelled"
	if early {
		msg = "cancelled job settled as cancelled without running"
	}
	c.r.Logger.LogAttrs(c.base, slog.LevelInfo, msg, c.jobAttrs(t.id, job, t.ran, errKindCancelled, "")...)
}

// call runs the handler chain, turning a panic into a *PanicError.
func (c *Consumer) call(ctx context.Context, job *stream.Job) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return c.chain.Process(ctx, job)
}

// jobKey is the context key of a job's task.
type jobKey struct{}

// jobCtx is the parent of a job's handler context: the consumer's base
// context (never done) with the job's task as the value of jobKey.
type jobCtx struct {
	context.Context
	t *task
	// values is the context Run was given, whose values base carries:
	// looking them up through base (a context.WithoutCancel) would allocate
	// on every lookup. Nothing cancellable is found through it: the context
	// package looks a cancel parent up only under a parent whose Done is
	// not nil, and base's is.
	values context.Context
}

// Value returns the task for jobKey, else the value Run's context holds.
func (c *jobCtx) Value(key any) any {
	if _, ok := key.(jobKey); ok {
		return c.t
	}
	return c.values.Value(key)
}

// taskOf returns the task whose handler context is ctx, or nil.
func taskOf(ctx context.Context) *task {
	if ctx == nil {
		return nil
	}
	t, _ := ctx.Value(jobKey{}).(*task)
	return t
}

// closedChan is the done channel of a task that ended before anyone waited
// for it.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// doneChan returns a channel that is closed once t's worker is done with it
// (see end).
func (t *task) doneChan() <-chan struct{} {
	if p := t.done.Load(); p != nil {
		return *p
	}
	ch := make(chan struct{})
	if t.done.CompareAndSwap(nil, &ch) {
		return ch
	}
	return *t.done.Load()
}

// end marks t's worker done with it: it closes the channel of doneChan.
// Call it once per task.
func (t *task) end() {
	if !t.done.CompareAndSwap(nil, &closedChan) {
		close(*t.done.Load())
	}
}

// handlerTime returns how long t's handler ran, or has run so far; 0 if it
// has not started. Call it with Consumer.mu held, or from t's goroutine.
func (t *task) handlerTime() time.Duration {
	switch {
	case t == nil || t.start.IsZero():
		return 0
	case t.finished:
		return t.ran
	}
	return time.Since(t.start)
}
