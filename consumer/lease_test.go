package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// pendingEntry returns the pending entry id, failing the test if it is not
// pending.
func (b *bundle) pendingEntry(t *testing.T, id string) redis.XPendingExt {
	t.Helper()
	for _, p := range b.pending(t) {
		if p.ID == id {
			return p
		}
	}
	t.Fatalf("entry %s is not pending", id)
	return redis.XPendingExt{}
}

func TestConsumer_Heartbeat(t *testing.T) {
	t.Parallel()

	t.Run("KeepsLongJobFromOtherConsumers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Long enough for a heartbeat's round trip on a loaded machine: a
		// lease not renewed in time cancels the handler.
		const visibility = 2 * time.Second
		b.cfg.VisibilityTimeout = visibility
		b.cfg.HeartbeatInterval = visibility / 3
		b.cfg.SweepInterval = 20 * time.Millisecond
		id, _ := b.enqueue(t, "long", 1)

		started := make(chan struct{}, 1)
		release := make(chan struct{})
		cancelled := make(chan error, 1)
		c1 := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			started <- struct{}{}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				cancelled <- context.Cause(ctx)
				return ctx.Err()
			}
		}))
		start(t, c1)
		recv(t, started, 5*time.Second, "c1 to start the job")

		// A second consumer sweeps for idle jobs every 20 ms.
		cfg2 := b.cfg
		cfg2.Consumer = "c2"
		var stolen atomic.Int32
		c2 := consumer.New(b.rdb, cfg2).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			stolen.Add(1)
			return nil
		}))
		start(t, c2)

		// The job runs two visibility timeouts, all the while owned by c1
		// and delivered once.
		for end := time.Now().Add(2 * visibility); time.Now().Before(end); {
			p := b.pendingEntry(t, id)
			if p.Consumer != "c1" || p.RetryCount != 1 {
				t.Fatalf("while c1 runs the job, XPENDING says owner %s, deliveries %d; want c1, 1", p.Consumer, p.RetryCount)
			}
			if p.Idle >= visibility {
				t.Fatalf("the running job is idle %v, past the visibility timeout %v", p.Idle, visibility)
			}
			select {
			case err := <-cancelled:
				t.Fatalf("c1's handler was cancelled (%v) while it held the lease", err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		close(release)
		waitFor(t, 5*time.Second, "c1 to acknowledge the job", func() bool { return c1.Stats().Acked == 1 })
		if n := stolen.Load(); n != 0 {
			t.Errorf("c2 ran the job %d times while c1 was running it", n)
		}
		if s := c2.Stats(); s.Reclaimed != 0 {
			t.Errorf("c2.Stats().Reclaimed = %d, want 0", s.Reclaimed)
		}
		if s := c1.Stats(); s.LeaseLost != 0 || s.Stale != 0 {
			t.Errorf("c1.Stats() = %+v; want no lease lost, nothing stale", s)
		}
	})

	t.Run("NegativeIntervalEndsLeaseAtVisibilityTimeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const visibility = time.Second
		b.cfg.VisibilityTimeout = visibility
		b.cfg.HeartbeatInterval = -1
		// c1 sweeps only when it starts, so that its own sweep does not
		// reclaim the job it is running before c2 can.
		b.cfg.SweepInterval = time.Minute
		id, _ := b.enqueue(t, "long", 1)
		started := make(chan struct{}, 1)
		var observed atomic.Bool // c1's handler has seen its context cancelled
		type cancellation struct {
			cause error
			after time.Duration // since c1 started
		}
		cancelled := make(chan cancellation, 1)
		// c1 starts after the enqueue, so its lease starts after t0.
		t0 := time.Now()
		c1 := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			started <- struct{}{}
			<-ctx.Done()
			observed.Store(true)
			cancelled <- cancellation{context.Cause(ctx), time.Since(t0)}
			return ctx.Err()
		}))
		start(t, c1)
		recv(t, started, 5*time.Second, "c1 to start the job")

		cfg2 := b.cfg
		cfg2.Consumer = "c2"
		cfg2.SweepInterval = 20 * time.Millisecond
		type run struct {
			job          stream.Job
			afterC1Ended bool
		}
		got := make(chan run, 1)
		c2 := consumer.New(b.rdb, cfg2).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			got <- run{*j, observed.Load()}
			return nil
		}))
		start(t, c2)
		// Without heartbeats the lease ends VisibilityTimeout after the
		// delivery: c1's handler is cancelled then (a tenth before), not
		// earlier, and before c2 takes the job over.
		c := recv(t, cancelled, 5*time.Second, "c1's handler to be cancelled")
		if !errors.Is(c.cause, consumer.ErrLeaseLost) {
			t.Errorf("context.Cause in c1's handler = %v, want ErrLeaseLost", c.cause)
		}
		if min := visibility - visibility/10; c.after < min {
			t.Errorf("c1's handler was cancelled %v after c1 started, before its lease of %v could end", c.after, min)
		}
		r := recv(t, got, 5*time.Second, "c2 to take over the job")
		if r.job.EntryID != id || r.job.Deliveries != 2 {
			t.Errorf("c2 ran entry %s (deliveries %d), want %s (2)", r.job.EntryID, r.job.Deliveries, id)
		}
		if !r.afterC1Ended {
			t.Errorf("c2 started the job before c1's handler had seen its lease end")
		}
		waitFor(t, 5*time.Second, "c2 to acknowledge the job", func() bool { return c2.Stats().Acked == 1 })
		if s := c1.Stats(); s.LeaseLost != 1 || s.Acked+s.Retried+s.Stale != 0 {
			t.Errorf("c1.Stats() = %+v; want LeaseLost 1 and no settlement tried", s)
		}
	})

	t.Run("OwnSweepDoesNotRunJobTwice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const visibility = 200 * time.Millisecond
		b.cfg.VisibilityTimeout = visibility
		b.cfg.HeartbeatInterval = -1 // c1's own sweep finds its running job idle
		b.cfg.SweepInterval = 20 * time.Millisecond
		id, _ := b.enqueue(t, "long", 1)
		var running, most, runs atomic.Int32
		started := make(chan struct{}, 10)
		release := make(chan struct{})
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.Add(1)
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			started <- struct{}{}
			<-release // ignores its context, cancelled when the lease ends
			return nil
		}))
		start(t, c)
		recv(t, started, 5*time.Second, "the job to start")
		waitFor(t, 5*time.Second, "c1 to reclaim its own running job", func() bool { return c.Stats().Reclaimed >= 2 })
		close(release)
		// The first run lost its lease, so it is not settled: the job runs
		// again, alone, and is acknowledged.
		waitFor(t, 5*time.Second, "the job acknowledged", func() bool { return c.Stats().Acked >= 1 })
		if n := most.Load(); n != 1 {
			t.Errorf("c1 ran entry %s %d times at once, want 1", id, n)
		}
		if s := c.Stats(); s.Acked != 1 || s.Stale != 0 || s.LeaseLost == 0 {
			t.Errorf("Stats() = %+v (runs %d); want the first run's lease lost, one run acknowledged, nothing stale", s, runs.Load())
		}
	})

	t.Run("AbandonedJobIsReclaimed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		b.cfg.VisibilityTimeout = 300 * time.Millisecond
		b.cfg.SweepInterval = 20 * time.Millisecond
		id, job := b.enqueue(t, "t", 1)
		// A consumer that died holding the job: read, never heartbeated.
		if err := b.rdb.XGroupCreateMkStream(ctx, b.cfg.Stream, b.cfg.Group, "0").Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.cfg.Group, Consumer: "dead",
			Streams: []string{b.cfg.Stream, ">"}, Count: 1, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
		got := make(chan stream.Job, 1)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			got <- *j
			return nil
		}))
		t0 := time.Now()
		start(t, c)
		j := recv(t, got, 5*time.Second, "the abandoned job to be reclaimed")
		if d := time.Since(t0); d < 250*time.Millisecond {
			t.Errorf("the job was reclaimed after %v, before the visibility timeout", d)
		}
		if j.EntryID != id || j.ID != job.ID || j.Deliveries != 2 {
			t.Errorf("reclaimed job: entry %s, job %s, deliveries %d; want %s, %s, 2", j.EntryID, j.ID, j.Deliveries, id, job.ID)
		}
		waitFor(t, 5*time.Second, "the job acknowledged", func() bool { return c.Stats().Acked == 1 })
		if s := c.Stats(); s.Reclaimed != 1 {
			t.Errorf("Stats().Reclaimed = %d, want 1", s.Reclaimed)
		}
	})
}

