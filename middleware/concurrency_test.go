package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// snoozeDelay returns the delay of err if it is a snooze outcome (one that
// does not count an attempt and does not dead-letter).
func snoozeDelay(err error) (time.Duration, bool) {
	var o *consumer.Outcome
	if !errors.As(err, &o) || o.CountsAttempt() || o.IsDead() {
		return 0, false
	}
	return o.Delay(), true
}

// concBlocker is a handler whose jobs block until released, and which
// records how many run at once.
type concBlocker struct {
	release          chan struct{}
	started          chan string
	running, maxSeen atomic.Int64
}

func newConcBlocker() *concBlocker {
	return &concBlocker{release: make(chan struct{}), started: make(chan string, 100)}
}

func (b *concBlocker) Process(ctx context.Context, job *stream.Job) error {
	n := b.running.Add(1)
	defer b.running.Add(-1)
	for {
		m := b.maxSeen.Load()
		if n <= m || b.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	b.started <- job.ID
	select {
	case <-b.release:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return nil
}

// concProcess runs job through h and fails the test if it has not
// returned within 5 s (a job that should have been turned away runs).
func concProcess(t *testing.T, h consumer.Handler, ctx context.Context, job *stream.Job) error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- h.Process(ctx, job) }()
	select {
	case err := <-res:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("job %s still running after 5s: it was not turned away", job.ID)
		return nil
	}
}

func concJob(typ, id string) *stream.Job { return &stream.Job{ID: id, Type: typ} }

