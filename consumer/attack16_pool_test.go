package consumer_test

// Outside tests of consumer.Pool (attack16): written from README "Many queues
// in one pool", docs/pool.md and the package's godoc only.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// a16Meter counts handlers running at once, in all and per queue.
type a16Meter struct {
	mu       sync.Mutex
	cur      map[string]int
	max      map[string]int
	all      int
	allMax   int
	done     map[string]int // payload -> completed runs
	seq      []string       // queue per start
	startsAt []time.Time
}

func newA16Meter() *a16Meter {
	return &a16Meter{cur: map[string]int{}, max: map[string]int{}, done: map[string]int{}}
}

func (m *a16Meter) enter(q string) {
	m.mu.Lock()
	m.cur[q]++
	m.max[q] = max(m.max[q], m.cur[q])
	m.all++
	m.allMax = max(m.allMax, m.all)
	m.seq = append(m.seq, q)
	m.startsAt = append(m.startsAt, time.Now())
	m.mu.Unlock()
}

func (m *a16Meter) leave(q, payload string) {
	m.mu.Lock()
	m.cur[q]--
	m.all--
	if payload != "" {
		m.done[payload]++
	}
	m.mu.Unlock()
}

func (m *a16Meter) snapshot() (all, allMax int, cur, mx map[string]int, done int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, mx = map[string]int{}, map[string]int{}
	for k, v := range m.cur {
		cur[k] = v
	}
	for k, v := range m.max {
		mx[k] = v
	}
	return m.all, m.allMax, cur, mx, len(m.done)
}

func (m *a16Meter) starts() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.seq...)
}

// handler returns a handler for queue q that sleeps d() (ignoring nothing)
// and records the run.
func (m *a16Meter) handler(q string, d func() time.Duration) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		m.enter(q)
		defer m.leave(q, string(job.Payload))
		if dd := d(); dd > 0 {
			select {
			case <-time.After(dd):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		return nil
	})
}

func a16Prefix(t *testing.T, rdb redis.UniversalClient) string {
	return "{" + redistest.Prefix(t, rdb) + "}"
}

// TestAttack16Pool_validateEdges: inputs the documented ranges exclude are
// refused by Validate and Run, naming the field and the queue, before any
// Redis command; boundary values are accepted.
func TestAttack16Pool_validateEdges(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	q := func(s string) consumer.Config { return consumer.Config{Stream: s, Group: "g", StartTimeout: -1} }
	for _, tc := range []struct {
		name string
		cfg  consumer.PoolConfig
		add  func(p *consumer.Pool)
		want []string // substrings of the error; nil: accepted by Validate
	}{
		{"negative max", consumer.PoolConfig{Concurrency: 4}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Max: -1}).Handle(h) }, []string{`stream "a"`, "QueueOptions.Max"}},
		{"negative min", consumer.PoolConfig{Concurrency: 4}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Min: -1}).Handle(h) }, []string{`stream "a"`, "QueueOptions.Min"}},
		{"min over default max", consumer.PoolConfig{Concurrency: 4}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Min: 5}).Handle(h) }, []string{`stream "a"`, "QueueOptions.Min"}},
		{"min over default concurrency", consumer.PoolConfig{}, func(p *consumer.Pool) {
			p.Add(q("a"), consumer.QueueOptions{Min: consumer.DefaultConcurrency + 1}).Handle(h)
		}, []string{`stream "a"`, "QueueOptions.Min"}},
		{"weight just over", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Weight: 1_000_001}).Handle(h) }, []string{`stream "a"`, "QueueOptions.Weight"}},
		{"weight min int", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Weight: -1 << 62}).Handle(h) }, []string{`stream "a"`, "QueueOptions.Weight"}},
		{"weight max int", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Weight: 1<<63 - 1}).Handle(h) }, []string{`stream "a"`, "QueueOptions.Weight"}},
		{"second queue named", consumer.PoolConfig{Concurrency: 4}, func(p *consumer.Pool) {
			p.Add(q("a"), consumer.QueueOptions{}).Handle(h)
			p.Add(q("b"), consumer.QueueOptions{Max: 9}).Handle(h)
		}, []string{`queue 2`, `stream "b"`, "QueueOptions.Max"}},
		{"duplicate, other consumer name", consumer.PoolConfig{}, func(p *consumer.Pool) {
			c1, c2 := q("a"), q("a")
			c1.Consumer, c2.Consumer = "x", "y"
			p.Add(c1, consumer.QueueOptions{}).Handle(h)
			p.Add(c2, consumer.QueueOptions{}).Handle(h)
		}, []string{`queue 2`, `stream "a"`, "already"}},
		{"nil handler", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{}).Handle(nil) }, []string{`stream "a"`, "handler"}},
		{"negative queue concurrency", consumer.PoolConfig{}, func(p *consumer.Pool) {
			c := q("a")
			c.Concurrency = -1
			p.Add(c, consumer.QueueOptions{}).Handle(h)
		}, []string{`stream "a"`, "Config.Concurrency"}},
		{"empty stream", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q(""), consumer.QueueOptions{}).Handle(h) }, []string{"queue 1", "Config.Stream"}},
		{"bad queue backoff", consumer.PoolConfig{}, func(p *consumer.Pool) {
			c := q("a")
			c.Backoff.Base = -time.Second
			p.Add(c, consumer.QueueOptions{}).Handle(h)
		}, []string{`stream "a"`, "Backoff"}},
		// Accepted boundaries.
		{"weight max", consumer.PoolConfig{}, func(p *consumer.Pool) { p.Add(q("a"), consumer.QueueOptions{Weight: 1_000_000}).Handle(h) }, nil},
		{"mins equal concurrency", consumer.PoolConfig{Concurrency: 3}, func(p *consumer.Pool) {
			p.Add(q("a"), consumer.QueueOptions{Min: 2}).Handle(h)
			p.Add(q("b"), consumer.QueueOptions{Min: 1, Max: 1}).Handle(h)
		}, nil},
		{"same stream other group", consumer.PoolConfig{}, func(p *consumer.Pool) {
			c := q("a")
			c.Group = "g2"
			p.Add(q("a"), consumer.QueueOptions{}).Handle(h)
			p.Add(c, consumer.QueueOptions{}).Handle(h)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 50})
			defer rdb.Close()
			rdb.AddHook(countHook{&calls})
			p := consumer.NewPool(rdb, tc.cfg)
			tc.add(p)
			verr := p.Validate()
			if tc.want == nil {
				if verr != nil {
					t.Fatalf("Validate: %v, want nil", verr)
				}
				return
			}
			if verr == nil {
				t.Fatalf("Validate accepted it, want an error containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(verr.Error(), w) {
					t.Errorf("Validate: %v, want it to contain %q", verr, w)
				}
			}
			done := make(chan error, 1)
			go func() { done <- p.Run(context.Background()) }()
			select {
			case err := <-done:
				if err == nil || err.Error() != verr.Error() {
					t.Errorf("Run: %v, want Validate's error %v", err, verr)
				}
			case <-time.After(10 * time.Second):
				_ = p.Shutdown(context.Background())
				t.Fatalf("Run did not return on an invalid configuration")
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("%d Redis commands sent", n)
			}
		})
	}
	t.Run("pool size boundary", func(t *testing.T) {
		for _, size := range []int{5, 6} {
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: size})
			p := consumer.NewPool(rdb, consumer.PoolConfig{})
			for _, s := range []string{"a", "b", "c"} {
				cfg := q(s)
				cfg.Consumer = "c-" + s // a read group each
				p.Add(cfg, consumer.QueueOptions{}).Handle(h)
			}
			err := p.Validate()
			rdb.Close()
			if size == 5 && (err == nil || !strings.Contains(err.Error(), "PoolSize")) {
				t.Errorf("PoolSize 5, 3 queues: Validate %v, want PoolSize named", err)
			}
			if size == 6 && err != nil {
				t.Errorf("PoolSize 6, 3 queues: Validate %v, want nil", err)
			}
		}
	})
	t.Run("nil client", func(t *testing.T) {
		p := consumer.NewPool(nil, consumer.PoolConfig{})
		p.Add(q("a"), consumer.QueueOptions{}).Handle(h)
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("Validate/Run panicked with a nil client: %v", r)
				}
			}()
			done := make(chan error, 1)
			go func() {
				defer func() {
					if r := recover(); r != nil {
						done <- fmt.Errorf("panic: %v", r)
					}
				}()
				done <- p.Run(context.Background())
			}()
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Run with a nil client did not return")
			}
		}()
		if err == nil || strings.HasPrefix(err.Error(), "panic") {
			t.Fatalf("Run with a nil client: %v, want an error", err)
		}
	})
}

