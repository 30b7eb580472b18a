package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// breakerBundle is a breaker under test and its collaborators: a settable
// clock, a handler whose result the test sets (and which may block), and
// the recorded state changes.
type breakerBundle struct {
	h      consumer.Handler
	now    atomic.Int64 // Unix nanoseconds
	calls  atomic.Int64
	result atomic.Pointer[error]
	block  atomic.Pointer[chan struct{}] // if set, the handler waits on it
	// panicNext makes the next call panic.
	panicNext atomic.Bool
	mu        sync.Mutex
	changes   []string
}

func (b *breakerBundle) returns(err error)            { b.result.Store(&err) }
func (b *breakerBundle) at(t0 int64, d time.Duration) { b.now.Store(t0 + int64(d)) }

func (b *breakerBundle) transitions() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.changes)
}

func (b *breakerBundle) run(typ string) error {
	return b.h.Process(context.Background(), &stream.Job{ID: "j", Type: typ})
}

func setupBreaker(t testing.TB, cfg middleware.CircuitBreakerConfig) *breakerBundle {
	t.Helper()
	b := &breakerBundle{}
	b.now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	b.returns(nil)
	cfg.Now = func() time.Time { return time.Unix(0, b.now.Load()) }
	cfg.OnStateChange = func(key string, from, to middleware.BreakerState) {
		b.mu.Lock()
		b.changes = append(b.changes, fmt.Sprintf("%s:%v->%v", key, from, to))
		b.mu.Unlock()
	}
	b.h = middleware.CircuitBreaker(cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		b.calls.Add(1)
		if b.panicNext.CompareAndSwap(true, false) {
			panic("handler bug")
		}
		if c := b.block.Load(); c != nil {
			<-*c
		}
		return *b.result.Load()
	}))
	return b
}

var errBreakerDown = errors.New("downstream unavailable")

// open trips b's "api" breaker with threshold failures and returns the time
// it opened.
func (b *breakerBundle) open(t *testing.T, threshold int) int64 {
	t.Helper()
	b.returns(errBreakerDown)
	for i := range threshold {
		if err := b.run("api"); !errors.Is(err, errBreakerDown) {
			t.Fatalf("failure %d: got %v, want the handler's error", i+1, err)
		}
	}
	return b.now.Load()
}

func TestCircuitBreaker_opensAfterThreshold(t *testing.T) {
	t.Parallel()
	const openFor = 16 * time.Second
	b := setupBreaker(t, middleware.CircuitBreakerConfig{Threshold: 3, OpenFor: openFor})
	b.returns(errBreakerDown)
	for range 2 {
		_ = b.run("api")
	}
	if got := b.transitions(); len(got) != 0 {
		t.Fatalf("opened after 2 failures of 3: %v", got)
	}
	t0 := b.open(t, 1)
	if got := b.transitions(); !slices.Equal(got, []string{"api:closed->open"}) {
		t.Fatalf("transitions %v, want [api:closed->open]", got)
	}
	// Open: every job is snoozed for at least the rest of the open time
	// (plus at most a sixteenth of it rounding up, and a sixteenth of
	// jitter), without calling the handler.
	calls := b.calls.Load()
	for _, at := range []time.Duration{0, time.Millisecond, 5 * time.Second, openFor - time.Millisecond} {
		b.at(t0, at)
		err := b.run("api")
		d, ok := snoozeDelay(err)
		if !ok {
			t.Fatalf("open +%v: got %v, want a snooze", at, err)
		}
		rest := openFor - at
		if d < rest || d > rest+2*openFor/16 {
			t.Errorf("open +%v: snooze %v, want in [%v, %v]", at, d, rest, rest+2*openFor/16)
		}
	}
	if n := b.calls.Load() - calls; n != 0 {
		t.Fatalf("the handler was called %d times while the breaker was open", n)
	}
	// Another key has its own breaker.
	b.returns(nil)
	if err := b.run("other"); err != nil {
		t.Fatal(err)
	}
}

func TestCircuitBreaker_countsOnlyConsecutiveRetryableFailures(t *testing.T) {
	t.Parallel()
	b := setupBreaker(t, middleware.CircuitBreakerConfig{Threshold: 3})
	for i, err := range []error{
		errBreakerDown, errBreakerDown,
		nil, // a success resets the count
		errBreakerDown, errBreakerDown,
		// neither counts nor resets:
		consumer.Permanent(errors.New("bad request")),
		consumer.Dead("invalid", errors.New("no")),
		consumer.Snooze(time.Second),
		fmt.Errorf("stopped: %w", consumer.ErrShutdown),
	} {
		b.returns(err)
		if got := b.run("api"); !errors.Is(got, err) {
			t.Fatalf("job %d: got %v, want %v", i, got, err)
		}
	}
	if got := b.transitions(); len(got) != 0 {
		t.Fatalf("opened: %v", got)
	}
	// A third consecutive retryable failure opens it.
	b.returns(consumer.Retryable(errBreakerDown))
	_ = b.run("api")
	if got := b.transitions(); !slices.Equal(got, []string{"api:closed->open"}) {
		t.Fatalf("transitions %v, want [api:closed->open]", got)
	}
}

