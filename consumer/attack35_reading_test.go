package consumer_test

// Attack 35 (Reading): an outside tester's tests, written from README.md and
// the consumer godoc only. Promise attacked: Consumer.Reading is closed once
// Run's first read was answered, and that read does not block, so on an empty
// stream (or a backlog, a restart with own pending jobs, a paused queue)
// Reading does not wait for Config.Block; a job enqueued after Reading is
// closed runs, exactly once. Block is minutes here, so that a Reading (or a
// job) that waited for it fails the generous bounds below.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/pelicantest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

const (
	// a35Block is the Block of every consumer on the real Redis: far longer
	// than any bound the tests allow for Reading or for a job to run.
	a35Block = 5 * time.Minute
	// a35Bound is the generous bound for what must not wait for Block.
	a35Bound = 60 * time.Second
)

// a35Queue returns the shared Redis and a stream of the test's own, whose
// keys (stream and derived keys) are deleted when the test ends.
func a35Queue(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := redistest.Shared(t)
	base := redistest.Name(t)
	if base == "" || strings.ContainsAny(base, "{}*?[") {
		t.Fatalf("unexpected name %q", base)
	}
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+base+"}:*") })
	return rdb, "{" + base + "}:jobs"
}

// a35Config is a consumer configuration with a Block of minutes and leases
// and sweeps long enough not to interfere.
func a35Config(name string) consumer.Config {
	return consumer.Config{
		Stream:            name,
		Group:             "g",
		Block:             a35Block,
		VisibilityTimeout: 30 * time.Minute,
		SweepInterval:     10 * time.Minute,
		Logger:            discard,
	}
}

// a35Counter counts the runs of each job ID.
type a35Counter struct {
	mu   sync.Mutex
	runs map[string]int
}

func newA35Counter() *a35Counter { return &a35Counter{runs: map[string]int{}} }

func (c *a35Counter) handler() consumer.Handler {
	return consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
		c.mu.Lock()
		c.runs[j.ID]++
		c.mu.Unlock()
		return nil
	})
}

func (c *a35Counter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.runs))
	for k, v := range c.runs {
		m[k] = v
	}
	return m
}

// waitAll waits until every job of ids has run; it fails after within.
func (c *a35Counter) waitAll(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	poll.Until(t, within, func() (bool, string) {
		m := c.snapshot()
		missing := 0
		for _, id := range ids {
			if m[id] == 0 {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d jobs had not run (Block %v)", missing, len(ids), a35Block)
	})
}

// allRunOnce waits until every job of ids has run (within), stops the
// consumer and checks that each ran exactly once.
func (c *a35Counter) allRunOnce(t *testing.T, ids []string, within time.Duration, stop func()) {
	t.Helper()
	c.waitAll(t, ids, within)
	stop()
	c.checkOnce(t, ids)
}

// checkOnce checks, once the consumers have stopped (nothing can run any
// more), that each job of ids ran exactly once and that no other job ran.
func (c *a35Counter) checkOnce(t *testing.T, ids []string) {
	t.Helper()
	m := c.snapshot()
	for _, id := range ids {
		if m[id] != 1 {
			t.Errorf("job %s ran %d times, want exactly once", id, m[id])
		}
	}
	if len(m) != len(ids) {
		t.Errorf("%d distinct jobs ran, want %d", len(m), len(ids))
	}
}

// a35Enqueue enqueues n jobs of type typ one by one and returns their IDs.
func a35Enqueue(t *testing.T, rdb redis.UniversalClient, name string, n int) []string {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	ids := make([]string, 0, n)
	for i := 0; i < n; i++ {
		j, err := stream.NewJSONJob("a35", map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Enqueue(context.Background(), j); err != nil {
			t.Fatalf("Enqueue: %v", err)
		}
		ids = append(ids, j.ID)
	}
	return ids
}

// a35EnqueueNoFatal is a35Enqueue for other goroutines: a job that could not
// be enqueued is left out (and then missed by the count of 50).
func a35EnqueueNoFatal(rdb redis.UniversalClient, name string, n int) []string {
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	var ids []string
	for i := 0; i < n; i++ {
		j, err := stream.NewJSONJob("a35", map[string]int{"i": i})
		if err != nil {
			continue
		}
		if _, err := p.Enqueue(context.Background(), j); err == nil {
			ids = append(ids, j.ID)
		}
	}
	return ids
}

// a35Run starts c and returns how long Reading took to close (failing if
// it takes longer than a35Bound or Run returns first) and a stop function
// that shuts c down and checks that Run returned nil within a35Bound.
func a35Run(t *testing.T, c *consumer.Consumer) (time.Duration, func()) {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(context.Background()) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), a35Bound)
			defer cancel()
			s := time.Now()
			if err := c.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v (after %v)", err, time.Since(s))
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(a35Bound):
				t.Errorf("Run did not return %v after Shutdown", a35Bound)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-c.Reading():
	case err := <-done:
		t.Fatalf("Run returned before Reading was closed: %v", err)
	case <-time.After(a35Bound):
		t.Fatalf("Reading not closed %v after Run started (Block %v): the first read waited for Block", a35Bound, a35Block)
	}
	return time.Since(start), stop
}

