package consumer

// Pauses (package control): an operator pauses a queue, or one job type of
// it, optionally until a time of the Redis clock. The consumer keeps the
// queue's pauses in memory, re-read when the queue's control channel says
// they changed, when it (re)subscribes, at a pause's end and every
// pauseRefresh as a safety net; no Redis command is sent per job.
//
// What is held, and where (no attempt is counted, nothing is rescheduled,
// no delivery count grows):
//   - the whole queue paused: intake sends no XREADGROUP, so new entries
//     stay in the stream unread; sweeps, heartbeats and promotion go on;
//   - a fresh job already read (queued for the workers) whose queue or type
//     is paused is parked: it keeps its place in the workers' queue, and its
//     lease is extended by the heartbeat, but it frees its worker. Parked
//     jobs fill the queue's room (Concurrency + Prefetch) at most: once it
//     is full of parked jobs the consumer reads no more, and the other types
//     behind them wait for the resume too;
//   - a job re-read after a restart or reclaimed from a dead consumer is
//     held with its worker slot (at most Concurrency of them, since a sweep
//     claims only as many jobs as slots are free), leased by the heartbeat;
//   - a redelivered job (a suspect) waits without a slot, before its run is
//     counted.
// On resume (or the pause's end) every held job starts at once, in its
// usual way: a lease that ended meanwhile (the heartbeat failed) is not
// started here. At shutdown held jobs are given back without running.
// A consumer that cannot read the pauses (Redis unreachable) keeps the last
// state it read; one that has never read them runs as unpaused.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// pauseRefresh is how often a consumer re-reads its queue's pauses when no
// message says they changed: the delay after which a consumer that missed
// a message (or may not subscribe) sees a change.
const pauseRefresh = 5 * time.Second

// pauses is the consumer's view of its queue's pauses, in its own clock.
type pauses struct {
	mu       sync.Mutex
	queue    bool
	queueEnd time.Time            // zero: until resumed
	types    map[string]time.Time // paused type → end (zero: until resumed)
	changed  chan struct{}        // closed at each re-read
	quit     chan struct{}        // closed when the consumer stops taking jobs
	held     atomic.Int64         // jobs waiting in wait (Stats.Held)
	// some: the queue or a type is paused (ended or not); false lets
	// holds skip the lock and the clock for each job.
	some atomic.Bool
	// errLog is the pauses' own rate limit of error logs, so that their
	// failures do not hide the read loop's (nor the other way round).
	errLog rateLog
}

func (p *pauses) init(log *slog.Logger) {
	p.errLog = rateLog{log: log, every: 10 * time.Second}
	p.changed = make(chan struct{})
	p.quit = make(chan struct{})
}

// set replaces the state with st, read at local time at.
func (p *pauses) set(st control.Paused, at time.Time) {
	local := func(end time.Time) time.Time {
		if end.IsZero() {
			return end
		}
		return at.Add(end.Sub(st.Now))
	}
	types := make(map[string]time.Time, len(st.Types))
	for t, end := range st.Types {
		types[t] = local(end)
	}
	p.mu.Lock()
	p.queue, p.queueEnd, p.types = st.Queue, local(st.QueueUntil), types
	p.some.Store(st.Queue || len(types) > 0)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// active reports whether a pause that ends at end (zero: never) is still on.
func active(end time.Time, now time.Time) bool { return end.IsZero() || now.Before(end) }

// state reports whether jobs of type typ are paused (typ "": whether the
// whole queue is), until when (zero: until resumed), and the channel closed
// at the next change.
func (p *pauses) state(typ string, whole bool) (bool, time.Time, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.queue && active(p.queueEnd, now) {
		return true, p.queueEnd, p.changed
	}
	if !whole {
		if end, ok := p.types[typ]; ok && active(end, now) {
			return true, end, p.changed
		}
	}
	return false, time.Time{}, p.changed
}

// nextEnd returns the earliest end of a timed pause still on, or zero.
func (p *pauses) nextEnd() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	var next time.Time
	consider := func(end time.Time) {
		if !end.IsZero() && now.Before(end) && (next.IsZero() || end.Before(next)) {
			next = end
		}
	}
	if p.queue {
		consider(p.queueEnd)
	}
	for _, end := range p.types {
		consider(end)
	}
	return next
}

// paused returns what is paused now, as the consumer last read it: the
// whole queue, and the paused job types (sorted; nil if none).
func (p *pauses) paused() (queue bool, types []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	queue = p.queue && active(p.queueEnd, now)
	for t, end := range p.types {
		if active(end, now) {
			types = append(types, t)
		}
	}
	slices.Sort(types)
	return queue, types
}

func (p *pauses) stopped() bool {
	select {
	case <-p.quit:
		return true
	default:
		return false
	}
}

// holds reports whether a job with the given entry fields must not start
// now because its queue or type is paused (never once the consumer stops:
// then the usual path gives it back).
func (p *pauses) holds(fields []string) bool {
	if p.quit == nil || !p.some.Load() || p.stopped() {
		return false
	}
	paused, _, _ := p.state(entryType(fields), false)
	return paused
}

// holdResult is how a wait for the resume ended.
type holdResult int

const (
	resumed   holdResult = iota // not paused (any more): start the job
	stopping                    // the consumer stops taking jobs
	cancelled                   // done was closed (the job's lease ended)
)

