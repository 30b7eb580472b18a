package consumer

// Health: what a probe, a test or a benchmark needs to know about a running
// consumer without asking Redis: whether its reads are answered, when it
// last settled a job, whether it loses leases, whether it has drained.

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Health is a snapshot of a consumer's state, from [Consumer.Health].
type Health struct {
	// Ready reports whether the consumer is taking jobs: Run has started
	// reading new entries, its reads (and its heartbeats) are answered, and
	// it is not shutting down. Problem says why not.
	Ready bool `json:"ready"`
	// Live reports whether the consumer should be left running: false once
	// Run has returned. A Redis outage does not make it false: restarting
	// the process would not bring Redis back, and a rollout that starts
	// before its Redis would crash-loop.
	Live bool `json:"live"`
	// Problem says why the consumer is not ready; "" when it is.
	Problem string `json:"problem,omitempty"`
	// Draining: shutdown has begun (Run's context was cancelled or Shutdown
	// called).
	Draining bool `json:"draining"`
	// LastRead is when the latest read of new entries was answered
	// (with entries or without); zero before the first.
	LastRead time.Time `json:"last_read"`
	// LastSettled is when the latest job was settled (acknowledged,
	// rescheduled or dead-lettered); zero before the first.
	LastSettled time.Time `json:"last_settled"`
	// LastLeaseLost is when the latest lease was lost (see [ErrLeaseLost]);
	// zero if none was. LeaseLost counts them, as Stats.LeaseLost.
	LastLeaseLost time.Time `json:"last_lease_lost"`
	LeaseLost     uint64    `json:"lease_lost"`
	// InFlight is the number of jobs running or being settled. Jobs read
	// but not started are not: prefetched ones waiting for a worker, those
	// held by a pause (Held) and suspects waiting for their run.
	InFlight int `json:"in_flight"`
	// ReadErrors counts the failed reads, as Stats.ReadErrors.
	ReadErrors uint64 `json:"read_errors"`
	// Paused reports that the whole queue is paused and PausedTypes lists
	// the job types paused (package control), as the consumer last read its
	// pauses; Held is the number of jobs it holds because of them, read but
	// not started, as Stats.Held. A paused consumer is still Ready.
	Paused      bool     `json:"paused"`
	PausedTypes []string `json:"paused_types,omitempty"`
	Held        uint64   `json:"held"`
}

// healthState is what the consumer's loops report for [Consumer.Health].
type healthState struct {
	read     probe
	draining atomic.Bool
	// emptySent: when the latest read was sent (Unix ns), if it returned
	// no entries; 0 if it returned some.
	emptySent atomic.Int64

	once    sync.Once
	reading chan struct{} // closed at the first answered read
	mu      sync.Mutex
	changed chan struct{} // closed and replaced at each answered read
}

func (h *healthState) init() {
	h.once.Do(func() {
		h.reading = make(chan struct{})
		h.changed = make(chan struct{})
	})
}

// answered reports whether a read of new entries has been answered (Reading
// is closed).
func (h *healthState) answered() bool {
	h.init()
	select {
	case <-h.reading:
		return true
	default:
		return false
	}
}

// readSent records that a read of new entries was sent at.
func (h *healthState) readSent(at time.Time) { h.read.sent(at) }