func TestConcurrency_snoozesWhenFull(t *testing.T) {
	t.Parallel()
	b := newConcBlocker()
	h := middleware.Concurrency(middleware.ConcurrencyConfig{
		Limits:    map[string]int{"a": 2},
		SnoozeFor: 400 * time.Millisecond,
	})(b)
	ctx := context.Background()
	errs := make(chan error, 2)
	for i := range 2 {
		go func() { errs <- h.Process(ctx, concJob("a", fmt.Sprint(i))) }()
		<-b.started
	}
	// Both slots of "a" are held: the third job is snoozed at once, and the
	// handler is not called.
	err := concProcess(t, h, ctx, concJob("a", "3"))
	d, ok := snoozeDelay(err)
	if !ok {
		t.Fatalf("third job: got %v, want a snooze", err)
	}
	if d < 300*time.Millisecond || d > 500*time.Millisecond {
		t.Errorf("snooze %v, want 400ms ± 25%%", d)
	}
	if len(b.started) != 0 {
		t.Fatal("the handler ran a job over the limit")
	}
	// Another type is not limited (no Default).
	go func() { errs <- h.Process(ctx, concJob("b", "b1")) }()
	<-b.started
	close(b.release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The slots were given back.
	if err := h.Process(ctx, concJob("a", "4")); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestConcurrency_neverExceedsLimit(t *testing.T) {
	t.Parallel()
	var running, maxSeen, ran, snoozed atomic.Int64
	inner := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		n := running.Add(1)
		for {
			m := maxSeen.Load()
			if n <= m || maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(time.Millisecond) // hold the slot a while
		running.Add(-1)
		ran.Add(1)
		return nil
	})
	h := middleware.Concurrency(middleware.ConcurrencyConfig{Default: 3, Wait: 5 * time.Millisecond})(inner)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			for j := range 20 {
				err := h.Process(context.Background(), concJob("x", fmt.Sprint(i, j)))
				if _, ok := snoozeDelay(err); ok {
					snoozed.Add(1)
				} else if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if m := maxSeen.Load(); m != 3 {
		t.Errorf("at most %d jobs ran at once, want exactly the limit 3", m)
	}
	if ran.Load()+snoozed.Load() != 400 || ran.Load() == 0 {
		t.Errorf("ran %d, snoozed %d, want 400 in all", ran.Load(), snoozed.Load())
	}
}

func TestConcurrency_wait(t *testing.T) {
	t.Parallel()
	t.Run("SlotFreesInTime", func(t *testing.T) {
		t.Parallel()
		b := newConcBlocker()
		h := middleware.Concurrency(middleware.ConcurrencyConfig{Limits: map[string]int{"a": 1}, Wait: 10 * time.Second})(b)
		first := make(chan error, 1)
		go func() { first <- h.Process(context.Background(), concJob("a", "1")) }()
		<-b.started
		second := make(chan error, 1)
		go func() { second <- h.Process(context.Background(), concJob("a", "2")) }()
		select {
		case id := <-b.started:
			t.Fatalf("job %s started while the only slot was held", id)
		case <-time.After(50 * time.Millisecond):
		}
		b.release <- struct{}{} // the first job returns; the second takes its slot
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if id := <-b.started; id != "2" {
			t.Fatalf("started %s", id)
		}
		b.release <- struct{}{}
		if err := <-second; err != nil {
			t.Fatalf("second job: %v, want it run after waiting", err)
		}
	})
	t.Run("WaitRunsOut", func(t *testing.T) {
		t.Parallel()
		b := newConcBlocker()
		h := middleware.Concurrency(middleware.ConcurrencyConfig{Default: 1, Wait: 30 * time.Millisecond})(b)
		go func() { _ = h.Process(context.Background(), concJob("a", "1")) }()
		<-b.started
		defer close(b.release)
		start := time.Now()
		err := concProcess(t, h, context.Background(), concJob("a", "2"))
		if _, ok := snoozeDelay(err); !ok {
			t.Fatalf("got %v, want a snooze", err)
		}
		if waited := time.Since(start); waited < 30*time.Millisecond {
			t.Errorf("snoozed after %v, want after waiting 30ms", waited)
		}
	})
	t.Run("ContextEnds", func(t *testing.T) {
		t.Parallel()
		b := newConcBlocker()
		h := middleware.Concurrency(middleware.ConcurrencyConfig{Default: 1, Wait: time.Minute})(b)
		go func() { _ = h.Process(context.Background(), concJob("a", "1")) }()
		<-b.started
		defer close(b.release)
		cause := errors.New("stop")
		ctx, cancel := context.WithCancelCause(context.Background())
		time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
		if err := concProcess(t, h, ctx, concJob("a", "2")); !errors.Is(err, cause) {
			t.Fatalf("got %v, want the context's cause", err)
		}
	})
}

func TestConcurrency_limits(t *testing.T) {
	t.Parallel()
	b := newConcBlocker()
	defer close(b.release)
	h := middleware.Concurrency(middleware.ConcurrencyConfig{
		Default: 1,
		Limits:  map[string]int{"free": 0, "two": 2},
	})(b)
	for _, tc := range []struct {
		typ  string
		runs int // jobs that start before the next is snoozed; -1 unlimited
	}{{"other", 1}, {"two", 2}, {"free", -1}} {
		n := tc.runs
		if n < 0 {
			n = 10
		}
		for i := range n {
			go func() { _ = h.Process(context.Background(), concJob(tc.typ, fmt.Sprint(i))) }()
			<-b.started
		}
		res := make(chan error, 1)
		go func() { res <- h.Process(context.Background(), concJob(tc.typ, "over")) }()
		select {
		case err := <-res:
			if _, snoozed := snoozeDelay(err); !snoozed || tc.runs < 0 {
				t.Errorf("type %q after %d running: got %v", tc.typ, n, err)
			}
		case <-b.started:
			if tc.runs >= 0 {
				t.Errorf("type %q: job %d started over the limit %d", tc.typ, n+1, tc.runs)
			}
		}
	}
}

// Two jobs of type "report" may run at once in this process; a third is
// snoozed without counting an attempt.
func ExampleConcurrency() {
	release := make(chan struct{})
	started := make(chan struct{})
	report := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		started <- struct{}{}
		<-release
		return nil
	})
	h := middleware.Concurrency(middleware.ConcurrencyConfig{
		Limits:    map[string]int{"report": 2},
		SnoozeFor: 5 * time.Second,
	})(report)

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _ = h.Process(context.Background(), &stream.Job{Type: "report"}) })
		<-started
	}
	err := h.Process(context.Background(), &stream.Job{Type: "report"})
	var o *consumer.Outcome
	if errors.As(err, &o) {
		fmt.Println("third job: snoozed, counts an attempt:", o.CountsAttempt())
	}
	close(release)
	wg.Wait()
	// Output:
	// third job: snoozed, counts an attempt: false
}
