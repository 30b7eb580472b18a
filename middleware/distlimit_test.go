package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/internal/poll"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// distSetup returns a key prefix of the test's own on the shared Redis,
// deleted at the end of the test, and n clients to it: n "processes".
func distSetup(t *testing.T, n int) (string, []*redis.Client) {
	t.Helper()
	admin := redistest.Shared(t)
	prefix := redistest.Prefix(t, admin)
	clients := make([]*redis.Client, n)
	for i := range clients {
		clients[i] = redistest.Shared(t)
	}
	return prefix, clients
}

func TestDistributedConcurrency_neverExceedsLimitAcrossProcesses(t *testing.T) {
	t.Parallel()
	prefix, clients := distSetup(t, 2)
	const limit = 3
	var running, maxSeen, ran, snoozed atomic.Int64
	inner := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		n := running.Add(1)
		for {
			m := maxSeen.Load()
			if n <= m || maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		running.Add(-1)
		ran.Add(1)
		return nil
	})
	var wg sync.WaitGroup
	for _, rdb := range clients {
		// Each "process" has its own client and its own middleware.
		h := middleware.DistributedConcurrency(rdb, middleware.DistributedConcurrencyConfig{
			Limit: limit, Prefix: prefix, Lease: 5 * time.Second,
		})(inner)
		for range 6 {
			wg.Go(func() {
				for range 40 {
					err := h.Process(context.Background(), &stream.Job{Type: "export"})
					if _, ok := snoozeDelay(err); ok {
						snoozed.Add(1)
					} else if err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	t.Logf("ran %d, snoozed %d, at most %d at once", ran.Load(), snoozed.Load(), maxSeen.Load())
	if m := maxSeen.Load(); m != limit {
		t.Errorf("at most %d jobs ran at once across both processes, want exactly the limit %d", m, limit)
	}
	if snoozed.Load() == 0 {
		t.Error("no job was snoozed: the limit was never reached")
	}
	// Every slot was released.
	if n := clients[0].ZCard(context.Background(), prefix+"type:export").Val(); n != 0 {
		t.Errorf("%d holders left after every job returned", n)
	}
}

// TestDistributedConcurrency_crashedHolderExpires: the slot of a process
// that lost Redis for good frees itself when its lease expires, not before.
// The scenario assumes that nothing stalls for a third of the lease (C
// renews every lease/3; B first tries, and A's loss is noted, soon after A
// took its slot); a run in which this process or Redis stalled that long
// (a [redistest.StallWatch]) checked nothing and runs again with a longer
// lease.
func TestDistributedConcurrency_crashedHolderExpires(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "lease", 300*time.Millisecond, crashedHolderExpires)
}

// crashedHolderExpires runs TestDistributedConcurrency_crashedHolderExpires
// with lease; it returns a longer lease if the run stalled too long to
// check anything.
func crashedHolderExpires(t *testing.T, lease time.Duration) (wider time.Duration) {
	prefix, clients := distSetup(t, 2)
	watch := redistest.WatchStalls(redistest.Shared(t), 2*redistest.StallInterval)
	defer watch.Stop()
	stalled := func() bool {
		if d := watch.Longest(); d >= lease/3 {
			t.Logf("stalled %v, a third of the lease or more: the run checked nothing", d)
			wider = 4 * lease
			return true
		}
		return false
	}
	cfg := middleware.DistributedConcurrencyConfig{Limit: 2, Prefix: prefix, Lease: lease}

	// Process C holds one of the two slots for the whole test, renewing its
	// lease (so the key itself never expires).
	cStarted, cRelease := make(chan struct{}), make(chan struct{})
	cDone := make(chan error, 1)
	c := middleware.DistributedConcurrency(clients[1], cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		close(cStarted)
		select {
		case <-cRelease:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}))
	go func() { cDone <- c.Process(context.Background(), &stream.Job{Type: "export"}) }()
	<-cStarted
	defer func() {
		close(cRelease)
		if err := <-cDone; err != nil && !stalled() {
			t.Errorf("process C: %v", err)
		}
	}()

	// Process A takes the other slot, then loses Redis for good (as if it
	// crashed): its lease is neither renewed nor released.
	started := make(chan struct{})
	causes := make(chan error, 1)
	a := middleware.DistributedConcurrency(clients[0], cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return context.Cause(ctx)
	}))
	go func() { _ = a.Process(context.Background(), &stream.Job{Type: "export"}) }()
	<-started
	lost := time.Now()
	_ = clients[0].Close()

	// Process B is snoozed while A's lease lasts, and admitted once it has
	// expired.
	var ran atomic.Bool
	b := middleware.DistributedConcurrency(clients[1], cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran.Store(true)
		return nil
	}))
	if _, ok := snoozeDelay(b.Process(context.Background(), &stream.Job{Type: "export"})); !ok || ran.Load() {
		if stalled() {
			return wider
		}
		t.Fatal("process B ran while A and C held both slots")
	}
	eventually(t, 30*time.Second, func() bool {
		err := b.Process(context.Background(), &stream.Job{Type: "export"})
		return err == nil && ran.Load()
	})
	if took := time.Since(lost); took < lease-lease/3 {
		if stalled() {
			return wider
		}
		t.Errorf("B admitted %v after A lost Redis, before A's lease (%v) could expire", took, lease)
	}
	t.Logf("B admitted %v after A lost Redis (lease %v)", time.Since(lost), lease)

	// A's handler was told: its renewals failed for a whole lease.
	select {
	case cause := <-causes:
		if !errors.Is(cause, middleware.ErrLimitLeaseLost) {
			t.Errorf("A's context cause: %v, want ErrLimitLeaseLost", cause)
		}
	case <-time.After(30 * time.Second):
		t.Error("A's handler context was not cancelled after its lease was lost")
	}
	return wider
}