// a16Seed makes the group of stream s and reads n of its entries as
// consumer name, so that they are pending there (delivered once).
func a16Seed(t *testing.T, rdb redis.UniversalClient, s, name string, n int) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, s, "g", "0").Err(); err != nil {
		t.Fatalf("XGROUP CREATE: %v", err)
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: name, Streams: []string{s, ">"}, Count: int64(n)}).Result()
	if err != nil || len(res) != 1 || len(res[0].Messages) != n {
		t.Fatalf("XREADGROUP as %s: %v %v", name, res, err)
	}
}

// TestAttack16Pool_budgetAndMax: four queues with mixed Min, Max and
// weights, random short jobs, plus jobs the queue's own consumer name held
// before start (re-read at start) and jobs a dead consumer held (taken by the
// sweep): never more handlers run at once than PoolConfig.Concurrency, never
// more of one queue than its Max, and every job completes.
func TestAttack16Pool_budgetAndMax(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	const conc, per = 5, 250
	opts := []consumer.QueueOptions{
		{Weight: 6, Min: 1, Max: 2},
		{Weight: 3},
		{Weight: 1, Min: 2, Max: 3},
		{Weight: 1_000_000, Max: 1},
	}
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: conc})
	for i, o := range opts {
		s := fmt.Sprintf("%s:q%d", pre, i)
		poolFill(t, rdb, s, per)
		switch i {
		case 1:
			a16Seed(t, rdb, s, "c1", 30) // our own pending: re-read at start
		case 2:
			a16Seed(t, rdb, s, "ghost", 30) // a dead consumer's: swept
		}
		cfg := poolConfig(s)
		cfg.VisibilityTimeout = 1500 * time.Millisecond
		cfg.SweepInterval = 100 * time.Millisecond
		cfg.MaxCrashes = 10
		q := fmt.Sprintf("q%d", i)
		p.Add(cfg, o).Handle(m.handler(q, func() time.Duration { return time.Duration(rand.IntN(4000)) * time.Microsecond }))
	}
	stop := runPool(t, p)
	// The pool's own account (QueueHealth.Running) must never show more
	// than the budget or a queue's Max either.
	var healthBad atomic.Value
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-sampling:
				return
			case <-time.After(2 * time.Millisecond):
			}
			h := p.Health()
			sum := 0
			for i, q := range h.Queues {
				sum += q.Running
				if o := opts[i]; o.Max > 0 && q.Running > o.Max {
					healthBad.Store(fmt.Sprintf("queue %d Running %d over Max %d", i, q.Running, o.Max))
				}
			}
			if sum > conc {
				healthBad.Store(fmt.Sprintf("Running adds up to %d over Concurrency %d", sum, conc))
			}
		}
	}()
	waitFor(t, 90*time.Second, "every job done", func() bool {
		_, _, _, _, done := m.snapshot()
		return done == per*len(opts)
	})
	close(sampling)
	<-sampled
	if s, _ := healthBad.Load().(string); s != "" {
		t.Errorf("Health: %s", s)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	_, allMax, _, mx, _ := m.snapshot()
	if allMax > conc {
		t.Errorf("%d handlers ran at once, PoolConfig.Concurrency is %d", allMax, conc)
	}
	for i, o := range opts {
		q := fmt.Sprintf("q%d", i)
		limit := o.Max
		if limit == 0 {
			limit = conc
		}
		if mx[q] > limit {
			t.Errorf("queue %s: %d ran at once, Max %d", q, mx[q], limit)
		}
	}
	t.Logf("max at once: all %d, per queue %v", allMax, mx)
}

// TestAttack16Pool_maxDoesNotBlockOthers: a queue that goes first (strict:
// higher Priority; weighted: a huge Weight) but is at its Max does not wait
// for a budget slot, so it must not keep free slots from the other queue.
func TestAttack16Pool_maxDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			pre := a16Prefix(t, rdb)
			m := newA16Meter()
			p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Strict: strict})
			poolFill(t, rdb, pre+":hi", 40)
			poolFill(t, rdb, pre+":lo", 40)
			p.Add(poolConfig(pre+":hi"), consumer.QueueOptions{Priority: 10, Weight: 1_000_000, Max: 2}).
				Handle(m.handler("hi", func() time.Duration { return 100 * time.Millisecond }))
			p.Add(poolConfig(pre+":lo"), consumer.QueueOptions{Weight: 1}).
				Handle(m.handler("lo", func() time.Duration { return 100 * time.Millisecond }))
			runPool(t, p)
			waitFor(t, 90*time.Second, "2 low-priority jobs at once beside 2 high ones", func() bool {
				_, _, _, mx, _ := m.snapshot()
				return mx["lo"] >= 2
			})
			_, allMax, _, mx, _ := m.snapshot()
			if allMax > 4 || mx["hi"] > 2 {
				t.Errorf("max at once: all %d, per queue %v", allMax, mx)
			}
		})
	}
}

// TestAttack16Pool_minUnderStrictFlood: in strict mode too "a queue's Min
// slots are its own": a low-priority queue with Min 1 starts its job while a
// high-priority queue floods every other slot with long jobs, and the
// high-priority queue never holds the reserved slot.
func TestAttack16Pool_minUnderStrictFlood(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 3, Strict: true})
	poolFill(t, rdb, pre+":hi", 200)
	p.Add(poolConfig(pre+":hi"), consumer.QueueOptions{Priority: 5}).
		Handle(m.handler("hi", func() time.Duration { return 2 * time.Second }))
	lo := p.Add(poolConfig(pre+":lo"), consumer.QueueOptions{Priority: 0, Min: 1}).
		Handle(m.handler("lo", func() time.Duration { return 0 }))
	runPool(t, p)
	waitFor(t, 90*time.Second, "the high queue running 2 jobs", func() bool {
		_, _, cur, _, _ := m.snapshot()
		return cur["hi"] >= 2
	})
	poolFill(t, rdb, pre+":lo", 5)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lo.WaitIdle(ctx); err != nil {
		t.Fatalf("low queue's jobs beside a strict flood: %v", err)
	}
	_, _, _, mx, _ := m.snapshot()
	if mx["hi"] > 2 {
		t.Errorf("the high queue ran %d at once: it took the low queue's reserved slot", mx["hi"])
	}
	if s := lo.Stats(); s.Acked < 5 {
		t.Errorf("low queue acked %d of 5", s.Acked)
	}
}

