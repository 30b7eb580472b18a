package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Consumer runs jobs from one stream as one member of a consumer group.
// Build it with [New], [Consumer.Use] and [Consumer.Handle], then call
// [Consumer.Run]:
//
//	c := consumer.New(rdb, consumer.Config{Stream: "emails", Group: "senders"}).
//		Use(tracing, locking).
//		Handle(consumer.HandlerFunc(send))
//	err := c.Run(ctx)
type Consumer struct {
	rdb     redis.UniversalClient
	cfg     Config
	mws     []Middleware
	handler Handler

	stopReq chan context.Context
	done    chan struct{}
	runErr  error
	started atomic.Bool

	// Set by Run.
	r       resolved
	chain   Handler
	claimer *claim.Claimer
	slots   chan struct{}
	base    context.Context // parent of the handlers' contexts
	ackCh   chan ackItem
	ackDone chan struct{}
	errLog  rateLog
	leases  leases
	stats   counters

	mu       sync.Mutex
	inflight map[string]*task

	// gate keeps fresh jobs from starting while a suspect waits to run
	// alone: the read loop holds it shared for each intake, the suspect
	// runner exclusively (see suspect.go).
	gate     sync.RWMutex
	suspects suspectQueue   // new suspects
	alone    suspectQueue   // suspects that run alone (c.suspects.ready signals both)
	shared   sync.WaitGroup // suspects started beside other jobs
}

// task is one running job.
type task struct {
	id     string
	job    *stream.Job
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
	done  chan struct{}
	// recorder is the job's DeadLetterRecorder, set by middleware.
	recorder atomic.Pointer[DeadLetterRecorder]
	// suspect: the job was delivered before (see Config.MaxCrashes); it
	// runs alone and settles synchronously.
	suspect bool
}

// delivery is an entry this consumer now owns.
type delivery struct {
	id         string
	fields     map[string]any
	deliveries int
	at         time.Time // when the read that delivered it was sent
}

// New returns a Consumer of rdb configured by cfg. The configuration is
// checked by Run, before Run touches Redis.
func New(rdb redis.UniversalClient, cfg Config) *Consumer {
	return &Consumer{
		rdb:     rdb,
		cfg:     cfg,
		stopReq: make(chan context.Context, 1),
		done:    make(chan struct{}),
	}
}

// Use appends middleware to the chain; the first one added is the outermost.
// Call it before Run.
func (c *Consumer) Use(mw ...Middleware) *Consumer {
	c.mws = append(c.mws, mw...)
	return c
}

// Handle sets the handler that the middleware chain wraps. Call it before
// Run.
func (c *Consumer) Handle(h Handler) *Consumer {
	c.handler = h
	return c
}