func TestDistributedConcurrency_renewal(t *testing.T) {
	t.Parallel()
	t.Run("KeepsTheSlotOfALongJob", func(t *testing.T) {
		t.Parallel()
		// A run in which this process or Redis went Lease/3 or longer
		// without a reply (a busy machine) checked nothing, and is repeated
		// with a wider lease.
		redistest.Widen(t, "lease", 150*time.Millisecond, func(t *testing.T, lease time.Duration) time.Duration {
			prefix, clients := distSetup(t, 2)
			stalls := redistest.WatchStalls(clients[0], 2*redistest.StallInterval)
			defer stalls.Stop()
			cfg := middleware.DistributedConcurrencyConfig{Limit: 1, Prefix: prefix, Lease: lease}
			started, release := make(chan struct{}), make(chan struct{})
			a := middleware.DistributedConcurrency(clients[0], cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				close(started)
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}))
			res := make(chan error, 1)
			go func() { res <- a.Process(context.Background(), &stream.Job{Type: "export"}) }()
			<-started
			b := middleware.DistributedConcurrency(clients[1], cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				return errors.New("B ran while A held the only slot")
			}))
			// For 4 leases, B never gets in.
			var failed bool
			for end := time.Now().Add(4 * lease); time.Now().Before(end) && !failed; time.Sleep(10 * time.Millisecond) {
				_, ok := snoozeDelay(b.Process(context.Background(), &stream.Job{Type: "export"}))
				failed = !ok
			}
			close(release)
			aerr := <-res
			if stall := stalls.Longest(); (failed || aerr != nil) && stall >= lease/3 {
				t.Logf("the run checked nothing: this process or Redis went %v without a reply, Lease/3 = %v", stall, lease/3)
				return 4 * stall
			}
			if failed {
				t.Fatal("B was not snoozed: A's lease was not renewed")
			}
			if aerr != nil {
				t.Fatalf("A: %v", aerr)
			}
			return 0
		})
	})
	t.Run("LostLeaseCancelsTheHandler", func(t *testing.T) {
		t.Parallel()
		prefix, clients := distSetup(t, 1)
		cfg := middleware.DistributedConcurrencyConfig{Limit: 1, Prefix: prefix, Lease: 150 * time.Millisecond}
		started := make(chan struct{})
		h := middleware.DistributedConcurrency(clients[0], cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			close(started)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(5 * time.Second):
				return errors.New("not cancelled")
			}
		}))
		res := make(chan error, 1)
		go func() { res <- h.Process(context.Background(), &stream.Job{Type: "export"}) }()
		<-started
		// Someone removes the holders (an operator, a failover that lost
		// the write): the next renewal finds the lease gone.
		clients[0].Del(context.Background(), prefix+"type:export")
		if err := <-res; !errors.Is(err, middleware.ErrLimitLeaseLost) {
			t.Fatalf("got %v, want ErrLimitLeaseLost", err)
		}
	})
}