func TestCircuitBreaker_halfOpen(t *testing.T) {
	t.Parallel()
	const openFor = 10 * time.Second
	t.Run("ProbeSuccessCloses", func(t *testing.T) {
		t.Parallel()
		b := setupBreaker(t, middleware.CircuitBreakerConfig{Threshold: 2, OpenFor: openFor})
		t0 := b.open(t, 2)
		b.at(t0, openFor)
		b.returns(nil)
		release := make(chan struct{})
		b.block.Store(&release)
		probe := make(chan error, 1)
		calls := b.calls.Load()
		go func() { probe <- b.run("api") }()
		for b.calls.Load() == calls { // wait until the probe runs
			time.Sleep(time.Millisecond)
		}
		// One probe at a time: another job is snoozed.
		second := make(chan error, 1)
		go func() { second <- b.run("api") }()
		select {
		case err := <-second:
			if _, ok := snoozeDelay(err); !ok {
				t.Fatalf("a second job returned %v while the probe was running, want a snooze", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a second job ran while the probe was running")
		}
		b.block.Store(nil)
		close(release)
		if err := <-probe; err != nil {
			t.Fatal(err)
		}
		want := []string{"api:closed->open", "api:open->half-open", "api:half-open->closed"}
		if got := b.transitions(); !slices.Equal(got, want) {
			t.Fatalf("transitions %v, want %v", got, want)
		}
		// Closed: jobs run again, and failures are counted from zero.
		b.returns(errBreakerDown)
		if err := b.run("api"); !errors.Is(err, errBreakerDown) {
			t.Fatalf("after closing: %v", err)
		}
		if got := b.transitions(); len(got) != 3 {
			t.Fatalf("one failure after closing changed the state: %v", got)
		}
	})
	t.Run("ProbeFailureReopens", func(t *testing.T) {
		t.Parallel()
		b := setupBreaker(t, middleware.CircuitBreakerConfig{Threshold: 2, OpenFor: openFor})
		t0 := b.open(t, 2)
		b.at(t0, openFor+time.Second)
		calls := b.calls.Load()
		if err := b.run("api"); !errors.Is(err, errBreakerDown) { // the probe fails
			t.Fatalf("probe: %v", err)
		}
		if b.calls.Load() != calls+1 {
			t.Fatal("the probe did not run")
		}
		want := []string{"api:closed->open", "api:open->half-open", "api:half-open->open"}
		if got := b.transitions(); !slices.Equal(got, want) {
			t.Fatalf("transitions %v, want %v", got, want)
		}
		// Open again for a whole OpenFor from the probe's failure.
		b.at(t0, 2*openFor)
		if d, ok := snoozeDelay(b.run("api")); !ok || d < time.Second {
			t.Fatalf("after reopening: snooze %v (%v), want >= 1s", d, ok)
		}
		if b.calls.Load() != calls+1 {
			t.Fatal("the handler ran while the breaker was open again")
		}
	})
	t.Run("PanickingProbeFreesItsPlace", func(t *testing.T) {
		t.Parallel()
		b := setupBreaker(t, middleware.CircuitBreakerConfig{Threshold: 1, OpenFor: openFor})
		t0 := b.open(t, 1)
		b.at(t0, openFor)
		b.returns(nil)
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the probe's panic did not reach the caller (the core recovers it)")
				}
			}()
			b.panicNext.Store(true)
			_ = b.run("api")
		}()
		// The panicked probe's place is free: the next job runs as a probe
		// and closes the breaker, rather than being snoozed forever.
		if err := b.run("api"); err != nil {
			t.Fatalf("after a panicking probe: %v, want the next job to run as a probe", err)
		}
		if got := b.transitions(); got[len(got)-1] != "api:half-open->closed" {
			t.Fatalf("transitions %v, want the breaker closed by the next probe", got)
		}
	})
	t.Run("NeutralProbeKeepsHalfOpen", func(t *testing.T) {
		t.Parallel()
		b := setupBreaker(t, middleware.CircuitBreakerConfig{Threshold: 1, OpenFor: openFor})
		t0 := b.open(t, 1)
		b.at(t0, openFor)
		b.returns(consumer.Permanent(errors.New("bad input")))
		_ = b.run("api")
		b.returns(nil)
		if err := b.run("api"); err != nil { // the next job is a probe again
			t.Fatal(err)
		}
		want := []string{"api:closed->open", "api:open->half-open", "api:half-open->closed"}
		if got := b.transitions(); !slices.Equal(got, want) {
			t.Fatalf("transitions %v, want %v", got, want)
		}
	})
}