// TestAttack16Pool_invalidMiddlewareBeforeRedis: a queue's invalid
// middleware (consumer.Invalid): Pool.Validate does not list middleware, but
// Run must refuse it as Consumer.Run does ("returns err before it touches
// Redis"), naming the queue, before any Redis command of any queue ("It
// checks the whole configuration before it touches Redis").
func TestAttack16Pool_invalidMiddlewareBeforeRedis(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	q := func(s string) consumer.Config { return consumer.Config{Stream: s, Group: "g", StartTimeout: -1} }
	var calls atomic.Int32
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 50})
	defer rdb.Close()
	rdb.AddHook(countHook{&calls})
	p := consumer.NewPool(rdb, consumer.PoolConfig{})
	p.Add(q("a"), consumer.QueueOptions{}).Handle(h)
	p.Add(q("b"), consumer.QueueOptions{}).Use(consumer.Invalid(errors.New("mw: Thing.Field is bad"))).Handle(h)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		_ = p.Shutdown(context.Background())
		t.Fatalf("Run did not return on an invalid middleware")
	}
	if err == nil || !strings.Contains(err.Error(), "Thing.Field is bad") || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("Run: %v, want the middleware's error naming stream \"b\"", err)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d Redis commands sent before refusing the configuration", n)
	}

}

// TestAttack16Pool_lifecycle: Shutdown before Run, Run twice (at once and
// after), Add after Run.
func TestAttack16Pool_lifecycle(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	t.Run("shutdown before run", func(t *testing.T) {
		rdb := redistest.Shared(t)
		pre := a16Prefix(t, rdb)
		p := consumer.NewPool(rdb, consumer.PoolConfig{})
		p.Add(poolConfig(pre+":a"), consumer.QueueOptions{}).Handle(h)
		watch := stallWatch(t, rdb)
		t0 := time.Now()
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown before Run: %v", err)
		}
		if d, stalled, over := tookOver(watch, t0, 2*time.Second); over {
			t.Errorf("Shutdown before Run took %v (%v of it stalled)", d, stalled)
		}
		done := make(chan error, 1)
		go func() { done <- p.Run(context.Background()) }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run after Shutdown: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run after an earlier Shutdown did not stop")
		}
	})
	t.Run("run twice", func(t *testing.T) {
		rdb := redistest.Shared(t)
		pre := a16Prefix(t, rdb)
		var n atomic.Int32
		p := consumer.NewPool(rdb, consumer.PoolConfig{})
		q := p.Add(poolConfig(pre+":a"), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
			n.Add(1)
			return nil
		}))
		stop := runPool(t, p)
		waitFor(t, 90*time.Second, "pool ready", func() bool { return p.Health().Ready })
		second := make(chan error, 1)
		go func() { second <- p.Run(context.Background()) }()
		select {
		case err := <-second:
			if err == nil {
				t.Error("a second Run while the first runs returned nil")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a second Run while the first runs did not return")
		}
		poolFill(t, rdb, pre+":a", 10)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := q.WaitIdle(ctx); err != nil {
			t.Fatalf("first Run after a second one was refused: %v", err)
		}
		if n.Load() != 10 {
			t.Errorf("%d runs of 10 jobs", n.Load())
		}
		if err := stop(); err != nil {
			t.Fatalf("first Run: %v", err)
		}
		third := make(chan error, 1)
		go func() { third <- p.Run(context.Background()) }()
		select {
		case err := <-third:
			if err == nil {
				t.Error("Run after Run returned: nil, want an error (a Pool runs once)")
			}
		case <-time.After(10 * time.Second):
			_ = p.Shutdown(context.Background())
			t.Fatal("Run after Run returned ran again")
		}
	})
	t.Run("add after run", func(t *testing.T) {
		rdb := redistest.Shared(t)
		pre := a16Prefix(t, rdb)
		p := consumer.NewPool(rdb, consumer.PoolConfig{})
		p.Add(poolConfig(pre+":a"), consumer.QueueOptions{}).Handle(h)
		runPool(t, p)
		waitFor(t, 90*time.Second, "pool ready", func() bool { return p.Health().Ready })
		var ran atomic.Int32
		late := p.Add(poolConfig(pre+":late"), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
			ran.Add(1)
			return nil
		}))
		poolFill(t, rdb, pre+":late", 3)
		// It must never become ready, and its jobs never run.
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if hh := p.Health(); hh.Ready {
				t.Fatalf("pool Ready with a queue added after Run: %+v", hh)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if ran.Load() != 0 {
			t.Errorf("a queue added after Run ran %d jobs", ran.Load())
		}
		if hh := p.Health(); !strings.Contains(hh.Problem, late.Stream()) {
			t.Errorf("Problem %q does not name the late queue %q", hh.Problem, late.Stream())
		}
	})
}

// TestAttack16Pool_idleNoCredit: with equal weights, a queue idle while the
// other ran hundreds of jobs comes back without credit: it goes first at
// once, then shares about half the starts, not all of them.
func TestAttack16Pool_idleNoCredit(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 1})
	cfgA, cfgB := poolConfig(pre+":a"), poolConfig(pre+":b")
	cfgA.Prefetch, cfgB.Prefetch = 200, 200
	poolFill(t, rdb, pre+":a", 2000)
	job := func() time.Duration { return 3 * time.Millisecond }
	p.Add(cfgA, consumer.QueueOptions{Weight: 1}).Handle(m.handler("a", job))
	p.Add(cfgB, consumer.QueueOptions{Weight: 1}).Handle(m.handler("b", job))
	runPool(t, p)
	waitFor(t, 90*time.Second, "a's first 200 starts", func() bool { return len(m.starts()) >= 200 })
	t0 := time.Now()
	poolFill(t, rdb, pre+":b", 500)
	waitFor(t, 90*time.Second, "b's first start", func() bool {
		for _, q := range m.starts() {
			if q == "b" {
				return true
			}
		}
		return false
	})
	first := time.Since(t0)
	var at int
	seq := m.starts()
	for i, q := range seq {
		if q == "b" {
			at = i
			break
		}
	}
	waitFor(t, 90*time.Second, "100 starts after b's first", func() bool { return len(m.starts()) >= at+100 })
	win := m.starts()[at : at+100]
	nb := 0
	for _, q := range win {
		if q == "b" {
			nb++
		}
	}
	t.Logf("b first started %v after its enqueue; b had %d of the 100 starts from then", first, nb)
	if nb > 70 || nb < 30 {
		t.Errorf("equal weights: b had %d of 100 starts after coming back from idle (credit from its idle time?); starts: %s", nb, strings.Join(win, ""))
	}
}

// TestAttack16Pool_ratioOneSlot: weights 3/1 with a single slot: every
// start is a decision, and the ratio is within 10%.
func TestAttack16Pool_ratioOneSlot(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 1})
	cfgA, cfgB := poolConfig(pre+":a"), poolConfig(pre+":b")
	cfgA.Prefetch, cfgB.Prefetch = 300, 300
	poolFill(t, rdb, pre+":a", 1500)
	poolFill(t, rdb, pre+":b", 1500)
	job := func() time.Duration { return 2 * time.Millisecond }
	p.Add(cfgA, consumer.QueueOptions{Weight: 3}).Handle(m.handler("a", job))
	p.Add(cfgB, consumer.QueueOptions{Weight: 1}).Handle(m.handler("b", job))
	runPool(t, p)
	waitFor(t, 90*time.Second, "500 starts", func() bool { return len(m.starts()) >= 500 })
	seq := m.starts()[100:500] // skip the start, while the reads fill up
	na := 0
	for _, q := range seq {
		if q == "a" {
			na++
		}
	}
	t.Logf("a: %d of %d starts (want 300 within 10%%)", na, len(seq))
	if na < 270 || na > 330 {
		t.Errorf("weights 3/1, one slot: a had %d of 400 starts, want 270..330: %s", na, strings.Join(seq, ""))
	}
}