func TestDistributedConcurrency_keys(t *testing.T) {
	t.Parallel()
	prefix, clients := distSetup(t, 1)
	var ran atomic.Int64
	release := make(chan struct{})
	defer close(release)
	h := middleware.DistributedConcurrency(clients[0], middleware.DistributedConcurrencyConfig{
		Limit: 1, Prefix: prefix,
		Key: func(job *stream.Job) string { return job.Headers["tenant"] },
	})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran.Add(1)
		<-release
		return nil
	}))
	job := func(tenant string) *stream.Job {
		return &stream.Job{Type: "t", Headers: map[string]string{"tenant": tenant}}
	}
	// One slot per tenant; no tenant means no limit.
	for _, tenant := range []string{"a", "b", "", ""} {
		go func() { _ = h.Process(context.Background(), job(tenant)) }()
	}
	eventually(t, 3*time.Second, func() bool { return ran.Load() == 4 })
	if _, ok := snoozeDelay(h.Process(context.Background(), job("a"))); !ok {
		t.Fatal("a second job of tenant a was not snoozed")
	}
	n, _ := clients[0].ZCard(context.Background(), prefix+"a").Result()
	if n != 1 {
		t.Fatalf("tenant a has %d holders, want 1 under key %q", n, prefix+"a")
	}
}

func TestDistributedConcurrency_config(t *testing.T) {
	t.Parallel()
	for _, cfg := range []middleware.DistributedConcurrencyConfig{{}, {Limit: -1}, {Limit: 1, Lease: time.Millisecond}} {
		if cfg.Validate() == nil {
			t.Errorf("%+v: Validate accepted it", cfg)
		}
		ran := false
		err := middleware.DistributedConcurrency(nil, cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
			ran = true
			return nil
		})).Process(t.Context(), &stream.Job{Stream: "s"})
		if err == nil || ran || !strings.Contains(err.Error(), "DistributedConcurrencyConfig.") {
			t.Errorf("%+v: Process = %v (ran %v), want the invalid field's error without running", cfg, err, ran)
		}
	}
	// A Redis error fails the job (a retryable failure) without running it.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	h := middleware.DistributedConcurrency(rdb, middleware.DistributedConcurrencyConfig{Limit: 1})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error { return errors.New("ran") }))
	err := h.Process(context.Background(), &stream.Job{Type: "x", Stream: "orders"})
	var o *consumer.Outcome
	if err == nil || errors.As(err, &o) || err.Error() == "ran" || strings.Contains(err.Error(), "job.Stream") {
		t.Fatalf("got %v, want the Redis error", err)
	}
	// Without a Prefix, a job must name its queue.
	if err := h.Process(context.Background(), &stream.Job{Type: "x"}); err == nil || !strings.Contains(err.Error(), "job.Stream") {
		t.Fatalf("a job without a stream: %v, want an error naming job.Stream", err)
	}
}

// eventually polls cond every 10 ms and fails the test if it is not true
// within timeout.
func eventually(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.Until(t, timeout, poll.True("", cond))
}

// At most one "export" job of queue "reports" runs at once across every
// process sharing the Redis; a second is snoozed.
func ExampleDistributedConcurrency() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	started, release := make(chan struct{}), make(chan struct{})
	export := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		close(started)
		<-release
		return nil
	})
	h := middleware.DistributedConcurrency(rdb, middleware.DistributedConcurrencyConfig{
		Limit: 1,
		Lease: 10 * time.Second,
	})(export)

	done := make(chan error)
	job := &stream.Job{Type: "export", Stream: "reports"}
	go func() { done <- h.Process(context.Background(), job) }()
	<-started
	err = h.Process(context.Background(), job)
	var o *consumer.Outcome
	fmt.Println("second job snoozed:", errors.As(err, &o) && !o.CountsAttempt())
	close(release)
	fmt.Println("first job:", <-done)
	// The slots of the queue's key type:export:
	fmt.Println("holders left:", rdb.ZCard(context.Background(), "{reports}:limit:type:export").Val())
	// Output:
	// second job snoozed: true
	// first job: <nil>
	// holders left: 0
}