func TestConsumer_LeaseLost(t *testing.T) {
	t.Parallel()

	// steal makes consumer "thief" the owner of entry id, as a consumer that
	// reclaimed it would.
	steal := func(t *testing.T, b *bundle, id string) {
		t.Helper()
		n, err := b.rdb.XClaim(context.Background(), &redis.XClaimArgs{Stream: b.cfg.Stream, Group: b.cfg.Group,
			Consumer: "thief", Messages: []string{id}}).Result()
		if err != nil || len(n) != 1 {
			t.Fatalf("XCLAIM to thief: %v, %v", n, err)
		}
	}

	t.Run("HeartbeatCancelsHandler", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cfg.VisibilityTimeout = time.Second
		b.cfg.HeartbeatInterval = 30 * time.Millisecond
		id, _ := b.enqueue(t, "t", 1)
		started := make(chan struct{}, 1)
		causes := make(chan error, 1)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				causes <- context.Cause(ctx)
			case <-time.After(5 * time.Second):
				causes <- nil
			}
			// An error: it must not be retried either.
			return errors.New("interrupted")
		}))
		r := start(t, c)
		recv(t, started, 5*time.Second, "the job to start")
		steal(t, b, id)
		if cause := recv(t, causes, 5*time.Second, "the handler to return"); !errors.Is(cause, consumer.ErrLeaseLost) {
			t.Fatalf("context.Cause in the handler = %v, want ErrLeaseLost", cause)
		}
		if err := r.stop(t); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if p := b.pendingEntry(t, id); p.Consumer != "thief" || p.RetryCount != 2 {
			t.Errorf("after c1 stopped, the entry is pending for %s with %d deliveries; want thief, 2", p.Consumer, p.RetryCount)
		}
		if s := c.Stats(); s.LeaseLost != 1 || s.Acked != 0 || s.Retried != 0 || s.DeadLettered != 0 || s.Stale != 0 {
			t.Errorf("Stats() = %+v; want LeaseLost 1 and no settlement tried", s)
		}
		if n := len(b.entries(t, b.cfg.Stream)); n != 1 || b.delayed(t) != 0 {
			t.Errorf("stream has %d entries, delayed set %d; want no retry scheduled", n, b.delayed(t))
		}
	})

	t.Run("RedisUnreachableCancelsHandler", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		logger, logs := newCapture(slog.LevelInfo)
		b.cfg.Logger = logger
		b.cfg.VisibilityTimeout = time.Second
		b.cfg.HeartbeatInterval = 100 * time.Millisecond
		b.enqueue(t, "t", 1)
		started := make(chan struct{}, 1)
		causes := make(chan error, 1)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				causes <- context.Cause(ctx)
			case <-time.After(20 * time.Second):
				causes <- nil
			}
			return ctx.Err()
		}))
		r := start(t, c)
		recv(t, started, 5*time.Second, "the job to start")
		b.m.Close() // Redis goes away; nobody can learn who owns the job
		cause := recv(t, causes, 15*time.Second, "the handler to return")
		if !errors.Is(cause, consumer.ErrLeaseLost) {
			t.Fatalf("context.Cause in the handler = %v, want ErrLeaseLost", cause)
		}
		// Both failures are logged: the heartbeat's own rate limit is not
		// used up by the other loops' errors (reading, sweeping, promoting:
		// whichever fails first takes their shared limit).
		waitFor(t, 5*time.Second, "a log record of the read loop's or the promoter's failure", func() bool {
			return len(logs.withMsg("reading from Redis failed; backing off"))+len(logs.withMsg("sweeping for idle jobs failed"))+
				len(logs.withMsg("moving due jobs from the delayed set failed")) > 0
		})
		rec := logs.wait(t, "heartbeat failed: could not extend the leases of running jobs; a handler is cancelled when its lease ends")
		if rec.level != slog.LevelError || rec.attrs["error"].String() == "" || rec.attrs["jobs"].Int64() != 1 {
			t.Errorf("heartbeat failure logged at %v with %v; want Error with the error and jobs=1", rec.level, rec.attrs)
		}
		if err := r.stop(t); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if s := c.Stats(); s.LeaseLost != 1 || s.Acked+s.Retried+s.Stale != 0 {
			t.Errorf("Stats() = %+v; want LeaseLost 1 and no settlement", s)
		}
	})

	t.Run("CompletionDoesNotAckThiefsEntry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Heartbeats are too rare to notice the theft before the handler
		// returns: the ack itself must check ownership.
		b.cfg.VisibilityTimeout = 30 * time.Second
		b.cfg.HeartbeatInterval = 10 * time.Second
		id, _ := b.enqueue(t, "t", 1)
		started := make(chan struct{}, 1)
		stolen := make(chan struct{})
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			started <- struct{}{}
			<-stolen
			return nil
		}))
		r := start(t, c)
		recv(t, started, 5*time.Second, "the job to start")
		steal(t, b, id)
		close(stolen)
		waitFor(t, 5*time.Second, "the ack refused as stale", func() bool { return c.Stats().Stale == 1 })
		if err := r.stop(t); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if p := b.pendingEntry(t, id); p.Consumer != "thief" {
			t.Errorf("the entry is pending for %s, want thief", p.Consumer)
		}
		if s := c.Stats(); s.Acked != 0 {
			t.Errorf("Stats().Acked = %d, want 0", s.Acked)
		}
	})

	for _, tc := range []struct {
		name    string
		outcome error
	}{
		{"RetryDoesNotSettleThiefsEntry", consumer.Retry(0, errors.New("again"))},
		{"DeadDoesNotSettleThiefsEntry", consumer.Dead("x", nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.cfg.VisibilityTimeout = 30 * time.Second
			b.cfg.HeartbeatInterval = 10 * time.Second
			id, _ := b.enqueue(t, "t", 1)
			started := make(chan struct{}, 1)
			stolen := make(chan struct{})
			c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				started <- struct{}{}
				<-stolen
				return tc.outcome
			}))
			r := start(t, c)
			recv(t, started, 5*time.Second, "the job to start")
			steal(t, b, id)
			close(stolen)
			waitFor(t, 5*time.Second, "the settlement refused as stale", func() bool { return c.Stats().Stale == 1 })
			if err := r.stop(t); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			if p := b.pendingEntry(t, id); p.Consumer != "thief" {
				t.Errorf("the entry is pending for %s, want thief", p.Consumer)
			}
			if n := len(b.entries(t, b.cfg.Stream)); n != 1 || len(b.dead(t)) != 0 {
				t.Errorf("stream has %d entries, dead-letter stream %d; want the one entry, nothing dead", n, len(b.dead(t)))
			}
		})
	}
}