// TestAttack16Pool_poisonNoSlotLeak: a queue whose every job panics, is
// dead-lettered, returns a permanent error or outlives its MaxRuntime does
// not hurt the other queue, and leaves no budget slot held: afterwards the
// other queue still runs Concurrency jobs at once and no queue reports a
// running slot.
func TestAttack16Pool_poisonNoSlotLeak(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	const conc, nPoison = 3, 90
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: conc})
	cfgP := poolConfig(pre + ":poison")
	cfgP.MaxRuntime = 20 * time.Millisecond
	cfgP.MaxAttempts = 1
	var i atomic.Int32
	poison := p.Add(cfgP, consumer.QueueOptions{Weight: 5}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		switch i.Add(1) % 4 {
		case 0:
			panic("poison " + string(job.Payload))
		case 1:
			return consumer.Dead("bad", errors.New("dead"))
		case 2:
			return consumer.Permanent(errors.New("perm"))
		default:
			<-ctx.Done() // MaxRuntime
			return ctx.Err()
		}
	}))
	good := p.Add(poolConfig(pre+":good"), consumer.QueueOptions{Weight: 1}).
		Handle(m.handler("good", func() time.Duration { return 200 * time.Millisecond }))
	poolFill(t, rdb, pre+":poison", nPoison)
	poolFill(t, rdb, pre+":good", 5) // served beside the poison
	runPool(t, p)
	waitFor(t, 90*time.Second, "every poison job dead-lettered", func() bool { return poison.Stats().DeadLettered == nPoison })
	waitFor(t, 90*time.Second, "the good queue's first jobs", func() bool { return good.Stats().Acked == 5 })
	waitFor(t, 90*time.Second, "no slot held", func() bool {
		h := p.Health()
		return h.Queues[0].Running == 0 && h.Queues[1].Running == 0
	})
	poolFill(t, rdb, pre+":good", 3*conc)
	waitFor(t, 90*time.Second, fmt.Sprintf("%d good jobs at once after the poison", conc), func() bool {
		_, _, cur, _, _ := m.snapshot()
		return cur["good"] == conc
	})
}

// TestAttack16Pool_blockedForeverShutdown: a queue whose handler ignores
// its context forever holds the only slot; another queue's jobs wait for
// it. Shutdown returns within its deadline plus about a second, with an
// error naming the stuck queue; the waiting jobs never start here, and are
// given back (another pool runs them well before the visibility timeout).
func TestAttack16Pool_blockedForeverShutdown(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var stuckStarted atomic.Int32
	var shutdownAt atomic.Int64
	var waitersAfter atomic.Int32
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 1})
	cfgS, cfgW := poolConfig(pre+":stuck"), poolConfig(pre+":waiting")
	cfgS.VisibilityTimeout, cfgW.VisibilityTimeout = 20*time.Second, 20*time.Second
	p.Add(cfgS, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		stuckStarted.Add(1)
		<-release
		return nil
	}))
	p.Add(cfgW, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if at := shutdownAt.Load(); at != 0 {
			waitersAfter.Add(1)
		}
		return nil
	}))
	poolFill(t, rdb, pre+":stuck", 1)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	waitFor(t, 90*time.Second, "the stuck job running", func() bool { return stuckStarted.Load() == 1 })
	poolFill(t, rdb, pre+":waiting", 20)
	waitFor(t, 90*time.Second, "the waiting queue's jobs read and waiting", func() bool { return p.Health().Queues[1].Waiting > 0 })
	watch := stallWatch(t, rdb)
	shutdownAt.Store(time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := p.Shutdown(ctx)
	took, stalled, over := tookOver(watch, t0, 3*time.Second)
	if over {
		t.Errorf("Shutdown with a 500ms deadline took %v (%v of it stalled)", took, stalled)
	}
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after Shutdown's deadline")
	}
	t.Logf("Shutdown: %v (after %v); Run: %v", err, took, runErr)
	if runErr == nil || !strings.Contains(runErr.Error(), pre+":stuck") {
		t.Errorf("Run: %v, want an error naming the stuck stream", runErr)
	}
	if runErr != nil && strings.Contains(runErr.Error(), pre+":waiting") {
		t.Errorf("Run's error names the queue that abandoned nothing: %v", runErr)
	}
	if n := waitersAfter.Load(); n != 0 {
		t.Errorf("%d waiting jobs started after Shutdown began", n)
	}
	// Given back: a second pool under another name runs them long before
	// the 20s visibility timeout.
	p2 := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	cfg2 := cfgW
	cfg2.Consumer = "c2"
	cfg2.SweepInterval = 100 * time.Millisecond
	var ran atomic.Int32
	p2.Add(cfg2, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
		ran.Add(1)
		return nil
	}))
	runPool(t, p2)
	waitFor(t, 90*time.Second, "the given-back jobs run by the second pool", func() bool { return ran.Load() == 20 })
}

// TestAttack16Pool_ownShutdownTimeouts: cancelling Run's context drains
// each queue with its own Config.ShutdownTimeout: the short one's handler
// is cancelled (ErrShutdown) at its deadline, the long one's job finishes.
func TestAttack16Pool_ownShutdownTimeouts(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	var shortCause atomic.Value
	var shortAt, longDone atomic.Int64
	var started atomic.Int32
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2})
	cs, cl := poolConfig(pre+":short"), poolConfig(pre+":long")
	cs.ShutdownTimeout, cl.ShutdownTimeout = 300*time.Millisecond, 10*time.Second
	p.Add(cs, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		started.Add(1)
		<-ctx.Done()
		shortAt.Store(time.Now().UnixNano())
		shortCause.Store(fmt.Sprint(context.Cause(ctx)))
		return context.Cause(ctx)
	}))
	p.Add(cl, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		started.Add(1)
		select {
		case <-time.After(2 * time.Second):
			longDone.Store(time.Now().UnixNano())
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}))
	poolFill(t, rdb, pre+":short", 1)
	poolFill(t, rdb, pre+":long", 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, 90*time.Second, "both jobs running", func() bool { return started.Load() == 2 })
	watch := stallWatch(t, rdb)
	t0 := time.Now()
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
	}
	if err != nil {
		t.Logf("Run: %v", err)
	}
	if longDone.Load() == 0 {
		t.Error("the long queue's job (ShutdownTimeout 10s) did not finish: it was cut at another queue's deadline")
	}
	at := shortAt.Load()
	if at == 0 {
		t.Fatal("the short queue's handler was never cancelled")
	}
	if d, stalled := time.Unix(0, at).Sub(t0), watch.Within(t0, time.Unix(0, at)); d > 1500*time.Millisecond+stalled {
		t.Errorf("the short queue's handler was cancelled %v after the cancel (%v of it stalled), its ShutdownTimeout is 300ms", d, stalled)
	}
	if c, _ := shortCause.Load().(string); !strings.Contains(c, consumer.ErrShutdown.Error()) {
		t.Errorf("short handler's cause %q, want ErrShutdown", c)
	}
}

