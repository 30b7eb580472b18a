package redistest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StallInterval is how often a [StallWatch] asks Redis.
const StallInterval = 10 * time.Millisecond

// Stall is a time during which a [StallWatch] got no reply from Redis
// although it asked every [StallInterval]: its process, or Redis, was not
// running (a busy machine, a stop-the-world pause).
type Stall struct {
	Start, End time.Time // the reply before it and the reply that ended it
}

// Len returns how long the stall lasted.
func (s Stall) Len() time.Duration { return s.End.Sub(s.Start) }

// StallWatch measures how promptly the calling process and Redis run: a
// goroutine sends PING every [StallInterval] and records each time between
// two consecutive replies that is longer than a threshold. Tests whose
// scenario assumes prompt timers and round trips (a lock renewed every
// TTL/3, a lease heartbeat, a histogram of attempt times) read it to tell a
// machine too busy for the scenario from a product bug, and widen or repeat
// the scenario instead of failing. Its methods are safe for concurrent use.
type StallWatch struct {
	over   time.Duration
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	last   time.Time // the latest reply
	stalls []Stall
}

// WatchStalls starts a StallWatch on rdb that records the times between
// replies longer than over. Call Stop when done.
func WatchStalls(rdb redis.UniversalClient, over time.Duration) *StallWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &StallWatch{over: over, cancel: cancel, done: make(chan struct{}), last: time.Now()}
	go w.run(ctx, rdb)
	return w
}

func (w *StallWatch) run(ctx context.Context, rdb redis.UniversalClient) {
	defer close(w.done)
	t := time.NewTicker(StallInterval)
	defer t.Stop()
	for {
		// An error (Redis down, a timeout) is no reply: the stall goes on.
		if rdb.Ping(ctx).Err() == nil {
			now := time.Now()
			w.mu.Lock()
			if now.Sub(w.last) > w.over {
				w.stalls = append(w.stalls, Stall{Start: w.last, End: now})
			}
			w.last = now
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stalls returns the stalls that have ended (a reply came), in order.
func (w *StallWatch) Stalls() []Stall {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Stall(nil), w.stalls...)
}

// Longest returns the longest stall so far, counting the time since the
// latest reply if that is longer than the threshold (a stall going on), or
// 0.
func (w *StallWatch) Longest() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	if now := time.Now(); now.Sub(w.last) > w.over {
		d = now.Sub(w.last)
	}
	for _, s := range w.stalls {
		d = max(d, s.Len())
	}
	return d
}

// Within returns how much of the time from from to to was stalled: the
// total overlap of the stalls (and a stall going on) with it.
func (w *StallWatch) Within(from, to time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	stalls := w.stalls
	if now := time.Now(); now.Sub(w.last) > w.over {
		stalls = append(stalls[:len(stalls):len(stalls)], Stall{Start: w.last, End: now})
	}
	var d time.Duration
	for _, s := range stalls {
		start, end := s.Start, s.End
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if end.After(start) {
			d += end.Sub(start)
		}
	}
	return d
}

// Stop stops the watch and waits for its goroutine to return.
func (w *StallWatch) Stop() {
	w.cancel()
	<-w.done
}

// WidenRuns is how many runs [Widen] makes at most.
const WidenRuns = 4

// Widen runs scenario in a subtest named name=scale, first with scale
// first. A run that measured that the machine broke its precondition (a
// process or Redis stalled longer than its timings allow, the test could not
// probe often enough) checked nothing: it logs why and returns a wider
// scale, and Widen runs the scenario again with the larger of that and
// twice the scale. A run returns 0 when it checked what it means to check;
// its failures are the product's. Widen skips the test, saying so, if
// [WidenRuns] runs in a row could not check: the machine, not the product,
// kept the scenario from meaning anything (each run logged why), and a
// slow machine must not fail a test.
func Widen(t *testing.T, name string, first time.Duration, scenario func(t *testing.T, scale time.Duration) (wider time.Duration)) {
	t.Helper()
	scale := first
	for run := 1; ; run++ {
		var wider time.Duration
		if !t.Run(fmt.Sprintf("%s=%v", name, scale), func(t *testing.T) { wider = scenario(t, scale) }) || wider == 0 {
			return
		}
		if run == WidenRuns {
			t.Skipf("NOT CHECKED: %d runs, the last with %s=%v, were too slow for the scenario to check anything (see each run's log)", run, name, scale)
		}
		scale = max(wider, 2*scale)
	}
}

// CallTimer is a go-redis hook that adds up the time its client spends in
// commands and pipelines (from the call to the reply, client side
// included): the work a paced loop did, as opposed to the time it waited.
// Add it with AddHook. Its methods are safe for concurrent use.
type CallTimer struct {
	mu    sync.Mutex
	total time.Duration
}

// Total returns the time spent in calls so far.
func (c *CallTimer) Total() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

func (c *CallTimer) add(d time.Duration) {
	c.mu.Lock()
	c.total += d
	c.mu.Unlock()
}

// DialHook implements redis.Hook.
func (c *CallTimer) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *CallTimer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		defer func() { c.add(time.Since(start)) }()
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *CallTimer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		defer func() { c.add(time.Since(start)) }()
		return next(ctx, cmds)
	}
}

// Call is the time a client call was in flight: a request it sent reached
// the server somewhere in between.
type Call struct {
	Start, End time.Time
}

// Uncovered returns the total length of the stretches of time longer than
// over that hold no whole call (merged where they overlap). Between two
// consecutive arrivals at the server lies no whole call, so these stretches
// hold every gap between arrivals longer than over: a rate limiter's
// unused capacity can lapse there and nowhere else. calls need not be
// sorted.
func Uncovered(calls []Call, over time.Duration) time.Duration {
	if len(calls) < 2 {
		return 0
	}
	cs := slices.Clone(calls)
	slices.SortFunc(cs, func(a, b Call) int { return a.Start.Compare(b.Start) })
	// After call i starts, no whole call lies before the earliest return
	// of the calls started after it. Walking back, these stretches start
	// earlier and end no later; merge those that overlap.
	var total time.Duration
	earliest := cs[len(cs)-1].End
	var hole Call
	for i := len(cs) - 2; i >= 0; i-- {
		if cs[i+1].End.Before(earliest) {
			earliest = cs[i+1].End
		}
		from, to := cs[i].Start, earliest
		if to.Sub(from) <= over {
			continue
		}
		if !hole.Start.IsZero() && !to.Before(hole.Start) {
			hole.Start = from
			continue
		}
		total += hole.End.Sub(hole.Start)
		hole = Call{from, to}
	}
	return total + hole.End.Sub(hole.Start)
}

// CallBounds returns the earliest start and return of calls (first) and
// the latest ones (last): every arrival lies between first.Start and
// last.End, one lies no later than first.End and one no earlier than
// last.Start.
func CallBounds(calls []Call) (first, last Call) {
	if len(calls) == 0 {
		return first, last
	}
	first, last = calls[0], calls[0]
	for _, c := range calls[1:] {
		if c.Start.Before(first.Start) {
			first.Start = c.Start
		}
		if c.End.Before(first.End) {
			first.End = c.End
		}
		if c.Start.After(last.Start) {
			last.Start = c.Start
		}
		if c.End.After(last.End) {
			last.End = c.End
		}
	}
	return first, last
}
