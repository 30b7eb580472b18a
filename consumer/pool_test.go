package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// poolFill enqueues n jobs to stream s, each with payload "<s>/<i>".
func poolFill(t *testing.T, rdb redis.UniversalClient, s string, n int) {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	for i := 0; i < n; i += 500 {
		var jobs []*stream.Job
		for j := i; j < min(n, i+500); j++ {
			jobs = append(jobs, &stream.Job{Type: "t", Payload: fmt.Appendf(nil, "%s/%d", s, j)})
		}
		if _, err := p.EnqueueBatch(context.Background(), jobs); err != nil {
			t.Fatalf("EnqueueBatch: %v", err)
		}
	}
}

// runPool runs p until the test ends (or until the returned stop).
func runPool(t *testing.T, p *consumer.Pool) (stop func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = p.Shutdown(ctx)
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				err = errors.New("Run did not return after Shutdown")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// poolConfig is a queue's fast configuration on stream s.
func poolConfig(s string) consumer.Config {
	return consumer.Config{Stream: s, Group: "g", Consumer: "c1", Block: 50 * time.Millisecond, Logger: discard}
}

// starts records the order in which jobs start.
type starts struct {
	mu   sync.Mutex
	seq  []string // queue name per start
	when []time.Time
}

func (s *starts) add(q string) {
	s.mu.Lock()
	s.seq = append(s.seq, q)
	s.when = append(s.when, time.Now())
	s.mu.Unlock()
}

func (s *starts) since(i int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seq[i:]...)
}

func (s *starts) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seq)
}

// TestPool_strict: with strict priority, once the high queue's jobs wait
// for a slot, every one of them starts before any further job of the low
// queue, although the low queue had jobs waiting first.
func TestPool_strict(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, rdb) + "}"
	low, high := prefix+":low", prefix+":high"
	poolFill(t, rdb, low, 20)
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2, Strict: true})
	var st starts
	gate := make(chan struct{})
	lq := p.Add(poolConfig(low), consumer.QueueOptions{Priority: 0}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		st.add("low")
		<-gate
		return nil
	}))
	// Its Prefetch holds every job it reads: strict priority decides among
	// the jobs read, and a queue whose reads fall behind its jobs leaves
	// gaps that lower queues fill.
	hcfg := poolConfig(high)
	hcfg.Prefetch = 40
	hq := p.Add(hcfg, consumer.QueueOptions{Priority: 10}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		st.add("high")
		time.Sleep(time.Millisecond)
		return nil
	}))
	stop := runPool(t, p)
	waitFor(t, 10*time.Second, "two low jobs running", func() bool { return st.len() == 2 })
	poolFill(t, rdb, high, 30)
	// The high queue's two workers wait for a slot (its prefetch holds
	// more); then the low jobs finish.
	waitFor(t, 10*time.Second, "high jobs read and waiting", func() bool {
		n, _ := rdb.XPending(context.Background(), high, "g").Result()
		return p.Health().Queues[1].Waiting == 2 && n != nil && n.Count == 30
	})
	mark := st.len()
	close(gate)
	waitFor(t, 20*time.Second, "every high job done", func() bool { return hq.Stats().Acked == 30 })
	got := st.since(mark)
	for i, q := range got[:30] {
		if q != "high" {
			t.Fatalf("start %d after the low jobs finished was a low job, before every high job had started: %v", i, got)
		}
	}
	waitFor(t, 20*time.Second, "every low job done", func() bool { return lq.Stats().Acked == 20 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPool_floodDelay: a queue flooded with long jobs delays a job of an
// idle queue by at most the time until one of the running jobs ends (one
// job's run time), in strict mode (the idle queue higher) and in weighted
// mode (equal weights: a queue that starts waiting again goes first).
func TestPool_floodDelay(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			t.Parallel()
			redistest.Widen(t, "run", 200*time.Millisecond, func(t *testing.T, run time.Duration) time.Duration {
				rdb := redistest.Shared(t)
				prefix := "{" + redistest.Prefix(t, rdb) + "}"
				flood, idle := prefix+":flood", prefix+":idle"
				poolFill(t, rdb, flood, 400)
				p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Strict: strict})
				var lowRunning atomic.Int32
				p.Add(poolConfig(flood), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
					lowRunning.Add(1)
					defer lowRunning.Add(-1)
					select {
					case <-time.After(run):
					case <-ctx.Done():
					}
					return ctx.Err()
				}))
				started := make(chan time.Time, 1)
				p.Add(poolConfig(idle), consumer.QueueOptions{Priority: 1}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
					started <- time.Now()
					return nil
				}))
				stop := runPool(t, p)
				defer func() { _ = stop() }()
				waitFor(t, 10*time.Second, "the flood running", func() bool { return lowRunning.Load() == 4 })
				watch := redistest.WatchStalls(rdb, 20*time.Millisecond)
				defer watch.Stop()
				var worst time.Duration
				for range 3 {
					at := time.Now()
					poolFill(t, rdb, idle, 1)
					delay := recv(t, started, 10*time.Second, "the idle queue's job to start").Sub(at)
					stalled := watch.Within(at, at.Add(delay))
					t.Logf("started after %v (flood jobs run %v; stalls %v)", delay, run, stalled)
					if delay > run+50*time.Millisecond+stalled {
						if stalled > 0 {
							return 2 * run // the machine stalled: a longer run makes the margin relatively smaller
						}
						t.Fatalf("a job of an idle queue started %v after it was enqueued, while the flood's jobs run %v", delay, run)
					}
					worst = max(worst, delay)
				}
				t.Logf("worst delay %v", worst)
				return 0
			})
		})
	}
}