// TestAttack16Pool_fatalQueue: one queue's stream key holds a string
// (WRONGTYPE, an error waiting cannot fix): Run returns an error naming that
// stream, the other queue is shut down (after finishing its running job),
// and Run does not hang.
func TestAttack16Pool_fatalQueue(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	if err := rdb.Set(context.Background(), pre+":bad", "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var finished atomic.Int32
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2})
	good := p.Add(poolConfig(pre+":good"), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		finished.Add(1)
		return nil
	}))
	p.Add(poolConfig(pre+":bad"), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	poolFill(t, rdb, pre+":good", 3)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		_ = p.Shutdown(context.Background())
		t.Fatal("Run did not return with a WRONGTYPE queue")
	}
	if err == nil || !strings.Contains(err.Error(), pre+":bad") || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Run: %v, want WRONGTYPE naming %s", err, pre+":bad")
	}
	if strings.Contains(err.Error(), pre+":good") {
		t.Errorf("Run's error blames the good queue: %v", err)
	}
	if h := p.Health(); h.Live || good.Health().Live {
		t.Errorf("after Run returned: pool health %+v", h)
	}
	// Whatever the good queue read is not lost: a second pool finishes it.
	p2 := consumer.NewPool(rdb, consumer.PoolConfig{})
	c2 := poolConfig(pre + ":good")
	c2.Consumer = "c2"
	c2.VisibilityTimeout, c2.SweepInterval = time.Second, 100*time.Millisecond
	p2.Add(c2, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		finished.Add(1)
		return nil
	}))
	runPool(t, p2)
	waitFor(t, 90*time.Second, "every good job done", func() bool {
		n, err := rdb.XPending(context.Background(), pre+":good", "g").Result()
		l, _ := rdb.XInfoGroups(context.Background(), pre+":good").Result()
		return err == nil && n.Count == 0 && len(l) == 1 && l[0].Lag == 0 && finished.Load() >= 3
	})
}

// TestAttack16Pool_suspectAloneInThePool: a job that lost its lease twice
// runs alone on its third run, and in a pool alone in the whole pool (a
// crash stops every queue's jobs; docs/pool.md): no other job of its queue
// nor of the pool's other queue starts meanwhile. (The outside test first
// expected the other queue to keep starting jobs, as the docs then said;
// TestAttack16Pool_crashCollateralAcrossQueues showed why that was wrong.)
func TestAttack16Pool_suspectAloneInThePool(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	var bStarts, aOthersDuring atomic.Int32
	var aloneRunning atomic.Bool
	type result struct {
		deliveries int
		bStarted   bool
	}
	res := make(chan result, 1)
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	cfgA := poolConfig(pre + ":a")
	cfgA.VisibilityTimeout = 600 * time.Millisecond
	cfgA.HeartbeatInterval = -1
	cfgA.SweepInterval = 100 * time.Millisecond
	cfgA.MaxCrashes = 5
	prodB := stream.NewProducer(rdb, stream.ProducerConfig{Stream: pre + ":b"})
	a := p.Add(cfgA, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if job.Type != "J" {
			if aloneRunning.Load() {
				aOthersDuring.Add(1)
			}
			return nil
		}
		if job.Deliveries < 3 {
			<-ctx.Done() // lease lost (no heartbeat): not settled
			return context.Cause(ctx)
		}
		aloneRunning.Store(true)
		defer aloneRunning.Store(false)
		before := bStarts.Load()
		for i := 0; i < 5; i++ {
			if _, err := prodB.Enqueue(context.Background(), &stream.Job{Type: "t", Payload: []byte("x")}); err != nil {
				return err
			}
		}
		deadline := time.Now().Add(350 * time.Millisecond)
		for time.Now().Before(deadline) && bStarts.Load() == before {
			time.Sleep(5 * time.Millisecond)
		}
		res <- result{job.Deliveries, bStarts.Load() > before}
		return nil
	}))
	p.Add(poolConfig(pre+":b"), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		bStarts.Add(1)
		return nil
	}))
	prodA := stream.NewProducer(rdb, stream.ProducerConfig{Stream: pre + ":a"})
	if _, err := prodA.Enqueue(context.Background(), &stream.Job{Type: "J", Payload: []byte("j")}); err != nil {
		t.Fatal(err)
	}
	runPool(t, p)
	// Other jobs of queue a keep arriving, so that some would start beside
	// the alone run if it were not alone.
	stopFill := make(chan struct{})
	fillDone := make(chan struct{})
	go func() {
		defer close(fillDone)
		for {
			select {
			case <-stopFill:
				return
			case <-time.After(20 * time.Millisecond):
				_, _ = prodA.Enqueue(context.Background(), &stream.Job{Type: "t", Payload: []byte("y")})
			}
		}
	}()
	var r result
	select {
	case r = <-res:
	case <-time.After(15 * time.Second):
		t.Fatalf("the suspect's third run never came (stats %+v)", a.Stats())
	}
	close(stopFill)
	<-fillDone
	t.Logf("third run at delivery %d; queue b started a job meanwhile: %v; other jobs of a started meanwhile: %d", r.deliveries, r.bStarted, aOthersDuring.Load())
	if r.bStarted {
		t.Error("queue b started a job while a suspect of queue a ran alone in the pool")
	}
	if n := aOthersDuring.Load(); n != 0 {
		t.Errorf("%d other jobs of queue a started while its suspect ran alone", n)
	}
}

// TestAttack16Pool_oneNodeDown: on a 3-master cluster, a pool with one
// queue on master 0 and one on master 1; master 1 is frozen (SIGSTOP). The
// pool is not ready within the frozen queue's visibility timeout and its
// Problem names that queue, the other queue stays ready and keeps running
// jobs, the pool stays live; after SIGCONT it is ready again and the frozen
// queue's jobs run.
func TestAttack16Pool_oneNodeDown(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	for _, n := range cl.Nodes() {
		// A frozen master must not take the whole cluster down (that is
		// Redis's doing, not the pool's).
		if err := n.Client(t).ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	rdb := cl.Client(t)
	names := make([]string, 2)
	for i := 0; names[0] == "" || names[1] == ""; i++ {
		s := fmt.Sprintf("{a16pool%d}:jobs", i)
		slot := keyslot.Of(s)
		for m, r := range [][2]int{{0, 5400}, {5500, 10900}} {
			if r[0] <= slot && slot <= r[1] && names[m] == "" {
				names[m] = s
			}
		}
	}
	var mu sync.Mutex
	done := map[string]int{}
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		mu.Lock()
		done[string(job.Payload)]++
		mu.Unlock()
		return nil
	})
	ndone := func(s string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for k := range done {
			if strings.HasPrefix(k, s+"/") {
				n++
			}
		}
		return n
	}
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	for _, s := range names {
		cfg := poolConfig(s)
		cfg.VisibilityTimeout = 2 * time.Second
		p.Add(cfg, consumer.QueueOptions{}).Handle(h)
	}
	runPool(t, p)
	waitFor(t, 90*time.Second, "pool ready", func() bool { return p.Health().Ready })
	node := cl.Nodes()[1]
	node.Stop()
	stopped := time.Now()
	waitFor(t, 90*time.Second, "the pool not ready with master 1 frozen", func() bool { return !p.Health().Ready })
	notReadyAfter := time.Since(stopped)
	hh := p.Health()
	// Jobs on the live master run meanwhile.
	prod := stream.NewProducer(rdb, stream.ProducerConfig{Stream: names[0]})
	for i := 0; i < 10; i++ {
		if _, err := prod.Enqueue(context.Background(), &stream.Job{Type: "t", Payload: fmt.Appendf(nil, "%s/%d", names[0], i)}); err != nil {
			t.Fatalf("enqueue on the live master: %v", err)
		}
	}
	waitFor(t, 90*time.Second, "the live master's queue running jobs beside the frozen one", func() bool { return ndone(names[0]) == 10 })
	hLive := p.Health()
	node.Cont()
	t.Logf("not ready %v after the freeze; health then: %+v", notReadyAfter, hh)
	if notReadyAfter > 2*time.Second+time.Second {
		t.Errorf("not ready only %v after the freeze, visibility timeout 2s", notReadyAfter)
	}
	if !strings.Contains(hh.Problem, names[1]) {
		t.Errorf("Problem %q does not name the frozen queue %s", hh.Problem, names[1])
	}
	if !hLive.Live || !hLive.Queues[0].Ready {
		t.Errorf("while master 1 was frozen: pool live %v, live master's queue ready %v (%s)", hLive.Live, hLive.Queues[0].Ready, hLive.Queues[0].Problem)
	}
	if hLive.Queues[1].Ready {
		t.Errorf("the frozen queue reported ready")
	}
	waitFor(t, 90*time.Second, "the pool ready again after SIGCONT", func() bool { return p.Health().Ready })
	prod1 := stream.NewProducer(rdb, stream.ProducerConfig{Stream: names[1]})
	for i := 0; i < 10; i++ {
		if _, err := prod1.Enqueue(context.Background(), &stream.Job{Type: "t", Payload: fmt.Appendf(nil, "%s/%d", names[1], i)}); err != nil {
			t.Fatalf("enqueue on the thawed master: %v", err)
		}
	}
	waitFor(t, 90*time.Second, "the thawed queue's jobs", func() bool { return ndone(names[1]) == 10 })
}