// readDone records the answer to the read sent at (redis.Nil: no entries).
func (h *healthState) readDone(at time.Time, res []streamRead, err error) {
	if err == redis.Nil {
		err = nil
	}
	h.read.done(at, err)
	if err != nil {
		return
	}
	if len(res) == 0 || len(res[0].entries) == 0 {
		h.emptySent.Store(at.UnixNano())
	} else {
		h.emptySent.Store(0)
	}
	h.init()
	select {
	case <-h.reading:
	default:
		close(h.reading)
	}
	h.mu.Lock()
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

// probe follows one kind of call the consumer makes over and over.
type probe struct {
	mu       sync.Mutex
	pending  time.Time // when the call in flight was sent; zero if none
	failing  time.Time // when the first call of the current run of failures was sent; zero after a success
	answered time.Time // when the latest successful call was answered
}

func (p *probe) sent(at time.Time) {
	p.mu.Lock()
	p.pending = at
	p.mu.Unlock()
}

func (p *probe) done(at time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = time.Time{}
	switch {
	case err == nil:
		p.failing, p.answered = time.Time{}, time.Now()
	case p.failing.IsZero():
		p.failing = at
	}
}

// stuckSince is since when calls have gone unanswered or failed; zero if
// the latest was answered and none is waiting.
func (p *probe) stuckSince() (time.Time, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.failing.IsZero() {
		return p.failing, p.answered
	}
	return p.pending, p.answered
}

// stuckAfter is how long a read may go unanswered (or keep failing), or a
// running job's lease go unrenewed, before the consumer is not ready: half-way between Block and
// VisibilityTimeout, so a consumer cut off from Redis says so before
// another consumer may take its jobs over.
func (c *Consumer) stuckAfter() time.Duration {
	return c.r.Block + (c.r.VisibilityTimeout-c.r.Block)/2
}

// Health returns the consumer's state. It asks Redis nothing: it reports
// what the consumer's own reads, heartbeats and settlements saw, so a probe
// may call it as often as it likes. A consumer cut off from Redis is not
// Ready within its VisibilityTimeout: after Block plus half the rest of
// it without an answer to a read, or without a running job's lease renewed
// by the heartbeat.
func (c *Consumer) Health() Health {
	st := c.Stats()
	h := Health{
		LastSettled:   c.stats.lastSettled(),
		LastLeaseLost: c.stats.leaseLost.last(),
		LeaseLost:     st.LeaseLost,
		ReadErrors:    st.ReadErrors,
		Held:          st.Held,
		Draining:      c.health.draining.Load(),
		Live:          true,
	}
	h.Paused, h.PausedTypes = c.pause.paused()
	_, h.LastRead = c.health.read.stuckSince()
	if !c.started.Load() {
		h.Problem = "not running: Run has not been called"
		return h
	}
	select {
	case <-c.done:
		h.Live, h.Draining = false, true
		h.Problem = "not running: Run has returned"
		return h
	default:
	}
	if h.LastRead.IsZero() {
		// Run may still be setting up the state read below.
		h.Problem = "not reading yet: starting (creating the group, waiting for Redis, re-reading its own pending jobs)"
		if h.Draining {
			h.Problem = "shutting down"
		}
		return h
	}
	now := time.Now()
	var oldestLease time.Time // the least recently renewed lease of a running job
	c.mu.Lock()
	for _, t := range c.inflight {
		if !t.start.IsZero() || t.finished {
			h.InFlight++
		}
		if t.holdsLease() && (oldestLease.IsZero() || t.lease.renewed.Before(oldestLease)) {
			oldestLease = t.lease.renewed
		}
	}
	c.mu.Unlock()
	switch readStuck, _ := c.health.read.stuckSince(); {
	case h.Draining:
		h.Problem = "shutting down"
	case !readStuck.IsZero() && now.Sub(readStuck) > c.stuckAfter():
		h.Problem = "reads from Redis unanswered or failing since " + readStuck.Format(time.RFC3339Nano)
	case c.r.HeartbeatInterval > 0 && !oldestLease.IsZero() && now.Sub(oldestLease) > c.stuckAfter():
		// The heartbeat renews every lease every half to whole
		// HeartbeatInterval, less than half the visibility timeout.
		h.Problem = "heartbeats unanswered or failing: a running job's lease was last renewed at " + oldestLease.Format(time.RFC3339Nano)
	}
	h.Ready = h.Problem == ""
	return h
}

// Reading returns a channel closed once Run has started reading new
// entries (its first read was answered; that read does not block, so on an
// empty stream this does not wait for Config.Block): the consumer has
// created its group, passed its checks and re-read its own pending jobs.
// It is never closed when Run returns before that (an invalid
// configuration, a fatal error at start): wait for Run too.
func (c *Consumer) Reading() <-chan struct{} {
	c.health.init()
	return c.health.reading
}

// WaitIdle waits until the consumer has drained what it can see: a read
// sent after WaitIdle was called found no new entries, and no job is
// running, waiting to run or being settled. So jobs enqueued before the call
// have run and settled when it returns (those of the consumer's stream that
// were new; those another consumer holds are not waited for). Jobs in the delayed set that are not due yet do not count. It
// returns ctx's error if ctx ends first, and an error once Run has
// returned. It asks Redis nothing: it checks after each of the consumer's
// reads, so it returns within about Config.Block of the consumer becoming
// idle.
func (c *Consumer) WaitIdle(ctx context.Context) error {
	c.health.init()
	since := time.Now()
	for {
		select {
		case <-c.done:
			return errRunReturned
		default:
		}
		c.health.mu.Lock()
		changed := c.health.changed
		c.health.mu.Unlock()
		if c.idle(since) {
			return nil
		}
		select {
		case <-changed:
		case <-c.done:
			return errRunReturned
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var errRunReturned = errorString("consumer: Run has returned")

type errorString string

func (e errorString) Error() string { return string(e) }

// idle reports whether the latest read, sent at or after since, found
// nothing and no job is in flight.
func (c *Consumer) idle(since time.Time) bool {
	if sent := c.health.emptySent.Load(); sent == 0 || sent < since.UnixNano() {
		return false
	}
	select {
	case <-c.health.reading:
	default:
		return false
	}
	c.mu.Lock()
	n := len(c.inflight)
	c.mu.Unlock()
	return n == 0 // suspects waiting to run are in flight too
}

// ReadyHandler serves the consumer's [Health] as JSON, with status 200 when
// it is Ready and 503 otherwise: a Kubernetes readinessProbe.
func (c *Consumer) ReadyHandler() http.Handler {
	return c.healthHandler(func(h Health) bool { return h.Ready })
}

// LiveHandler serves the consumer's [Health] as JSON, with status 200 while
// it is Live (Run has not returned) and 503 after: a Kubernetes
// livenessProbe.
func (c *Consumer) LiveHandler() http.Handler {
	return c.healthHandler(func(h Health) bool { return h.Live })
}

func (c *Consumer) healthHandler(ok func(Health) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := c.Health()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok(h) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
}

// eventCount counts events and remembers when the latest happened.
type eventCount struct {
	n  atomic.Uint64
	at atomic.Int64 // Unix ns of the latest; 0 before the first
}

// Add counts d events (none when d is 0).
func (e *eventCount) Add(d uint64) uint64 {
	if d > 0 {
		e.at.Store(time.Now().UnixNano())
	}
	return e.n.Add(d)
}

// Load returns the count.
func (e *eventCount) Load() uint64 { return e.n.Load() }

func (e *eventCount) last() time.Time {
	if ns := e.at.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// lastSettled is when the latest settlement was counted.
func (s *counters) lastSettled() time.Time {
	var t time.Time
	for _, e := range []*eventCount{&s.acked, &s.retried, &s.snoozed, &s.dead} {
		if l := e.last(); l.After(t) {
			t = l
		}
	}
	return t
}