// TestPool_minReserved: a queue's Min slots stay free for it while a
// higher-priority queue floods the pool: the flood runs on the other slots
// only, and the reserved queue's job starts at once.
func TestPool_minReserved(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, rdb) + "}"
	flood, reserved := prefix+":flood", prefix+":reserved"
	poolFill(t, rdb, flood, 20)
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Strict: true})
	gate := make(chan struct{})
	var running, peak atomic.Int32
	fq := p.Add(poolConfig(flood), consumer.QueueOptions{Priority: 10}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			if p := peak.Load(); n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-gate
		return nil
	}))
	ran := make(chan struct{}, 1)
	p.Add(poolConfig(reserved), consumer.QueueOptions{Min: 1}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran <- struct{}{}
		return nil
	}))
	stop := runPool(t, p)
	waitFor(t, 10*time.Second, "the flood on 3 slots, more of it waiting", func() bool {
		h := p.Health()
		return running.Load() >= 3 && h.Queues[0].Waiting > 0
	})
	poolFill(t, rdb, reserved, 1)
	recv(t, ran, 10*time.Second, "the reserved queue's job to start while the flood holds the other slots")
	if n := peak.Load(); n != 3 {
		t.Errorf("the flood ran %d jobs at once, want 3 (one of 4 slots reserved)", n)
	}
	close(gate)
	waitFor(t, 20*time.Second, "the flood done", func() bool { return fq.Stats().Acked == 20 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPool_Shutdown: shutdown gives back, at once, the jobs read but not
// started of every queue, and those whose handlers it cancelled; another
// pool then runs every job, each to completion exactly once.
func TestPool_Shutdown(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, rdb) + "}"
	const perQueue = 40
	names := []string{prefix + ":a", prefix + ":b", prefix + ":c"}
	for _, s := range names {
		poolFill(t, rdb, s, perQueue)
	}
	vis := 5 * time.Second
	build := func(name string, handler consumer.HandlerFunc) (*consumer.Pool, []*consumer.Queue) {
		p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 3})
		var qs []*consumer.Queue
		for _, s := range names {
			cfg := poolConfig(s)
			cfg.Consumer, cfg.VisibilityTimeout = name, vis
			qs = append(qs, p.Add(cfg, consumer.QueueOptions{Weight: 1}).Handle(handler))
		}
		return p, qs
	}
	var first atomic.Int32
	p1, _ := build("c1", func(ctx context.Context, job *stream.Job) error {
		first.Add(1)
		<-ctx.Done()
		return ctx.Err()
	})
	stop := runPool(t, p1)
	waitFor(t, 10*time.Second, "3 jobs running and every queue holding more", func() bool {
		if first.Load() < 3 {
			return false
		}
		for _, s := range names {
			if n, _ := rdb.XPending(context.Background(), s, "g").Result(); n == nil || n.Count < 2 {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_ = p1.Shutdown(ctx)
	cancel()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, s := range names {
		pend, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: s, Group: "g", Start: "-", End: "+", Count: 1000}).Result()
		if err != nil {
			t.Fatalf("XPENDING: %v", err)
		}
		if len(pend) == 0 {
			t.Errorf("stream %s: nothing pending after shutdown; its queued jobs were read and are expected given back", s)
		}
		for _, e := range pend {
			if e.Idle < vis-time.Second {
				t.Errorf("stream %s: entry %s pending idle %v after shutdown, not given back (idle >= %v)", s, e.ID, e.Idle, vis)
			}
		}
	}
	var mu sync.Mutex
	done := map[string]int{}
	p2, qs := build("c2", func(ctx context.Context, job *stream.Job) error {
		mu.Lock()
		done[string(job.Payload)]++
		mu.Unlock()
		return nil
	})
	stop2 := runPool(t, p2)
	waitFor(t, 20*time.Second, "every job done", func() bool {
		var n uint64
		for _, q := range qs {
			n += q.Stats().Acked
		}
		return n == 3*perQueue
	})
	if err := stop2(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, q := range qs {
		// The given-back jobs came to the second pool by its sweep (a
		// reclaim, run as a suspect), in a slot of its budget.
		if st := q.Stats(); st.Reclaimed == 0 {
			t.Errorf("stream %s: the second pool reclaimed nothing: %+v", q.Stream(), st)
		}
	}
	if len(done) != 3*perQueue {
		t.Errorf("%d distinct jobs done, want %d", len(done), 3*perQueue)
	}
	for k, n := range done {
		if n != 1 {
			t.Errorf("job %s done %d times", k, n)
		}
	}
}

// TestPool_Validate: every bad pool option is refused by Run, naming the
// field and the queue, before Redis is touched.
func TestPool_Validate(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	// StartTimeout -1: a configuration wrongly accepted fails at once on the
	// unreachable address instead of waiting for it.
	q := func(s string) consumer.Config { return consumer.Config{Stream: s, Group: "g", StartTimeout: -1} }
	for _, tc := range []struct {
		name string
		cfg  consumer.PoolConfig
		add  func(p *consumer.Pool)
		want string
	}{
		{"no queue", consumer.PoolConfig{}, func(p *consumer.Pool) {}, "no queue"},
		{"negative concurrency", consumer.PoolConfig{Concurrency: -1}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{}).Handle(h) }, "PoolConfig.Concurrency (-1)"},
		{"queue concurrency", consumer.PoolConfig{}, func(p *consumer.Pool) {
			p.Add(consumer.Config{Stream: "a", Group: "g", Concurrency: 3}, consumer.QueueOptions{}).Handle(h)
		}, `queue 1 (stream "a"): Config.Concurrency (3) must be 0`},
		{"bad queue config", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(consumer.Config{Stream: "a"}, consumer.QueueOptions{}).Handle(h) }, `queue 1 (stream "a"): Config.Group is required`},
		{"negative weight", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Weight: -2}).Handle(h) }, "QueueOptions.Weight (-2)"},
		{"huge weight", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Weight: 2_000_000}).Handle(h) }, "QueueOptions.Weight (2000000) must be at most"},
		{"min over max", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Min: 3, Max: 2}).Handle(h) }, "QueueOptions.Min (3) must not exceed QueueOptions.Max (2)"},
		{"max over concurrency", consumer.PoolConfig{Concurrency: 4}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Max: 5}).Handle(h) }, "QueueOptions.Max (5) must not exceed PoolConfig.Concurrency (4)"},
		{"mins over concurrency", consumer.PoolConfig{Concurrency: 4}, func(p *consumer.Pool) {
			p.Add(q("a"), consumer.QueueOptions{Min: 3}).Handle(h)
			p.Add(q("b"), consumer.QueueOptions{Min: 2}).Handle(h)
		}, "QueueOptions.Min add up to 5, more than PoolConfig.Concurrency (4)"},
		{"duplicate", consumer.PoolConfig{}, func(p *consumer.Pool) {
			p.Add(q("a"), consumer.QueueOptions{}).Handle(h)
			p.Add(q("a"), consumer.QueueOptions{}).Handle(h)
		}, `queue 2 (stream "a"): stream and group ("g") already in queue 1`},
		{"no handler", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{}) }, `queue 1 (stream "a"): no handler`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
			defer rdb.Close()
			rdb.AddHook(countHook{&calls})
			p := consumer.NewPool(rdb, tc.cfg)
			tc.add(p)
			err := p.Run(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error containing %q", err, tc.want)
			}
			if verr := p.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Errorf("Validate: %v, want Run's error", verr)
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("%d Redis commands sent", n)
			}
		})
	}
	t.Run("small client pool", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 5})
		defer rdb.Close()
		p := consumer.NewPool(rdb, consumer.PoolConfig{})
		// Three consumer names: three read groups.
		for _, s := range []string{"a", "b", "c"} {
			cfg := q(s)
			cfg.Consumer = "c-" + s
			p.Add(cfg, consumer.QueueOptions{}).Handle(h)
		}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "PoolSize (5) must be at least twice the number of read groups (3)") {
			t.Fatalf("Validate: %v", err)
		}
	})
	t.Run("one read group", func(t *testing.T) {
		// The same group and consumer name: one read for all three.
		for _, size := range []int{1, 2} {
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: size})
			p := consumer.NewPool(rdb, consumer.PoolConfig{})
			for _, s := range []string{"a", "b", "c"} {
				p.Add(q(s), consumer.QueueOptions{}).Handle(h)
			}
			err := p.Validate()
			rdb.Close()
			if size == 1 && (err == nil || !strings.Contains(err.Error(), "PoolSize (1) must be at least twice the number of read groups (1)")) {
				t.Errorf("PoolSize 1: Validate: %v", err)
			}
			if size == 2 && err != nil {
				t.Errorf("PoolSize 2: Validate: %v, want nil", err)
			}
		}
	})
}