// TestAttack16Pool_minBeatsWeight: Min is a reservation whatever the
// weights: a backlogged queue of Weight 1 and Min 2 beside one of Weight 9,
// 4 slots, equal jobs, gets at least its 2 slots, so about half the starts
// (stride alone would give it a tenth).
func TestAttack16Pool_minBeatsWeight(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	cfgA, cfgB := poolConfig(pre+":a"), poolConfig(pre+":b")
	cfgA.Prefetch, cfgB.Prefetch = 100, 100
	poolFill(t, rdb, pre+":a", 600)
	poolFill(t, rdb, pre+":b", 600)
	job := func() time.Duration { return 10 * time.Millisecond }
	p.Add(cfgA, consumer.QueueOptions{Weight: 1, Min: 2}).Handle(m.handler("a", job))
	p.Add(cfgB, consumer.QueueOptions{Weight: 9}).Handle(m.handler("b", job))
	runPool(t, p)
	waitFor(t, 90*time.Second, "500 starts", func() bool { return len(m.starts()) >= 500 })
	seq := m.starts()[100:500]
	na := 0
	for _, q := range seq {
		if q == "a" {
			na++
		}
	}
	t.Logf("a (Weight 1, Min 2 of 4): %d of %d starts", na, len(seq))
	if na < 160 {
		t.Errorf("a queue with Min 2 of 4 slots had %d of 400 starts (want about 200): its reserved slots went to the heavier queue", na)
	}
}

// TestAttack16Pool_redisCutOff: the pool's Redis cut off (a partition):
// not ready within the visibility timeout (ReadyHandler 503, still live),
// ready again after it heals, and every job enqueued before and during the
// cut ends done.
func TestAttack16Pool_redisCutOff(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	px, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, DialTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	direct := srv.Client(t)
	var mu sync.Mutex
	done := map[string]int{}
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		mu.Lock()
		done[string(job.Payload)]++
		mu.Unlock()
		return nil
	})
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	for _, s := range []string{"{a}:jobs", "{b}:jobs"} {
		cfg := poolConfig(s)
		cfg.VisibilityTimeout = 2 * time.Second
		p.Add(cfg, consumer.QueueOptions{}).Handle(h)
		poolFill(t, direct, s, 50)
	}
	runPool(t, p)
	code := func(hd http.Handler) int {
		rec := httptest.NewRecorder()
		hd.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Code
	}
	waitFor(t, 90*time.Second, "100 jobs done and ready", func() bool {
		mu.Lock()
		n := len(done)
		mu.Unlock()
		return n == 100 && p.Health().Ready
	})
	watch := stallWatch(t, direct)
	px.Blackhole()
	cut := time.Now()
	waitFor(t, 90*time.Second, "not ready", func() bool { return code(p.ReadyHandler()) == http.StatusServiceUnavailable })
	if d, stalled, over := tookOver(watch, cut, 3*time.Second); over {
		t.Errorf("not ready %v after the cut (%v of it stalled), visibility timeout 2s", d, stalled)
	}
	if c := code(p.LiveHandler()); c != http.StatusOK {
		t.Errorf("LiveHandler %d while cut off, want 200", c)
	}
	for _, s := range []string{"{a}:jobs", "{b}:jobs"} {
		for i := 50; i < 60; i++ {
			if err := direct.XAdd(context.Background(), &redis.XAddArgs{Stream: s, Values: map[string]any{"type": "t", "payload": fmt.Sprintf("%s/%d", s, i)}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	px.Pass()
	waitFor(t, 90*time.Second, "ready again and every job done", func() bool {
		mu.Lock()
		n := len(done)
		mu.Unlock()
		return n == 120 && code(p.ReadyHandler()) == http.StatusOK
	})
}

// TestAttack16Pool_strictTiesAndNegative: strict mode with negative
// priorities: the queues of Priority 0 take every slot from the queue of
// Priority -5 while they have jobs waiting, and share among themselves by
// Weight (3/1).
func TestAttack16Pool_strictTiesAndNegative(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2, Strict: true})
	job := func() time.Duration { return 2 * time.Millisecond }
	for _, q := range []struct {
		name     string
		prio, wt int
	}{{"x", 0, 3}, {"y", 0, 1}, {"lo", -5, 1000}} {
		cfg := poolConfig(pre + ":" + q.name)
		cfg.Prefetch = 200
		poolFill(t, rdb, cfg.Stream, 800)
		p.Add(cfg, consumer.QueueOptions{Priority: q.prio, Weight: q.wt}).Handle(m.handler(q.name, job))
	}
	runPool(t, p)
	waitFor(t, 90*time.Second, "600 starts", func() bool { return len(m.starts()) >= 600 })
	seq := m.starts()[200:600]
	n := map[string]int{}
	for _, q := range seq {
		n[q]++
	}
	t.Logf("starts 200..600: %v", n)
	if n["lo"] > 4 {
		t.Errorf("the Priority -5 queue started %d of 400 jobs while the Priority 0 queues had jobs waiting", n["lo"])
	}
	if n["x"] < 270 || n["x"] > 330 {
		t.Errorf("equal priorities, weights 3/1: x had %d of 400 starts, want 270..330", n["x"])
	}
}

// TestAttack16Pool_onDeadLetterInSlot: OnDeadLetter "runs in the job's
// worker slot": handlers and OnDeadLetter callbacks running at once, over
// every queue, never exceed the pool's Concurrency.
func TestAttack16Pool_onDeadLetterInSlot(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	const conc = 2
	var cur, peak, dl atomic.Int32
	enter := func() {
		c := cur.Add(1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
	}
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: conc})
	for _, s := range []string{"a", "b"} {
		cfg := poolConfig(pre + ":" + s)
		cfg.OnDeadLetter = func(ctx context.Context, d consumer.DeadLetter) {
			enter()
			time.Sleep(30 * time.Millisecond)
			cur.Add(-1)
			dl.Add(1)
		}
		poolFill(t, rdb, cfg.Stream, 20)
		p.Add(cfg, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			enter()
			defer cur.Add(-1)
			time.Sleep(5 * time.Millisecond)
			return consumer.Dead("bad", errors.New("no"))
		}))
	}
	runPool(t, p)
	waitFor(t, 90*time.Second, "40 dead letters", func() bool { return dl.Load() == 40 })
	if pk := peak.Load(); pk > conc {
		t.Errorf("%d handlers and OnDeadLetter callbacks ran at once, Concurrency %d", pk, conc)
	}
}