// Promise: on an empty stream Reading does not wait for Config.Block; once it
// is closed the consumer has read (Health's LastRead set, Ready), and jobs
// enqueued after it (one alone, then from several goroutines at once) run
// exactly once without waiting for Block. Run with the default client (typed
// blocking read), a client without ReadTimeout (raw blocking read, README
// "Reading") and one speaking RESP2.
func TestAttack35_ReadingEmptyStreamHugeBlock(t *testing.T) {
	t.Parallel()
	clients := map[string]func(*redis.Options){
		"default":       func(*redis.Options) {},
		"noReadTimeout": func(o *redis.Options) { o.ReadTimeout = -1 },
		"resp2":         func(o *redis.Options) { o.Protocol = 2; o.ReadTimeout = -1 },
	}
	for cname, opt := range clients {
		t.Run(cname, func(t *testing.T) {
			t.Parallel()
			_, name := a35Queue(t)
			o := &redis.Options{Addr: redistest.Addr()}
			opt(o)
			rdb := redis.NewClient(o)
			t.Cleanup(func() { _ = rdb.Close() })
			cnt := newA35Counter()
			cfg := a35Config(name)
			cfg.Concurrency = 4
			c := consumer.New(rdb, cfg).Handle(cnt.handler())
			took, stop := a35Run(t, c)
			t.Logf("Reading closed after %v", took)
			h := c.Health()
			if h.LastRead.IsZero() {
				t.Errorf("Health().LastRead is zero once Reading is closed: %+v", h)
			}
			if !h.Ready {
				t.Errorf("Health() not Ready once Reading is closed: %+v", h)
			}
			ids := a35Enqueue(t, rdb, name, 1)
			cnt.waitAll(t, ids, a35Bound)
			var mu sync.Mutex
			var wg sync.WaitGroup
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					more := a35EnqueueNoFatal(rdb, name, 12)
					mu.Lock()
					ids = append(ids, more...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			ids = append(ids, a35Enqueue(t, rdb, name, 1)...)
			if len(ids) != 50 {
				t.Fatalf("enqueued %d jobs, want 50", len(ids))
			}
			cnt.allRunOnce(t, ids, a35Bound, stop)
			if st := c.Stats(); st.Acked != 50 {
				t.Errorf("Stats().Acked = %d, want 50", st.Acked)
			}
			pending, err := rdb.XPending(context.Background(), name, "g").Result()
			if err != nil || pending.Count != 0 {
				t.Errorf("XPENDING after shutdown: %+v, %v; want nothing pending", pending, err)
			}
		})
	}
}

// Promise: Reading is closed after the first read is answered, also when the
// stream holds a backlog (that read returns entries) and while every worker
// is still busy with it; the backlog and jobs enqueued after Reading each run
// exactly once.
func TestAttack35_ReadingWithBacklogBusyWorkers(t *testing.T) {
	t.Parallel()
	for _, prefetch := range []int{0, -1} {
		t.Run(fmt.Sprintf("prefetch=%d", prefetch), func(t *testing.T) {
			t.Parallel()
			rdb, name := a35Queue(t)
			backlog := a35Enqueue(t, rdb, name, 300)
			release := make(chan struct{})
			cnt := newA35Counter()
			inner := cnt.handler()
			cfg := a35Config(name)
			cfg.Concurrency = 3
			cfg.Prefetch = prefetch
			c := consumer.New(rdb, cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				return inner.Process(ctx, j)
			}))
			took, stop := a35Run(t, c)
			t.Logf("Reading closed after %v with a backlog of %d and blocked workers", took, len(backlog))
			after := a35Enqueue(t, rdb, name, 30)
			close(release)
			cnt.waitAll(t, append(backlog, after...), 2*a35Bound)
			all := append(append(backlog, after...), a35Enqueue(t, rdb, name, 10)...)
			cnt.allRunOnce(t, all, a35Bound, stop)
		})
	}
}

// Promise: Reading is closed once Run has re-read its own pending jobs and
// its first read of new entries was answered, without waiting for Block; a
// restarted consumer re-runs its own pending jobs at once (README), and new
// jobs enqueued after Reading run exactly once.
func TestAttack35_ReadingAfterRestartWithOwnPending(t *testing.T) {
	t.Parallel()
	rdb, name := a35Queue(t)
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, name, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	own := a35Enqueue(t, rdb, name, 5)
	// A "crashed" process of the same consumer name read them and died.
	if _, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "w1", Streams: []string{name, ">"}, Count: 5}).Result(); err != nil {
		t.Fatal(err)
	}
	unread := a35Enqueue(t, rdb, name, 5)
	cnt := newA35Counter()
	cfg := a35Config(name)
	cfg.Consumer = "w1"
	c := consumer.New(rdb, cfg).Handle(cnt.handler())
	took, stop := a35Run(t, c)
	t.Logf("Reading closed after %v", took)
	after := a35Enqueue(t, rdb, name, 20)
	all := append(append(append([]string{}, own...), unread...), after...)
	cnt.allRunOnce(t, all, a35Bound, stop)
}