// Run consumes until ctx is cancelled or [Consumer.Shutdown] is called, then
// drains: it stops reading at once, waits for running handlers up to the
// drain deadline, cancels the contexts of those still running with cause
// [ErrShutdown], and returns. Jobs that did not finish stay pending for
// another consumer. Run returns nil after a clean drain, an error naming the
// abandoned jobs when handlers ignored their cancelled contexts, and an
// error naming the field when the configuration is invalid (before any
// Redis command).
//
// Run starts by creating the group and checking that the client's Redis
// user may send every command the consumer sends, with its keys (on Redis
// 7, which can tell; see docs/acl.md). If Redis does not answer, Run
// waits for it (a service may start before its Redis), retrying with
// backoff until Redis answers, ctx is cancelled or Shutdown is called (Run
// then returns nil), or [Config.StartTimeout] passes; it returns at once an
// error that waiting cannot fix, such as WRONGTYPE, NOPERM or a command the
// user may not send (named in the error).
//
// A Consumer runs once: a later Run returns an error, even after the first
// has returned, because handlers abandoned at shutdown may still be running
// on the consumer's state, and a Shutdown called before Run applies to the
// one Run. Build another Consumer with [New] to run again. A Run refused
// before it started (invalid configuration, no handler or client) does not
// count.
func (c *Consumer) Run(ctx context.Context) (err error) {
	r, err := c.cfg.resolve()
	if err != nil {
		return err
	}
	if c.handler == nil {
		return errors.New("consumer: no handler: call Handle before Run")
	}
	if c.rdb == nil {
		return errors.New("consumer: nil Redis client")
	}
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice: a Consumer runs once; build another with New")
	}
	defer func() {
		c.runErr = err
		close(c.done)
	}()
	c.r = r
	c.chain = Chain(c.handler, c.mws...)
	c.claimer = claim.New(c.rdb, r.Stream, r.Group, r.Consumer)
	c.slots = make(chan struct{}, r.Concurrency)
	for range r.Concurrency {
		c.slots <- struct{}{}
	}
	c.base = context.WithoutCancel(ctx)
	c.ackCh = make(chan ackItem, 4*r.Concurrency+256)
	c.suspects.ready = make(chan struct{}, 1)
	c.ackDone = make(chan struct{})
	c.inflight = make(map[string]*task)
	c.errLog = rateLog{log: r.Logger, every: 10 * time.Second}
	c.leases = newLeases(r.Logger)

	if stopped, err := c.startup(ctx); stopped || err != nil {
		return err
	}

	work, stopWork := context.WithCancel(c.base)
	defer stopWork()
	var loops, side sync.WaitGroup
	reader := newBlockingReader(c.rdb)
	loops.Go(func() {
		defer reader.close()
		c.readLoop(work, reader)
	})
	loops.Go(func() { c.every(work, r.PromoteInterval, c.promote) })
	if r.IdleConsumerTimeout > 0 {
		loops.Go(func() { c.every(work, max(r.IdleConsumerTimeout/4, time.Second), c.reap) })
	}
	beat, stopBeat := context.WithCancel(c.base)
	defer stopBeat()
	c.startLeases(beat, &side)
	stopAcks := make(chan struct{})
	side.Go(func() { c.ackLoop(stopAcks) })
	var runner sync.WaitGroup
	intakeDone := make(chan struct{})
	runner.Go(func() { c.runSuspects(work, intakeDone) })

	var drainCtx context.Context
	select {
	case <-ctx.Done():
		var cancel context.CancelFunc
		drainCtx, cancel = context.WithTimeout(context.Background(), r.ShutdownTimeout)
		defer cancel()
	case drainCtx = <-c.stopReq:
	}
	stopWork()
	waitInterrupting(&loops, reader)
	close(intakeDone)
	abandoned := c.drain(drainCtx)
	runner.Wait()
	stopBeat()
	close(stopAcks)
	side.Wait()
	if len(abandoned) > 0 {
		return fmt.Errorf("consumer: shutdown abandoned %d running job(s) whose handlers ignored cancellation; they stay pending: %s",
			len(abandoned), strings.Join(abandoned, ", "))
	}
	return nil
}

// Shutdown stops a running consumer: it stops reading at once and waits for
// running handlers until ctx is done, then cancels their contexts with cause
// [ErrShutdown]. It returns when Run has returned, with Run's error, or with
// ctx's error if Run has not returned shortly after the deadline. Called
// while Run waits for Redis at start, it ends the wait at once and Run
// returns nil. Called before Run has started, it returns nil at once and
// Run, when called, stops as soon as it has started.
func (c *Consumer) Shutdown(ctx context.Context) error {
	select {
	case c.stopReq <- ctx:
	default:
	}
	if !c.started.Load() {
		return nil // Run, when it starts, finds the request and drains at once
	}
	select {
	case <-c.done:
		return c.runErr
	case <-ctx.Done():
	}
	select {
	case <-c.done: // Run cancels handlers at the deadline and returns soon after
		return c.runErr
	case <-time.After(time.Second):
		return fmt.Errorf("consumer: shutdown: %w", ctx.Err())
	}
}