// TestAttack16Pool_afterRun: after Run has returned, WaitIdle returns an
// error at once, a second Shutdown returns at once, and a Run whose context
// is already cancelled returns nil promptly.
func TestAttack16Pool_afterRun(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	p := consumer.NewPool(rdb, consumer.PoolConfig{})
	q := p.Add(poolConfig(pre+":a"), consumer.QueueOptions{}).Handle(h)
	stop := runPool(t, p)
	waitFor(t, 90*time.Second, "ready", func() bool { return p.Health().Ready })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	rec := httptest.NewRecorder()
	p.LiveHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/live", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("LiveHandler after Run returned: %d, want 503", rec.Code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := q.WaitIdle(ctx); err == nil || ctx.Err() != nil {
		t.Errorf("WaitIdle after Run returned: %v after %v, want an error at once", err, time.Since(t0))
	}
	watch := stallWatch(t, rdb)
	t0 = time.Now()
	err := p.Shutdown(ctx)
	if d, stalled, over := tookOver(watch, t0, 2*time.Second); err != nil || over {
		t.Errorf("second Shutdown: %v after %v (%v of it stalled)", err, d, stalled)
	}
	p2 := consumer.NewPool(rdb, consumer.PoolConfig{})
	p2.Add(poolConfig(pre+":b"), consumer.QueueOptions{}).Handle(h)
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	done := make(chan error, 1)
	go func() { done <- p2.Run(cctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run with a cancelled context: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = p2.Shutdown(context.Background())
		t.Fatal("Run with a cancelled context did not return")
	}
}

// TestAttack16Pool_groupRecovery: one queue's group destroyed and its
// stream deleted mid-run: that queue recovers its group (as a consumer
// does) and runs new jobs; the other queue is not disturbed; the pool
// stays live.
func TestAttack16Pool_groupRecovery(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	qa := p.Add(poolConfig(pre+":a"), consumer.QueueOptions{}).Handle(m.handler("a", func() time.Duration { return 0 }))
	qb := p.Add(poolConfig(pre+":b"), consumer.QueueOptions{}).Handle(m.handler("b", func() time.Duration { return 0 }))
	runPool(t, p)
	poolFill(t, rdb, pre+":a", 10)
	poolFill(t, rdb, pre+":b", 10)
	waitFor(t, 90*time.Second, "20 done", func() bool { _, _, _, _, d := m.snapshot(); return d == 20 })
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { return rdb.XGroupDestroy(ctx, pre+":b", "g").Err() },
		func() error { return rdb.Del(ctx, pre+":b").Err() },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
		// New payloads each time (the meter counts distinct payloads).
		_, _, _, _, before := m.snapshot()
		prod := stream.NewProducer(rdb, stream.ProducerConfig{Stream: pre + ":b"})
		pa := stream.NewProducer(rdb, stream.ProducerConfig{Stream: pre + ":a"})
		for i := 0; i < 5; i++ {
			if _, err := prod.Enqueue(ctx, &stream.Job{Type: "t", Payload: fmt.Appendf(nil, "b-%d-%d", before, i)}); err != nil {
				t.Fatal(err)
			}
			if _, err := pa.Enqueue(ctx, &stream.Job{Type: "t", Payload: fmt.Appendf(nil, "a-%d-%d", before, i)}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 90*time.Second, "the new jobs of both queues done", func() bool { _, _, _, _, d := m.snapshot(); return d == before+10 })
	}
	if h := p.Health(); !h.Live {
		t.Errorf("pool not live after a group recovery: %+v", h)
	}
	t.Logf("a: %+v; b: %+v", qa.Stats(), qb.Stats())
}

// a16Buf is a bytes buffer safe for concurrent use, for a slog handler.
type a16Buf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *a16Buf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *a16Buf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestAttack16Pool_loggerNoPayload: PoolConfig.Logger is the logger of every
// queue whose Config has none; what the queues log about malformed entries,
// oversized entries, panics and dead letters names the stream but never
// holds the payload or raw fields.
func TestAttack16Pool_loggerNoPayload(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	const secret = "SECRET-a16-4242"
	buf := &a16Buf{}
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 3, Logger: log})
	var qs []*consumer.Queue
	for _, s := range []string{"a", "b"} {
		cfg := poolConfig(pre + ":" + s)
		cfg.Logger = nil
		cfg.MaxEntryBytes = 2048
		cfg.MaxAttempts = 1
		qs = append(qs, p.Add(cfg, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			switch string(job.Payload[:3]) {
			case "pan":
				panic("handler blew up")
			case "dea":
				return consumer.Dead("nope", errors.New("refused"))
			case "err":
				return errors.New("plain failure")
			}
			return nil
		})))
	}
	ctx := context.Background()
	for _, s := range []string{pre + ":a", pre + ":b"} {
		prod := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
		for _, pl := range []string{"pan " + secret, "dea " + secret, "err " + secret, "ok " + secret, "big " + strings.Repeat(secret, 200)} {
			if _, err := prod.Enqueue(ctx, &stream.Job{Type: "t", Payload: []byte(pl), IdempotencyKey: "k"}); err != nil {
				t.Fatal(err)
			}
		}
		// A malformed entry: no type.
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"payload": secret, "junk": secret}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	runPool(t, p)
	waitFor(t, 90*time.Second, "4 dead letters and 1 ack per queue", func() bool {
		for _, q := range qs {
			st := q.Stats()
			if st.DeadLettered != 5 || st.Acked != 1 {
				return false
			}
		}
		return true
	})
	out := buf.String()
	if !strings.Contains(out, pre+":a") || !strings.Contains(out, pre+":b") {
		t.Errorf("PoolConfig.Logger did not get both queues' records:\n%s", out)
	}
	if strings.Contains(out, secret) {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, secret) {
				t.Errorf("log line holds the payload: %.300s", l)
			}
		}
	}
}