// Promise (README "Pausing a queue"): a consumer started while its queue is
// paused is ready (Reading closed) without having read, so Reading does not
// wait for Block; held jobs do not run while paused, and start at once on
// Resume (not after Block), each exactly once.
func TestAttack35_ReadingPausedQueue(t *testing.T) {
	t.Parallel()
	rdb, name := a35Queue(t)
	ctx := context.Background()
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{}); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	before := a35Enqueue(t, rdb, name, 5)
	cnt := newA35Counter()
	c := consumer.New(rdb, a35Config(name)).Handle(cnt.handler())
	took, stop := a35Run(t, c)
	t.Logf("Reading closed after %v on a paused queue", took)
	if h := c.Health(); !h.Paused || !h.Ready {
		t.Errorf("Health() of a consumer started paused: %+v, want Paused and Ready", h)
	}
	after := a35Enqueue(t, rdb, name, 5)
	time.Sleep(1500 * time.Millisecond)
	if m := cnt.snapshot(); len(m) != 0 {
		t.Fatalf("%d jobs ran while the queue was paused: %v", len(m), m)
	}
	if err := control.Resume(ctx, rdb, name, control.ResumeOptions{}); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	all := append(append([]string{}, before...), after...)
	cnt.waitAll(t, all, a35Bound)
	all = append(all, a35Enqueue(t, rdb, name, 10)...)
	cnt.allRunOnce(t, all, a35Bound, stop)
}

// Promise: Shutdown right after Reading (the consumer now blocked in a read of
// minutes, or about to send it) returns nil promptly; a job enqueued just
// before each Shutdown is neither lost nor run twice: it ran, or it is given
// back and re-run by the next consumer of the same name.
func TestAttack35_ShutdownRightAfterReading(t *testing.T) {
	t.Parallel()
	rdb, name := a35Queue(t)
	cnt := newA35Counter()
	var ids []string
	for i := 0; i < 8; i++ {
		cfg := a35Config(name)
		cfg.Consumer = "w"
		c := consumer.New(rdb, cfg).Handle(cnt.handler())
		_, stop := a35Run(t, c)
		if i%2 == 1 {
			ids = append(ids, a35Enqueue(t, rdb, name, 1)...)
		}
		s := time.Now()
		stop()
		t.Logf("round %d: shutdown right after Reading took %v", i, time.Since(s))
	}
	// A last consumer of the same name runs whatever was given back.
	c := consumer.New(rdb, func() consumer.Config { cfg := a35Config(name); cfg.Consumer = "w"; return cfg }()).Handle(cnt.handler())
	_, stop := a35Run(t, c)
	cnt.allRunOnce(t, ids, a35Bound, stop)
}

// Promise: on the embedded Redis too (typed reads), Reading does not wait for
// Block and a job enqueued after it runs without waiting for Block. Block is
// 20 s here because shutdown on the embedded Redis waits for the blocked read.
func TestAttack35_ReadingEmbedded(t *testing.T) {
	t.Parallel()
	r := pelicantest.NewRedis(t)
	if !r.Embedded() {
		t.Skip("PELICAN_TEST_REDIS is set: not the embedded Redis")
	}
	const block = 20 * time.Second
	cnt := newA35Counter()
	cfg := a35Config(r.Name("jobs"))
	cfg.Block = block
	c := consumer.New(r.Client, cfg).Handle(cnt.handler())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(context.Background()) }()
	select {
	case <-c.Reading():
		t.Logf("Reading closed after %v", time.Since(start))
	case err := <-done:
		t.Fatalf("Run returned: %v", err)
	case <-time.After(block / 2):
		t.Errorf("Reading not closed %v after Run started (Block %v)", block/2, block)
	}
	ids := a35Enqueue(t, r.Client, r.Name("jobs"), 3)
	cnt.waitAll(t, ids, block/2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*block)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	cnt.checkOnce(t, ids)
}

// Promise: Reading is never closed when Run returns before reading (an
// invalid configuration).
func TestAttack35_ReadingNotClosedOnInvalidConfig(t *testing.T) {
	t.Parallel()
	rdb, name := a35Queue(t)
	cfg := a35Config(name)
	cfg.VisibilityTimeout = -time.Second
	c := consumer.New(rdb, cfg).Handle(newA35Counter().handler())
	err := c.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "VisibilityTimeout") {
		t.Fatalf("Run with an invalid configuration: %v, want the field named", err)
	}
	select { // Run has returned: nothing can close it later
	case <-c.Reading():
		t.Fatal("Reading closed although Run returned an error before reading")
	default:
	}
}