func TestCircuitBreaker_openPathDoesNotAllocate(t *testing.T) {
	b := setupBreaker(t, middleware.CircuitBreakerConfig{Threshold: 1, OpenFor: time.Minute})
	b.open(t, 1)
	job := &stream.Job{ID: "j", Type: "api"}
	ctx := context.Background()
	if _, ok := snoozeDelay(b.h.Process(ctx, job)); !ok {
		t.Fatal("not snoozed")
	}
	calls := b.calls.Load()
	var err error
	allocs := testing.AllocsPerRun(1000, func() { err = b.h.Process(ctx, job) })
	if _, ok := snoozeDelay(err); !ok || b.calls.Load() != calls {
		t.Fatalf("got %v, %d handler calls: the breaker was not open", err, b.calls.Load()-calls)
	}
	t.Logf("allocations per job rejected by an open breaker: %v", allocs)
	if allocs != 0 {
		t.Fatalf("%v allocations per job rejected by an open breaker, want 0", allocs)
	}
}

func TestCircuitBreaker_concurrent(t *testing.T) {
	t.Parallel()
	// Many goroutines fail and succeed through one breaker while it opens and
	// closes (the race detector checks its state); every job either runs or
	// is snoozed, and the transitions alternate as a breaker's must.
	var mu sync.Mutex
	last := middleware.BreakerClosed
	bad := 0
	var ran, snoozed atomic.Int64
	h := middleware.CircuitBreaker(middleware.CircuitBreakerConfig{
		Threshold: 3, OpenFor: 100 * time.Microsecond, HalfOpenProbes: 2,
		OnStateChange: func(key string, from, to middleware.BreakerState) {
			mu.Lock()
			defer mu.Unlock()
			if from != last || from == to {
				bad++
			}
			last = to
		},
	})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran.Add(1)
		if job.Attempt%3 != 0 {
			return errBreakerDown
		}
		return nil
	}))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 2000 {
				err := h.Process(context.Background(), &stream.Job{Type: "api", Attempt: i + j})
				if _, ok := snoozeDelay(err); ok {
					snoozed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if bad != 0 {
		t.Errorf("%d transitions did not start from the current state", bad)
	}
	if ran.Load()+snoozed.Load() != 16000 || snoozed.Load() == 0 {
		t.Errorf("ran %d, snoozed %d, want 16000 in all with some snoozed", ran.Load(), snoozed.Load())
	}
}

// BenchmarkCircuitBreaker_open measures the cost of a job rejected by an
// open breaker: no handler call, no lock, no Redis, no allocation.
func BenchmarkCircuitBreaker_open(b *testing.B) {
	bb := setupBreaker(b, middleware.CircuitBreakerConfig{Threshold: 1, OpenFor: time.Hour})
	bb.returns(errBreakerDown)
	_ = bb.run("api")
	job := &stream.Job{ID: "j", Type: "api"}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if bb.h.Process(ctx, job) == nil {
				b.Fatal("not rejected")
			}
		}
	})
}

// A breaker per downstream opens after 2 consecutive failures; while open,
// jobs are snoozed without calling the handler.
func ExampleCircuitBreaker() {
	calls := 0
	charge := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		calls++
		return errors.New("payment API: 503")
	})
	h := middleware.CircuitBreaker(middleware.CircuitBreakerConfig{
		Key:       func(job *stream.Job) string { return "payments-api" },
		Threshold: 2,
		OpenFor:   time.Minute,
		OnStateChange: func(key string, from, to middleware.BreakerState) {
			fmt.Printf("%s: %v -> %v\n", key, from, to)
		},
	})(charge)

	for range 4 {
		err := h.Process(context.Background(), &stream.Job{Type: "charge"})
		var o *consumer.Outcome
		if errors.As(err, &o) && !o.CountsAttempt() {
			fmt.Println("snoozed for about a minute:", o.Delay() >= time.Minute-time.Second)
		}
	}
	fmt.Println("handler calls:", calls)
	// Output:
	// payments-api: closed -> open
	// snoozed for about a minute: true
	// snoozed for about a minute: true
	// handler calls: 2
}
