package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// a11Poll waits for cond with a deadline (no fixed sleeps).
func a11Poll(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond) // poll step, not a wait for an outcome
	}
}

type a11Starts struct {
	mu sync.Mutex
	by map[string][]string // job type -> consumers that started it
}

func (s *a11Starts) add(typ, who string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string][]string{}
	}
	s.by[typ] = append(s.by[typ], who)
}

func (s *a11Starts) get(typ string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.by[typ]...)
}

// Promise (Config.Prefetch): "An entry held is pending under this consumer like
// a running job: ... it is not started (it is left for another consumer to take
// over) once its lease has ended". With the heartbeat disabled, a worker blocked
// by a handler that ignores its cancelled context for 2x the visibility timeout
// comes free only after every queued entry's lease has ended: it must start none
// of them; consumer B takes them over and runs each exactly once.
func TestAttack11_PrefetchQueuedNotStartedPastLease(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	const vis = 1500 * time.Millisecond
	const queued = 4

	var starts a11Starts
	release := make(chan struct{})
	var blockerRuns atomic.Int32
	handler := func(who string) consumer.HandlerFunc {
		return func(hctx context.Context, job *stream.Job) error {
			starts.add(job.Type, who)
			if job.Type == "blocker" && blockerRuns.Add(1) == 1 {
				<-release // ignores hctx on purpose
			}
			return nil
		}
	}
	cfg := func(who string) consumer.Config {
		return consumer.Config{
			Stream: name, Group: "g", Consumer: who,
			Concurrency: 1, Prefetch: queued,
			VisibilityTimeout: vis, HeartbeatInterval: -1,
			SweepInterval: 100 * time.Millisecond, Block: 100 * time.Millisecond,
			IdleConsumerTimeout: -1,
		}
	}
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	j, _ := stream.NewJSONJob("blocker", map[string]int{"n": 0})
	if _, err := p.Enqueue(ctx, j); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < queued; i++ {
		j, _ := stream.NewJSONJob(fmt.Sprintf("q%d", i), map[string]int{"n": i})
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}

	a := consumer.New(rdb, cfg("A")).Handle(handler("A"))
	runA := make(chan error, 1)
	go func() { runA <- a.Run(context.Background()) }()
	// A holds all five: the blocker runs, four are queued.
	a11Poll(t, 30*time.Second, "A to hold 5 pending with the blocker running", func() bool {
		x, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: name, Group: "g", Start: "-", End: "+", Count: 10, Consumer: "A"}).Result()
		return err == nil && len(x) == queued+1 && len(starts.get("blocker")) == 1
	})
	readAt := time.Now() // the leases of the queued entries began before this
	b := consumer.New(rdb, cfg("B")).Handle(handler("B"))
	runB := make(chan error, 1)
	go func() { runB <- b.Run(context.Background()) }()

	// Wait until every queued entry was taken over by B and run there.
	a11Poll(t, 60*time.Second, "B to run the queued entries", func() bool {
		for i := 0; i < queued; i++ {
			if len(starts.get(fmt.Sprintf("q%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	// Hold the blocker at least 2x vis past the read, so A's worker is
	// free only after every queued lease has ended.
	a11Poll(t, 60*time.Second, "2x visibility since the read", func() bool { return time.Since(readAt) > 2*vis })
	close(release)
	a11Poll(t, 60*time.Second, "everything settled", func() bool {
		n, err := rdb.XPending(ctx, name, "g").Result()
		return err == nil && n.Count == 0 && len(starts.get("blocker")) >= 2
	})
	// Give A every chance to (wrongly) start a queued job: wait until A is
	// idle after the blocker returned.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := a.WaitIdle(wctx); err != nil {
		t.Fatalf("A WaitIdle: %v", err)
	}
	for i := 0; i < queued; i++ {
		typ := fmt.Sprintf("q%d", i)
		if got := starts.get(typ); len(got) != 1 || got[0] != "B" {
			t.Errorf("%s started by %v, want exactly once by B (A's lease had ended)", typ, got)
		}
	}
	for _, c := range []*consumer.Consumer{a, b} {
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		if err := c.Shutdown(sctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("shutdown: %v", err)
		}
		scancel()
	}
	<-runA
	<-runB
	if st := a.Stats(); st.Acked != 0 {
		t.Errorf("A acked %d jobs; its leases had all ended (stats %+v)", st.Acked, st)
	}
}

// Promise (Config.Prefetch): "shutdown gives it back without running it". A
// consumer with one worker busy and Prefetch queued entries is shut down: none
// of the queued entries may start on it, and all of them are run exactly once by
// the next consumer, with nothing lost.
func TestAttack11_PrefetchShutdownGivesBack(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	const queued = 6
	var starts a11Starts
	var acks a11Starts
	handler := func(who string) consumer.HandlerFunc {
		return func(hctx context.Context, job *stream.Job) error {
			starts.add(job.Type, who)
			if job.Type == "blocker" && who == "A" {
				<-hctx.Done() // until shutdown cancels it
				return context.Cause(hctx)
			}
			acks.add(job.Type, who)
			return nil
		}
	}
	cfg := func(who string) consumer.Config {
		return consumer.Config{
			Stream: name, Group: "g", Consumer: who,
			Concurrency: 1, Prefetch: queued,
			VisibilityTimeout: 3 * time.Second,
			SweepInterval:     100 * time.Millisecond, Block: 100 * time.Millisecond,
			IdleConsumerTimeout: -1, ShutdownTimeout: 200 * time.Millisecond,
		}
	}
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	for i := -1; i < queued; i++ {
		typ := fmt.Sprintf("q%d", i)
		if i < 0 {
			typ = "blocker"
		}
		j, _ := stream.NewJSONJob(typ, map[string]int{"n": i})
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	a := consumer.New(rdb, cfg("A")).Handle(handler("A"))
	runA := make(chan error, 1)
	go func() { runA <- a.Run(context.Background()) }()
	a11Poll(t, 30*time.Second, "A holding all entries", func() bool {
		x, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: name, Group: "g", Start: "-", End: "+", Count: 20, Consumer: "A"}).Result()
		return err == nil && len(x) == queued+1 && len(starts.get("blocker")) == 1
	})
	// Shutdown takes its drain deadline from its context: a short one, so
	// the blocker is cancelled with ErrShutdown.
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_ = a.Shutdown(sctx)
	cancel()
	<-runA
	for i := 0; i < queued; i++ {
		if got := starts.get(fmt.Sprintf("q%d", i)); len(got) != 0 {
			t.Errorf("q%d started on A during shutdown: %v", i, got)
		}
	}
	b := consumer.New(rdb, cfg("B")).Handle(handler("B"))
	runB := make(chan error, 1)
	go func() { runB <- b.Run(context.Background()) }()
	a11Poll(t, 60*time.Second, "B to finish everything", func() bool {
		n, err := rdb.XPending(ctx, name, "g").Result()
		if err != nil || n.Count != 0 {
			return false
		}
		for i := 0; i < queued; i++ {
			if len(acks.get(fmt.Sprintf("q%d", i))) == 0 {
				return false
			}
		}
		return len(acks.get("blocker")) == 1
	})
	for i := 0; i < queued; i++ {
		if got := starts.get(fmt.Sprintf("q%d", i)); len(got) != 1 {
			t.Errorf("q%d started %v, want once", i, got)
		}
	}
	sctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	_ = b.Shutdown(sctx)
	cancel()
	<-runB
}