// countHook counts the commands a client sends.
type countHook struct{ n *atomic.Int32 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int32(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestPool_ReadyHandler: the pool is ready when every queue is, and not
// before Run or after it.
func TestPool_ReadyHandler(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, rdb) + "}"
	p := consumer.NewPool(rdb, consumer.PoolConfig{})
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	p.Add(poolConfig(prefix+":a"), consumer.QueueOptions{}).Handle(h)
	p.Add(poolConfig(prefix+":b"), consumer.QueueOptions{}).Handle(h)
	status := func() (int, consumer.PoolHealth) {
		rec := httptest.NewRecorder()
		p.ReadyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ready", nil))
		return rec.Code, p.Health()
	}
	if code, h := status(); code != http.StatusServiceUnavailable || h.Ready {
		t.Fatalf("before Run: status %d, health %+v", code, h)
	}
	stop := runPool(t, p)
	waitFor(t, 10*time.Second, "the pool ready", func() bool { code, _ := status(); return code == http.StatusOK })
	_, h2 := status()
	if len(h2.Queues) != 2 || !h2.Queues[0].Ready || !h2.Queues[1].Ready || !h2.Live {
		t.Fatalf("ready pool's health: %+v", h2)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if code, h := status(); code != http.StatusServiceUnavailable || h.Live || !strings.Contains(h.Problem, "Run has returned") {
		t.Fatalf("after Run: status %d, health %+v", code, h)
	}
}

// TestPool_cluster: a pool over streams on the three masters of a cluster
// runs every job of each.
func TestPool_cluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	// One stream per master (slots 0-5460, 5461-10922, 10923-16383).
	names := make([]string, 3)
	for i := 0; names[0] == "" || names[1] == "" || names[2] == ""; i++ {
		s := fmt.Sprintf("{pool%d}:jobs", i)
		slot := keyslot.Of(s)
		for m, r := range [][2]int{{0, 5400}, {5500, 10900}, {11000, 16383}} {
			if r[0] <= slot && slot <= r[1] && names[m] == "" {
				names[m] = s
			}
		}
	}
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 6})
	var mu sync.Mutex
	done := map[string]int{}
	var qs []*consumer.Queue
	for _, s := range names {
		poolFill(t, rdb, s, 100)
		qs = append(qs, p.Add(poolConfig(s), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			mu.Lock()
			done[string(job.Payload)]++
			mu.Unlock()
			return nil
		})))
	}
	stop := runPool(t, p)
	waitFor(t, 30*time.Second, "every job done", func() bool {
		var n uint64
		for _, q := range qs {
			n += q.Stats().Acked
		}
		return n == 300
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(done) != 300 {
		t.Errorf("%d distinct jobs done, want 300", len(done))
	}
	for k, n := range done {
		if n != 1 {
			t.Errorf("job %s done %d times", k, n)
		}
	}
}