// waitInterrupting waits for the intake loops to return, interrupting the
// reader's blocked read until they do (a read may start just after an
// interrupt).
func waitInterrupting(loops *sync.WaitGroup, reader *blockingReader) {
	done := make(chan struct{})
	go func() {
		loops.Wait()
		close(done)
	}()
	for {
		reader.interrupt()
		select {
		case <-done:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// abandonGrace is how long the drain waits, after cancelling the contexts
// of handlers still running at the deadline, for them to return.
const abandonGrace = 500 * time.Millisecond

// drain waits for running jobs until ctx is done, then cancels them with
// ErrShutdown and waits abandonGrace more. It returns the IDs of the jobs
// still running.
func (c *Consumer) drain(ctx context.Context) []string {
	for _, t := range c.snapshot() {
		select {
		case <-t.done:
		case <-ctx.Done():
		}
	}
	rest := c.snapshot()
	if len(rest) == 0 {
		return nil
	}
	for _, t := range rest {
		t.cancel(ErrShutdown)
	}
	grace, cancel := context.WithTimeout(context.Background(), abandonGrace)
	defer cancel()
	for _, t := range rest {
		select {
		case <-t.done:
		case <-grace.Done():
		}
	}
	var abandoned []string
	for _, t := range rest {
		select {
		case <-t.done:
		default:
			c.mu.Lock()
			job, settling := t.job, t.finished
			c.mu.Unlock()
			if settling {
				continue // the handler returned; its settlement is under way
			}
			what := t.id
			if job != nil {
				what = fmt.Sprintf("%s (job %s, type %s)", t.id, job.ID, job.Type)
			}
			abandoned = append(abandoned, what)
		}
	}
	return abandoned
}

func (c *Consumer) snapshot() []*task {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*task, 0, len(c.inflight))
	for _, t := range c.inflight {
		out = append(out, t)
	}
	return out
}

// createGroup creates the consumer group (and the stream) if missing.
func (c *Consumer) createGroup(ctx context.Context, start string) error {
	err := c.rdb.XGroupCreateMkStream(ctx, c.r.Stream, c.r.Group, start).Err()
	if err == nil || strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return nil
	}
	// Redis over maxmemory refuses XGROUP CREATE (OOM) before it finds that
	// the group exists; a consumer must start then, to drain the backlog.
	if groups, gerr := c.rdb.XInfoGroups(ctx, c.r.Stream).Result(); gerr == nil {
		for _, g := range groups {
			if g.Name == c.r.Group {
				return nil
			}
		}
	}
	return fmt.Errorf("consumer: create group %s on %s: %w", c.r.Group, c.r.Stream, err)
}

// checkEviction warns when Redis may evict keys under memory pressure: an
// evicted stream, pending-entries list or delayed set loses jobs silently.
// A user that may not run CONFIG GET is warned that the policy could not be
// checked; a server without it (managed services, miniredis) is not
// checked.
func (c *Consumer) checkEviction(ctx context.Context) {
	policy, err := c.rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		if strings.HasPrefix(err.Error(), "NOPERM") {
			c.r.Logger.Warn("could not check that Redis never evicts keys: the Redis user may not run CONFIG GET; make sure maxmemory-policy is noeviction (evicted streams or delayed sets lose jobs without a trace)",
				"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
		}
		return
	}
	if p, ok := policy["maxmemory-policy"]; ok && p != "noeviction" {
		c.r.Logger.Warn("Redis may evict keys under memory pressure (maxmemory-policy is not noeviction); evicted streams or delayed sets lose jobs without a trace",
			"stream", c.r.Stream, "maxmemory_policy", p)
	}
}

// recoverGroup recreates a group that vanished (Redis restarted without
// persistence, or the stream was deleted), from the first entry.
func (c *Consumer) recoverGroup(ctx context.Context, err error) {
	if err == nil || !strings.Contains(err.Error(), "NOGROUP") {
		return
	}
	if cerr := c.createGroup(ctx, "0"); cerr == nil {
		c.r.Logger.Warn("consumer group was missing and has been recreated from the first entry",
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
	}
}

// acquire waits for one free worker slot, then takes up to max-1 more
// without waiting. It returns 0 when ctx is done.
func (c *Consumer) acquire(ctx context.Context, max int) int {
	select {
	case <-c.slots:
	case <-ctx.Done():
		return 0
	}
	return 1 + c.tryAcquire(max-1)
}

// tryAcquire takes up to max free slots without waiting.
func (c *Consumer) tryAcquire(max int) int {
	n := 0
	for n < max {
		select {
		case <-c.slots:
			n++
		default:
			return n
		}
	}
	return n
}

func (c *Consumer) release(n int) {
	for range n {
		c.slots <- struct{}{}
	}
}

// readLoop is the consumer's one intake of work: it first re-reads this
// consumer's own pending entries (left by an earlier run under the same
// name), then reads new entries, each time as many as there are free slots,
// and every SweepInterval sweeps for entries idle past the visibility
// timeout. Reads and sweeps share the loop so that a blocked read never
// holds the slots a sweep needs; a read blocks no longer than until the next
// sweep is due.
func (c *Consumer) readLoop(ctx context.Context, reader *blockingReader) {
	var backoff backoff
	after := "0"
	for ctx.Err() == nil {
		n := c.acquire(ctx, c.r.Concurrency)
		if n == 0 {
			return
		}
		// Entries re-read here were delivered before: all are suspects,
		// queued without taking a slot, so no gate is needed.
		at := time.Now()
		entries, deleted, err := c.claimer.ReadOwn(ctx, after, n)
		if err != nil {
			c.release(n)
			c.readError(ctx, err, &backoff)
			continue
		}
		backoff.reset()
		c.reportLost(deleted, "re-reading own pending entries")
		if len(entries) == 0 && len(deleted) == 0 {
			c.release(n)
			break
		}
		for _, id := range deleted {
			after = laterID(after, id)
		}
		c.dispatchOwned(n, entries, at)
		for _, e := range entries {
			after = laterID(after, e.ID)
		}
	}
	nextSweep := time.Now()
	for ctx.Err() == nil {
		if !c.intake(ctx, reader, &nextSweep, &backoff) {
			return
		}
	}
}

// intake reads or sweeps once, holding the gate shared so that no fresh job
// starts while a suspect waits to run alone. It returns false when the
// consumer stops.
func (c *Consumer) intake(ctx context.Context, reader *blockingReader, nextSweep *time.Time, backoff *backoff) bool {
	c.gate.RLock()
	defer c.gate.RUnlock()
	n := c.acquire(ctx, c.r.Concurrency)
	if n == 0 {
		return false
	}
	if !time.Now().Before(*nextSweep) {
		c.release(n)
		c.sweep(ctx)
		*nextSweep = time.Now().Add(c.r.SweepInterval)
		return true
	}
	at := time.Now()
	res, err := reader.read(ctx, &redis.XReadGroupArgs{
		Group:    c.r.Group,
		Consumer: c.r.Consumer,
		Streams:  []string{c.r.Stream, ">"},
		Count:    int64(n),
		Block:    max(min(c.r.Block, time.Until(*nextSweep)), time.Millisecond),
	})
	if err != nil {
		c.release(n)
		if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			c.readError(ctx, err, backoff)
		}
		return true
	}
	backoff.reset()
	var msgs []redis.XMessage
	if len(res) > 0 {
		msgs = res[0].Messages
	}
	c.release(n - len(msgs))
	if ctx.Err() != nil {
		// Read after the stop: give the entries back for the next sweep.
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		c.giveBack(ids)
		c.release(len(msgs))
		return false
	}
	for _, m := range msgs {
		c.dispatch(delivery{id: m.ID, fields: m.Values, deliveries: 1, at: at})
	}
	return true
}

// dispatchOwned dispatches entries for which reserved slots are held,
// waiting for more slots if there are more entries than that (miniredis
// ignores COUNT when reading history).
func (c *Consumer) dispatchOwned(reserved int, entries []claim.Entry, at time.Time) {
	for i, e := range entries {
		if i >= reserved {
			<-c.slots // wait until a slot frees up
		}
		c.dispatch(delivery{id: e.ID, fields: e.Fields, deliveries: e.Deliveries, at: at})
	}
	if len(entries) < reserved {
		c.release(reserved - len(entries))
	}
}

func (c *Consumer) readError(ctx context.Context, err error, b *backoff) {
	c.stats.readErrors.Add(1)
	c.recoverGroup(ctx, err)
	if ctx.Err() == nil { // not an error of the consumer's own stop
		c.errLog.error("reading from Redis failed; backing off", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
	}
	b.wait(ctx)
}

// sweep takes over jobs idle longer than the visibility timeout, as many as
// there are free slots.
func (c *Consumer) sweep(ctx context.Context) {
	var at time.Time // Sweep calls take just before each XAUTOCLAIM
	take := func(n int) int {
		at = time.Now()
		return c.tryAcquire(n)
	}
	err := c.claimer.Sweep(ctx, c.r.VisibilityTimeout, take, func(reserved int, claimed []claim.Entry, deleted []string) {
		c.reportLost(deleted, "reclaiming")
		c.stats.reclaimed.Add(uint64(len(claimed)))
		if len(claimed) > 0 {
			c.r.Logger.Info("reclaimed jobs idle past the visibility timeout", "stream", c.r.Stream, "group", c.r.Group,
				"consumer", c.r.Consumer, "count", len(claimed))
		}
		c.dispatchOwned(reserved, claimed, at)
	})
	if err != nil {
		c.recoverGroup(ctx, err)
		if ctx.Err() == nil {
			c.errLog.error("sweeping for idle jobs failed", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
		}
	}
}

func (c *Consumer) reportLost(ids []string, when string) {
	if len(ids) == 0 {
		return
	}
	c.stats.lost.Add(uint64(len(ids)))
	for _, id := range ids {
		c.r.Logger.LogAttrs(c.base, slog.LevelError, "pending job was deleted or trimmed from the stream before it finished; it is lost",
			append(c.entryAttrs(id, errKindLost, ""), slog.String("when", when))...)
	}
}

// dispatch starts a job for d. The caller holds a slot for it, which the
// job's goroutine releases. The entry is decoded there too, so that the
// read loop spends as little as possible per entry. An entry delivered
// before is a suspect: it gives its slot back and waits for the suspect
// runner (see suspect.go).
func (c *Consumer) dispatch(d delivery) {
	if c.lateDelivery(d) {
		c.release(1)
		return
	}
	t := &task{id: d.id, lease: lease{renewed: d.at}, done: make(chan struct{}), suspect: d.deliveries > 1}
	ctx, cancel := context.WithCancelCause(context.WithValue(c.base, jobKey{}, t))
	t.cancel = cancel
	c.mu.Lock()
	_, running := c.inflight[d.id]
	if !running {
		c.inflight[d.id] = t
		c.trackLease(t)
	}
	c.mu.Unlock()
	if running {
		// This consumer's own sweep reclaimed a job it is still running or
		// acknowledging (its heartbeat is disabled or failed): the entry is
		// still ours and the running task settles it; a second copy must
		// not start.
		cancel(nil)
		c.release(1)
		return
	}
	if t.suspect {
		c.release(1)
		c.suspects.push(suspectRun{ctx: ctx, t: t, d: d})
		return
	}
	go func() {
		defer c.release(1)
		c.work(ctx, t, d, "")
	}()
}

// decode returns d's job, or the dead-letter reason and error of an entry
// that must not reach the handler.
func (c *Consumer) decode(d delivery) (job *stream.Job, reason, deadError string) {
	job, err := stream.DecodeLimit(d.id, d.fields, c.r.MaxEntryBytes)
	if err != nil {
		return nil, ReasonMalformed, err.Error()
	}
	job.Stream = c.r.Stream
	job.Deliveries = d.deliveries
	return job, "", ""
}

// runEnd is how a job's run ended.
type runEnd int

const (
	endSettled   runEnd = iota // settled, or the settlement was attempted
	endShutdown                // given back at shutdown
	endLeaseLost               // lost to another consumer
)

// work runs the job of d and settles it. crashed, when not empty, is the
// error of a job that must be dead-lettered with reason crashed instead of
// running (see suspect.go).
func (c *Consumer) work(ctx context.Context, t *task, d delivery, crashed string) runEnd {
	defer close(t.done)
	defer t.cancel(nil)
	job, reason, deadError := c.decode(d)
	if crashed != "" && reason == "" {
		reason, deadError = ReasonCrashed, crashed
	}
	c.mu.Lock()
	t.job = job
	t.finished = reason != ""
	if reason == "" {
		t.start = time.Now()
	}
	c.mu.Unlock()
	if reason != "" {
		attempts := d.deliveries
		if job != nil {
			attempts = job.Attempt + 1
		}
		c.settleDead(ctx, d.id, d.fields, reason, errors.New(deadError), attempts, job)
		c.mu.Lock()
		delete(c.inflight, t.id)
		c.mu.Unlock()
		return endSettled
	}
	var stop context.CancelFunc = func() {}
	if c.r.MaxRuntime > 0 {
		ctx, stop = context.WithTimeout(ctx, c.r.MaxRuntime)
	}
	err := c.call(ctx, job)
	stop()
	cause := context.Cause(ctx)
	c.mu.Lock()
	t.finished = true
	t.ran = time.Since(t.start)
	c.mu.Unlock()
	forget := true // leave the in-flight set now, or (acks) once acknowledged
	defer func() {
		if forget {
			c.mu.Lock()
			delete(c.inflight, t.id)
			c.mu.Unlock()
		}
	}()
	switch {
	case errors.Is(cause, ErrLeaseLost):
		c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "job's lease was lost to another consumer; not settling it here",
			c.jobAttrs(t.id, job, t.ran, errKindLeaseLost, errText(err))...)
		return endLeaseLost
	case err == nil && t.suspect:
		// A suspect is acknowledged before the next one starts.
		forget = false
		c.flushAcks([]ackItem{{id: t.id}})
	case err == nil:
		// The job stays in the in-flight set until the ack loop has
		// acknowledged it, so that this consumer's own sweep cannot start
		// it again in between.
		forget = !c.queueAck(ackItem{id: t.id})
	case errors.Is(cause, ErrShutdown):
		c.giveBack([]string{t.id})
		return endShutdown
	default:
		c.settleError(ctx, job, d, err)
	}
	return endSettled
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

func (c *Consumer) promote(ctx context.Context) {
	const limit = 256
	for range 8 {
		n, err := stream.PromoteDue(ctx, c.rdb, c.r.Stream, limit)
		if err != nil {
			if ctx.Err() == nil { // not an error of the consumer's own stop
				c.errLog.error("moving due jobs from the delayed set failed", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
			}
			return
		}
		if n < limit {
			return
		}
	}
}

func (c *Consumer) reap(ctx context.Context) {
	names, err := c.claimer.Reap(ctx, c.r.IdleConsumerTimeout)
	if err != nil {
		c.recoverGroup(ctx, err)
		if ctx.Err() == nil {
			c.errLog.error("removing idle consumers failed", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
		}
		return
	}
	if len(names) > 0 {
		c.r.Logger.Info("removed idle consumers with no pending jobs", "stream", c.r.Stream, "group", c.r.Group, "consumers", names)
	}
}

// giveBack releases entries this consumer will not finish, so that the next
// sweep of any consumer takes them at once.
func (c *Consumer) giveBack(ids []string) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	gone, err := c.claimer.Release(ctx, c.r.VisibilityTimeout, ids...)
	switch {
	case err != nil && len(ids) == 1:
		c.errLog.error("giving back an unfinished job failed; it will be reclaimed after the visibility timeout", err,
			anys(c.entryAttrs(ids[0], errKindShutdown, ""))...)
	case err != nil:
		c.errLog.error("giving back unfinished jobs failed; they will be reclaimed after the visibility timeout", err,
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "entry_ids", ids)
	default:
		for _, id := range gone {
			c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "unfinished job to give back was no longer owned by this consumer (reclaimed by another, or deleted from the stream)",
				c.entryAttrs(id, errKindShutdown, "")...)
		}
	}
}

// every calls f every d until ctx is done.
func (c *Consumer) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

// laterID returns the later of two stream entry IDs.
func laterID(a, b string) string {
	if compareIDs(a, b) < 0 {
		return b
	}
	return a
}

// taskOf returns the task whose handler context is ctx, or nil.
func taskOf(ctx context.Context) *task {
	if ctx == nil {
		return nil
	}
	t, _ := ctx.Value(jobKey{}).(*task)
	return t
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
