package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/claim"
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
	// reader is the queue's part of its pool's shared read, set by
	// Pool.Run; nil: Run reads with a blockingReader of its own.
	reader xreader

	// Set by Run.
	r         resolved
	chain     Handler
	claimer   *claim.Claimer
	slots     chan struct{}   // a token per worker slot free
	share     *share          // a Pool's shared budget; nil outside a pool
	room      room            // places for fresh jobs the consumer may take in (see takeRoom)
	ready     chan *task      // fresh jobs queued for the workers
	base      context.Context // parent of the handlers' contexts
	values    context.Context // Run's context, whose values base carries (see jobCtx)
	ackCh     chan ackItem
	ackWant   atomic.Int64  // while the ack loop waits: how many queued items wake it (see fillAcks)
	ackKick   chan struct{} // wakes the waiting ack loop; capacity 1
	retryCh   chan *retryReq
	retryDone chan struct{}
	ackDone   chan struct{}
	errLog    rateLog
	retryLog  rateLog // the Warn record of a retry (see rescheduled)
	leases    leases
	stats     counters
	health    healthState // see health.go
	pause     pauses      // see pause.go

	// The room's size for the default Prefetch (see roomLimit).
	parked   int          // places the read loop holds back (see fitRoom)
	jobTime  atomic.Int64 // handlers' average run time, ns
	finished atomic.Int64 // handlers returned
	caughtUp atomic.Bool  // the last read found fewer new entries than it asked for
	// ackPiled: the last trim found settled entries piled up above the
	// horizon (ack.lua), so the next sends its candidates for deletion.
	ackPiled atomic.Bool
	// finishedAtRead is finished when the last read was sent; read loop only.
	finishedAtRead int64

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
// error naming the field when the configuration ([Config.Validate]) or a
// middleware's ([Invalid]) is invalid (before any Redis command).
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
	chain, err := buildChain(c.handler, c.mws)
	if err != nil {
		return err
	}
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice: a Consumer runs once; build another with New")
	}
	defer func() {
		c.runErr = err
		close(c.done)
	}()
	c.r = r
	c.chain = chain
	c.claimer = claim.New(c.rdb, r.Stream, r.Group, r.Consumer,
		claim.Oversize{MaxBytes: r.MaxEntryBytes, KeepFields: recordedFields, KeepBytes: cutShortBytes})
	c.slots = make(chan struct{}, r.Concurrency)
	for range r.Concurrency {
		c.slots <- struct{}{}
	}
	c.room.kick = make(chan struct{}, 1)
	c.freeRoom(c.roomSize())
	c.ready = make(chan *task, c.roomSize())
	c.base, c.values = context.WithoutCancel(ctx), ctx
	c.ackCh = make(chan ackItem, 4*r.Concurrency+256)
	c.ackKick = make(chan struct{}, 1)
	c.retryCh = make(chan *retryReq, 2*r.Concurrency+maxRetryBatch)
	c.retryDone = make(chan struct{})
	c.suspects.ready = make(chan struct{}, 1)
	c.ackDone = make(chan struct{})
	c.inflight = make(map[string]*task)
	c.errLog = rateLog{log: r.Logger, every: 10 * time.Second}
	c.retryLog = rateLog{log: r.Logger, every: time.Second}
	c.leases = newLeases(r.Logger)
	c.pause.init(r.Logger)

	if stopped, err := c.startup(ctx); stopped || err != nil {
		return err
	}

	c.readPauses(ctx) // before the first job starts
	work, stopWork := context.WithCancel(c.base)
	defer stopWork()
	var loops, side, watchers sync.WaitGroup
	// The control channel and the cancel watcher serve running handlers
	// until the last has returned: a job cancelled while the consumer
	// drains is cancelled too.
	watch, stopWatch := context.WithCancel(c.base)
	defer stopWatch()
	cancels := make(chan string, 1)
	watchers.Go(func() { c.watchPauses(watch, cancels) })
	watchers.Go(func() { c.watchCancels(watch, cancels) })
	reader := c.reader
	if reader == nil {
		reader = newBlockingReader(c.rdb)
	}
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
	// The ack loop stops after the retry loop, which queues the entries it
	// settled for deletion (forgetSettled).
	side.Go(func() { c.ackLoop(c.retryDone) })
	side.Go(func() { c.retryLoop(stopAcks) })
	var runner sync.WaitGroup
	intakeDone := make(chan struct{})
	runner.Go(func() { c.runSuspects(work, intakeDone) })
	var workers sync.WaitGroup
	for range r.Concurrency {
		workers.Go(func() { c.runWorker(work) })
	}

	var drainCtx context.Context
	select {
	case <-ctx.Done():
		var cancel context.CancelFunc
		drainCtx, cancel = context.WithTimeout(context.Background(), r.ShutdownTimeout)
		defer cancel()
	case drainCtx = <-c.stopReq:
	}
	c.health.draining.Store(true)
	stopWork()
	close(c.pause.quit) // no held job starts now (see pause.go)
	waitInterrupting(&loops, reader)
	c.giveBackQueued()
	close(intakeDone)
	abandoned := c.drain(drainCtx)
	// The suspect runner returns once its suspect has, and the workers once
	// their jobs have; a handler that ignores its context is abandoned
	// (drain waited for it already), and so is its worker.
	runnerDone := make(chan struct{})
	go func() {
		runner.Wait()
		close(runnerDone)
	}()
	if len(abandoned) == 0 {
		<-runnerDone
		workers.Wait()
	} else {
		select {
		case <-runnerDone:
		case <-time.After(abandonGrace):
		}
	}
	stopWatch()
	watchers.Wait()
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
func waitInterrupting(loops *sync.WaitGroup, reader xreader) {
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
		case <-t.doneChan():
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
		case <-t.doneChan():
		case <-grace.Done():
		}
	}
	var abandoned []string
	for _, t := range rest {
		select {
		case <-t.doneChan():
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

// giveBackQueued gives back, without running them, the fresh jobs still
// queued for the workers once the read loop has stopped. (A worker that
// takes one meanwhile gives it back itself.)
func (c *Consumer) giveBackQueued() {
	var queued []*task
	for {
		select {
		case t := <-c.ready:
			queued = append(queued, t)
			continue
		default:
		}
		break
	}
	if len(queued) == 0 {
		return
	}
	ids := make([]string, len(queued))
	for i, t := range queued {
		ids[i] = t.id
	}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), 512)]
		ids = ids[len(chunk):]
		c.giveBack(chunk)
	}
	for _, t := range queued {
		c.endTask(t)
	}
	c.freeRoom(len(queued))
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