// TestAttack16Pool_waitingForRedisShutdown: a pool started before its Redis
// (StartTimeout 0: wait) stops at once on Shutdown, and Run returns nil.
func TestAttack16Pool_waitingForRedisShutdown(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 20, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	p := consumer.NewPool(rdb, consumer.PoolConfig{})
	p.Add(poolConfig("a"), consumer.QueueOptions{}).Handle(h)
	p.Add(poolConfig("b"), consumer.QueueOptions{}).Handle(h)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Run returned while Redis is unreachable and StartTimeout is 0: %v", err)
	case <-time.After(700 * time.Millisecond):
	}
	if h := p.Health(); h.Ready {
		t.Errorf("ready while waiting for Redis: %+v", h)
	}
	watch := stallWatch(t, redistest.Shared(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := p.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown while waiting for Redis: %v", err)
	}
	if d, stalled, over := tookOver(watch, t0, 2*time.Second); over {
		t.Errorf("Shutdown while waiting for Redis took %v (%v of it stalled)", d, stalled)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
}

// TestAttack16Pool_redisCrashRestart: the pool's Redis (AOF always) is
// SIGKILLed and restarted mid-run: every job of both streams ends done,
// nothing stays pending, and none is dead-lettered.
func TestAttack16Pool_redisCrashRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{AOF: "always"})
	rdb := srv.Client(t, func(o *redis.Options) { o.PoolSize = 20 })
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	streams := []string{"{a}:jobs", "{b}:jobs"}
	var qs []*consumer.Queue
	for _, s := range streams {
		cfg := poolConfig(s)
		cfg.VisibilityTimeout = 1500 * time.Millisecond
		cfg.SweepInterval = 100 * time.Millisecond
		cfg.MaxCrashes = 10
		poolFill(t, rdb, s, 300)
		qs = append(qs, p.Add(cfg, consumer.QueueOptions{}).Handle(m.handler(s, func() time.Duration { return 3 * time.Millisecond })))
	}
	runPool(t, p)
	waitFor(t, 90*time.Second, "100 jobs done", func() bool { _, _, _, _, d := m.snapshot(); return d >= 100 })
	srv.Kill9()
	srv.Restart()
	waitFor(t, 90*time.Second, "every job done and settled", func() bool {
		_, _, _, _, d := m.snapshot()
		if d != 600 {
			return false
		}
		for _, s := range streams {
			gs, err := rdb.XInfoGroups(context.Background(), s).Result()
			if err != nil || len(gs) != 1 || gs[0].Pending != 0 || gs[0].Lag != 0 {
				return false
			}
		}
		return true
	})
	for i, s := range streams {
		keys, _ := stream.KeysFor(s)
		if n, _ := rdb.XLen(context.Background(), keys.Dead).Result(); n != 0 {
			t.Errorf("%s: %d dead letters", s, n)
		}
		t.Logf("%s: %+v", s, qs[i].Stats())
	}
}

// TestAttack16Pool_budgetStress: eight queues, tiny jobs, random weights
// (and priorities in strict mode): slots change hands all the time (the
// keep-or-hand-over path), and still never more than Concurrency handlers
// run at once, nor more than a queue's Max, and every job runs.
func TestAttack16Pool_budgetStress(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			pre := a16Prefix(t, rdb)
			const conc, per, nq = 3, 150, 8
			m := newA16Meter()
			p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: conc, Strict: strict})
			maxes := map[string]int{}
			for i := 0; i < nq; i++ {
				q := fmt.Sprintf("q%d", i)
				cfg := poolConfig(pre + ":" + q)
				cfg.Prefetch = 1 + i*5
				poolFill(t, rdb, cfg.Stream, per)
				o := consumer.QueueOptions{Weight: 1 + rand.IntN(20), Priority: i % 3, Max: 1 + i%conc}
				if i == 0 {
					o.Min = 1
				}
				maxes[q] = o.Max
				p.Add(cfg, o).Handle(m.handler(q, func() time.Duration { return time.Duration(rand.IntN(500)) * time.Microsecond }))
			}
			runPool(t, p)
			waitFor(t, 90*time.Second, "every job done", func() bool { _, _, _, _, d := m.snapshot(); return d == per*nq })
			_, allMax, _, mx, _ := m.snapshot()
			if allMax > conc {
				t.Errorf("%d handlers at once, Concurrency %d", allMax, conc)
			}
			for q, v := range mx {
				if v > maxes[q] {
					t.Errorf("%s: %d at once, Max %d", q, v, maxes[q])
				}
			}
		})
	}
}

// TestAttack16Pool_priorityIgnoredWeighted: Priority is "Ignored in
// weighted mode": equal weights share equally whatever the priorities.
func TestAttack16Pool_priorityIgnoredWeighted(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 1})
	for _, q := range []struct {
		name string
		prio int
	}{{"hi", 100}, {"lo", -100}} {
		cfg := poolConfig(pre + ":" + q.name)
		cfg.Prefetch = 200
		poolFill(t, rdb, cfg.Stream, 800)
		p.Add(cfg, consumer.QueueOptions{Priority: q.prio}).Handle(m.handler(q.name, func() time.Duration { return 2 * time.Millisecond }))
	}
	runPool(t, p)
	waitFor(t, 90*time.Second, "400 starts", func() bool { return len(m.starts()) >= 400 })
	n := 0
	for _, q := range m.starts()[100:400] {
		if q == "hi" {
			n++
		}
	}
	if n < 135 || n > 165 {
		t.Errorf("weighted mode, equal weights, priorities 100/-100: hi had %d of 300 starts, want about 150", n)
	}
}

// TestAttack16Pool_startTimeout: with Redis unreachable and each queue's
// StartTimeout passing, Run returns the errors, each naming its stream.
func TestAttack16Pool_startTimeout(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 20, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	p := consumer.NewPool(rdb, consumer.PoolConfig{})
	for _, s := range []string{"sa", "sb"} {
		cfg := poolConfig(s)
		cfg.StartTimeout = 300 * time.Millisecond
		p.Add(cfg, consumer.QueueOptions{}).Handle(h)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), `"sa"`) && !strings.Contains(err.Error(), `"sb"`) {
			t.Errorf("Run: %v, want the start errors naming the streams", err)
		}
		t.Logf("Run: %v", err)
	case <-time.After(10 * time.Second):
		_ = p.Shutdown(context.Background())
		t.Fatal("Run did not return after StartTimeout")
	}
}

// TestAttack16Pool_retrySnooze: jobs that snooze or fail once come back
// through each queue's own delayed set and run again, each done once,
// while a waiting delayed job holds no slot (the other queue runs at full
// Concurrency meanwhile).
func TestAttack16Pool_retrySnooze(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	pre := a16Prefix(t, rdb)
	var mu sync.Mutex
	seen := map[string]int{}
	done := map[string]int{}
	m := newA16Meter()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2})
	cfg := poolConfig(pre + ":r")
	cfg.PromoteInterval = 20 * time.Millisecond
	cfg.Backoff = consumer.Backoff{Base: 50 * time.Millisecond, Cap: 50 * time.Millisecond}
	r := p.Add(cfg, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		k := string(job.Payload)
		mu.Lock()
		seen[k]++
		n := seen[k]
		if n > 1 {
			done[k]++
		}
		mu.Unlock()
		if n == 1 {
			if k[len(k)-1]%2 == 0 {
				return consumer.Snooze(1500 * time.Millisecond)
			}
			return consumer.Retry(1500*time.Millisecond, errors.New("once"))
		}
		return nil
	}))
	p.Add(poolConfig(pre+":o"), consumer.QueueOptions{}).Handle(m.handler("o", func() time.Duration { return 100 * time.Millisecond }))
	poolFill(t, rdb, pre+":r", 20)
	runPool(t, p)
	waitFor(t, 90*time.Second, "20 jobs rescheduled", func() bool { s := r.Stats(); return s.Snoozed+s.Retried == 20 })
	poolFill(t, rdb, pre+":o", 6)
	waitFor(t, 90*time.Second, "the other queue at 2 at once while 20 jobs are delayed", func() bool {
		_, _, cur, _, _ := m.snapshot()
		return cur["o"] == 2
	})
	waitFor(t, 90*time.Second, "20 jobs done after their second run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == 20
	})
	mu.Lock()
	defer mu.Unlock()
	for k, n := range done {
		if n != 1 {
			t.Errorf("job %s done %d times", k, n)
		}
	}
}