// wait waits while the jobs of type typ are paused (whole: while the whole
// queue is), until the consumer stops or done is closed.
func (p *pauses) wait(typ string, whole bool, done <-chan struct{}) holdResult {
	counted := false
	defer func() {
		if counted {
			p.held.Add(-1)
		}
	}()
	for {
		if p.stopped() {
			return stopping
		}
		paused, end, changed := p.state(typ, whole)
		if !paused {
			return resumed
		}
		if !whole && !counted { // a job held (whole: the reader)
			counted = true
			p.held.Add(1)
		}
		var timer *time.Timer
		var timeout <-chan time.Time
		if !end.IsZero() {
			timer = time.NewTimer(time.Until(end))
			timeout = timer.C
		}
		res := resumed
		select {
		case <-changed:
		case <-timeout:
		case <-p.quit:
			res = stopping
		case <-done:
			res = cancelled
		}
		if timer != nil {
			timer.Stop()
		}
		if res != resumed {
			return res
		}
	}
}

// entryType returns the job type of an entry's raw fields ("" if none).
func entryType(fields []string) string { return stream.Field(fields, stream.FieldType) }

// holdWhilePaused holds t, which holds a worker slot and has not started,
// while its queue or type is paused. It returns false, having given t back
// (the consumer stops) or ended it (its lease ended), when t must not run
// here.
func (c *Consumer) holdWhilePaused(t *task) bool {
	if !c.pause.holds(t.d.fields) {
		return true
	}
	switch c.pause.wait(entryType(t.d.fields), false, t.ctx.Done()) {
	case stopping:
		c.giveBack([]string{t.id})
		c.endTask(t)
		return false
	case cancelled:
		if errors.Is(context.Cause(t.ctx), ErrCancelled) {
			return true // work settles it as cancelled without running it
		}
		c.endTask(t)
		return false
	}
	return true
}

// parkQueued parks fresh job t, whose queue or type is paused, without a
// worker: it keeps its place in the workers' queue and runs as queued jobs
// do once resumed (or is given back if the consumer stops meanwhile).
func (c *Consumer) parkQueued(ctx context.Context, t *task) {
	go func() {
		c.pause.wait(entryType(t.d.fields), false, t.ctx.Done())
		if c.runQueued(ctx, t, false) && c.share != nil {
			c.share.release(1) // no worker goes on to a next job with it
		}
	}()
}

// parkSuspect parks suspect r, whose queue or type is paused, before its
// run is counted; once resumed it queues again for the suspect runner,
// which gives it back if the consumer stops meanwhile.
func (c *Consumer) parkSuspect(r suspectRun) {
	c.shared.Add(1) // the runner waits for it before it returns
	go func() {
		defer c.shared.Done()
		if c.pause.wait(entryType(r.d.fields), false, r.t.ctx.Done()) == stopping {
			c.abandonSuspect(r)
			return
		}
		if r.alone {
			c.alone.push(r)
		} else {
			c.suspects.push(r)
		}
		c.suspects.signal()
	}()
}

// waitQueuePaused waits, while the whole queue is paused, until it is
// resumed, the consumer stops or until passes. It reports whether the
// queue was paused.
func (c *Consumer) waitQueuePaused(ctx context.Context, until time.Time) bool {
	if paused, _, _ := c.pause.state("", true); !paused {
		return false
	}
	c.health.readingPaused()
	done, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	c.pause.wait("", true, done.Done())
	return true
}

// readingPaused closes Reading when the consumer would read its first new
// entries but its queue is paused: it is up, held by the pause. Called by
// the read loop only, as readDone is.
func (h *healthState) readingPaused() {
	h.init()
	select {
	case <-h.reading:
	default:
		close(h.reading)
	}
}

// readPauses re-reads the queue's pauses. A failure keeps the last state.
func (c *Consumer) readPauses(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, c.r.SettleTimeout)
	defer cancel()
	st, err := control.State(rctx, c.rdb, c.r.Stream)
	if err != nil {
		if ctx.Err() == nil {
			c.pause.errLog.error("reading the queue's pauses failed; keeping the last state read", err,
				"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
		}
		return
	}
	c.pause.set(st, time.Now())
}

// watchPauses keeps the consumer's view of the pauses current until ctx is
// done: one subscription to the queue's control channel, a re-read on each
// message and (re)subscription, at the end of a timed pause, and every
// pauseRefresh. A consumer that may not subscribe (a Redis ACL without the
// channel) logs it and relies on the periodic re-read. The entry IDs of
// cancel messages (see cancel.go) go to cancels. Run keeps it until its
// last handler has returned, and closes pause.quit when it stops taking
// jobs.
func (c *Consumer) watchPauses(ctx context.Context, cancels chan<- string) {
	kick := make(chan struct{}, 1)
	ps := c.rdb.Subscribe(ctx, c.r.keys.Control)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		var b backoff
		for ctx.Err() == nil {
			msg, err := ps.Receive(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				c.pause.errLog.error("listening on the queue's control channel failed; pauses are re-read every "+pauseRefresh.String(), err,
					"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "channel", c.r.keys.Control)
				b.wait(ctx)
				continue
			}
			b.reset()
			switch m := msg.(type) {
			case *redis.Subscription:
				if !strings.EqualFold(m.Kind, "subscribe") {
					continue
				}
			case *redis.Message:
				if id := cancelEntry(m.Payload); id != "" {
					select {
					case cancels <- id:
					default: // a check is under way or due: the next one sees it
					}
					continue
				}
			default:
				continue
			}
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}()
	defer func() {
		ps.Close()
		<-recvDone
	}()
	timer := time.NewTimer(pauseRefresh)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-timer.C:
		}
		c.readPauses(ctx)
		wait := pauseRefresh
		if end := c.pause.nextEnd(); !end.IsZero() {
			wait = min(wait, time.Until(end)+time.Millisecond)
		}
		timer.Reset(max(wait, time.Millisecond))
	}
}
