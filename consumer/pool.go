package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// PoolConfig configures a [Pool]. Zero values mean the defaults.
type PoolConfig struct {
	// Concurrency is the number of jobs that run at once across all the
	// pool's queues: the shared budget. Defaults to [DefaultConcurrency].
	Concurrency int
	// Logger is the logger of every queue whose Config has none. Defaults
	// to slog.Default().
	Logger *slog.Logger
	// Strict chooses strict priority: a free slot always goes to the
	// waiting queue of highest [QueueOptions.Priority] (equal priorities
	// share by Weight). Otherwise slots are shared by weight: when every
	// queue has work, each starts jobs in proportion to its
	// [QueueOptions.Weight]. Either way a queue's Min slots are its own.
	// Defaults to false: weighted.
	Strict bool
}

// Validate reports whether c is valid, naming the first field that is not.
func (c PoolConfig) Validate() error {
	if c.Concurrency < 0 {
		return fmt.Errorf("consumer: PoolConfig.Concurrency (%d) must not be negative", c.Concurrency)
	}
	return nil
}

// QueueOptions are a queue's share of a [Pool]'s budget. Zero values mean
// the defaults.
type QueueOptions struct {
	// Max is the most jobs of this queue that run at once. At most
	// PoolConfig.Concurrency. Defaults to PoolConfig.Concurrency.
	Max int
	// Min is the number of slots reserved for this queue: however busy the
	// other queues are, they never take the last slots this queue needs to
	// run Min jobs, so it starts a job as soon as one is read while fewer
	// than Min of its jobs run. At most Max; the Mins of all queues add up
	// to at most PoolConfig.Concurrency. Defaults to 0.
	Min int
	// Priority orders the queues in strict mode (PoolConfig.Strict): a
	// free slot goes to the waiting queue of highest Priority. Ignored in
	// weighted mode. Defaults to 0.
	Priority int
	// Weight is the queue's share in weighted mode (and among queues of
	// equal Priority in strict mode): when every queue has jobs waiting,
	// each starts jobs in proportion to its Weight. From 1 to 1,000,000.
	// Defaults to 1.
	Weight int
}

// maxWeight bounds QueueOptions.Weight, so that strides stay exact enough.
const maxWeight = 1_000_000

// Pool runs several queues (a stream and group each) in one process with
// one shared budget of worker slots: [PoolConfig.Concurrency] jobs run at
// once across all of them, shared by weight or strict priority, each queue
// between its Min and Max. Build it with [NewPool] and [Pool.Add], then call
// [Pool.Run]:
//
//	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 20})
//	p.Add(consumer.Config{Stream: "payments", Group: "workers"}, consumer.QueueOptions{Weight: 6, Min: 2}).Use(mw...).Handle(pay)
//	p.Add(consumer.Config{Stream: "emails", Group: "workers"}, consumer.QueueOptions{Weight: 1}).Use(mw...).Handle(mail)
//	err := p.Run(ctx)
//
// Each queue is a [Consumer] of its stream, with every guarantee of one:
// claims, heartbeat, owner-checked settlement, suspects, give-back at
// shutdown, its own Config (its Prefetch included). What the pool adds is
// the choice of which job starts when a slot frees: a queue's jobs are read
// into its own queue, as a consumer's are, and hold no slot until they
// start; when a slot frees, the budget gives it to the waiting queue the
// policy picks. So a flood in one queue delays another's job by at most the
// time until the next slot frees, and a low-priority queue's prefetched
// jobs never keep a slot from a high-priority job.
//
// Reading: the queues that one XREADGROUP can read together (the same
// group and consumer name; on Redis Cluster, streams in one hash slot too,
// such as streams under one hash tag) are read by one blocking XREADGROUP
// on one connection, each queue asking for what its Max and Prefetch leave
// room for (a queue without room is left out of the read, and the read is
// interrupted when it gets room). Run refuses a client whose PoolSize (per
// node, on Cluster) is under twice the number of these read groups. See
// docs/pool.md for what sharing costs and what it cannot do.
type Pool struct {
	rdb    redis.UniversalClient
	cfg    PoolConfig
	mu     sync.Mutex
	queues []*Queue

	stopReq chan context.Context
	started atomic.Bool
	done    chan struct{}
	runErr  error
	budget  *budget
	shared  []*sharedReader // the read groups' readers, set by Run
}

// Queue is one queue of a [Pool]: set its middleware and handler with
// [Queue.Use] and [Queue.Handle], as on a [Consumer].
type Queue struct {
	cfg  Config // as given to Add (Run gives the consumer its Concurrency)
	opts QueueOptions
	c    *Consumer
}

// NewPool returns a pool whose queues share cfg.Concurrency worker slots.
// The configuration is checked by Run, before Run touches Redis.
func NewPool(rdb redis.UniversalClient, cfg PoolConfig) *Pool {
	return &Pool{rdb: rdb, cfg: cfg, stopReq: make(chan context.Context, 1), done: make(chan struct{})}
}

// Add registers a queue: cfg is its consumer configuration, whose
// Concurrency must be 0 (the pool's budget and opts.Max set it; Run refuses
// anything else), and opts its share of the budget. Call it before Run; a
// queue added after Run has started is not run (and the pool's Health is
// not Ready because of it).
func (p *Pool) Add(cfg Config, opts QueueOptions) *Queue {
	if cfg.Logger == nil {
		cfg.Logger = p.cfg.Logger
	}
	q := &Queue{cfg: cfg, opts: opts, c: New(p.rdb, cfg)}
	p.mu.Lock()
	p.queues = append(p.queues, q)
	p.mu.Unlock()
	return q
}

// Use appends middleware to the queue's chain; the first one added is the
// outermost. Pass the same middleware to several queues to share a chain.
func (q *Queue) Use(mw ...Middleware) *Queue {
	q.c.Use(mw...)
	return q
}

// Handle sets the handler that the queue's middleware chain wraps.
func (q *Queue) Handle(h Handler) *Queue {
	q.c.Handle(h)
	return q
}

// Stream returns the queue's stream.
func (q *Queue) Stream() string { return q.cfg.Stream }

// Health returns the queue's consumer's [Consumer.Health].
func (q *Queue) Health() Health { return q.c.Health() }

// Stats returns the queue's consumer's [Consumer.Stats].
func (q *Queue) Stats() Stats { return q.c.Stats() }

// WaitIdle waits until the queue has drained what it can see, as
// [Consumer.WaitIdle].
func (q *Queue) WaitIdle(ctx context.Context) error { return q.c.WaitIdle(ctx) }

func (p *Pool) snapshot() []*Queue {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snapshotLocked()
}

func (p *Pool) snapshotLocked() []*Queue { return append([]*Queue(nil), p.queues...) }

// concurrency returns the pool's budget with its default applied.
func (c PoolConfig) concurrency() int {
	if c.Concurrency == 0 {
		return DefaultConcurrency
	}
	return c.Concurrency
}

// resolve returns opts with its defaults applied, or the error naming the
// field of queue i that is invalid.
func (opts QueueOptions) resolve(n int) (QueueOptions, error) {
	for _, f := range []struct {
		name string
		v    int
	}{{"Max", opts.Max}, {"Min", opts.Min}, {"Weight", opts.Weight}} {
		if f.v < 0 {
			return opts, fmt.Errorf("QueueOptions.%s (%d) must not be negative", f.name, f.v)
		}
	}
	if opts.Max == 0 {
		opts.Max = n
	}
	if opts.Weight == 0 {
		opts.Weight = 1
	}
	switch {
	case opts.Weight > maxWeight:
		return opts, fmt.Errorf("QueueOptions.Weight (%d) must be at most %d", opts.Weight, maxWeight)
	case opts.Max > n:
		return opts, fmt.Errorf("QueueOptions.Max (%d) must not exceed PoolConfig.Concurrency (%d)", opts.Max, n)
	case opts.Min > opts.Max:
		return opts, fmt.Errorf("QueueOptions.Min (%d) must not exceed QueueOptions.Max (%d)", opts.Min, opts.Max)
	}
	return opts, nil
}

// Validate reports whether the pool's configuration and every queue's are
// valid, naming the first field that is not, with the queue's stream: the
// pool's Config, each queue's Config ([Config.Validate]; its Concurrency
// must be 0) and QueueOptions (Max at most the pool's Concurrency, Min at
// most Max, Weight from 1 to 1,000,000, the Mins adding up to at most the
// pool's Concurrency), no two queues of the same stream and group, a
// handler for each and no [Invalid] middleware on any. Run checks it before
// it touches Redis.
func (p *Pool) Validate() error {
	_, err := p.resolve()
	return err
}

func (p *Pool) resolve() ([]QueueOptions, error) {
	if err := p.cfg.Validate(); err != nil {
		return nil, err
	}
	qs := p.snapshot()
	if len(qs) == 0 {
		return nil, errors.New("consumer: pool has no queue: call Pool.Add before Run")
	}
	n := p.cfg.concurrency()
	opts := make([]QueueOptions, len(qs))
	seen := make(map[[2]string]int, len(qs))
	sumMin := 0
	for i, q := range qs {
		bad := func(err error) ([]QueueOptions, error) {
			return nil, fmt.Errorf("consumer: pool queue %d (stream %q): %w", i+1, q.cfg.Stream, err)
		}
		cfg := q.cfg
		if cfg.Concurrency != 0 {
			return bad(fmt.Errorf("Config.Concurrency (%d) must be 0 in a pool: set QueueOptions.Max", cfg.Concurrency))
		}
		if err := cfg.Validate(); err != nil {
			return bad(errors.New(strings.TrimPrefix(err.Error(), "consumer: ")))
		}
		o, err := q.opts.resolve(n)
		if err != nil {
			return bad(err)
		}
		if q.c.handler == nil {
			return bad(errors.New("no handler: call Queue.Handle before Run"))
		}
		// A middleware's configuration error (Invalid) fails the pool
		// before any queue touches Redis, not only the queue it is on.
		if _, err := buildChain(q.c.handler, q.c.mws); err != nil {
			return bad(err)
		}
		key := [2]string{cfg.Stream, cfg.Group}
		if j, dup := seen[key]; dup {
			return bad(fmt.Errorf("stream and group (%q) already in queue %d", cfg.Group, j+1))
		}
		seen[key] = i
		sumMin += o.Min
		opts[i] = o
	}
	if sumMin > n {
		return nil, fmt.Errorf("consumer: the queues' QueueOptions.Min add up to %d, more than PoolConfig.Concurrency (%d)", sumMin, n)
	}
	if size, ok := clientPoolSize(p.rdb); ok {
		if g := len(readGroups(p.rdb, qs)); size < 2*g {
			return nil, fmt.Errorf("consumer: the Redis client's PoolSize (%d) must be at least twice the number of read groups (%d): each holds a connection for its blocking read", size, g)
		}
	}
	return opts, nil
}

// readGroups returns the queues grouped by the one blocking read that
// serves them (see shared.go), in the order of their first queue.
func readGroups(rdb redis.UniversalClient, qs []*Queue) [][]*Queue {
	var groups [][]*Queue
	at := make(map[string]int, len(qs))
	for _, q := range qs {
		r, err := q.cfg.resolve()
		if err != nil { // Validate has refused it already
			continue
		}
		key, ok := readGroupKey(rdb, r.Stream, r.Group, r.Consumer)
		if i, seen := at[key]; ok && seen {
			groups[i] = append(groups[i], q)
			continue
		}
		if ok {
			at[key] = len(groups)
		}
		groups = append(groups, []*Queue{q})
	}
	return groups
}

// clientPoolSize returns the connection pool size (per node, on Cluster) of
// rdb, when it can tell.
func clientPoolSize(rdb redis.UniversalClient) (int, bool) {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().PoolSize, true
	case *redis.ClusterClient:
		return c.Options().PoolSize, true
	}
	return 0, false
}

// Run runs every queue until ctx is cancelled or [Pool.Shutdown] is called,
// then drains each as [Consumer.Run] does (each queue's Config says its
// drain deadline when ctx is cancelled; Shutdown's ctx is every queue's).
// It checks the whole configuration ([Pool.Validate]) before it touches
// Redis. If a queue's Run returns an error (one that waiting cannot fix,
// such as NOPERM, or abandoned jobs), the pool shuts the other queues down
// too; Run returns every queue's error, joined, each naming its stream. A
// Pool runs once.
func (p *Pool) Run(ctx context.Context) (err error) {
	if p.rdb == nil {
		return errors.New("consumer: nil Redis client")
	}
	opts, err := p.resolve()
	if err != nil {
		return err
	}
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Pool.Run called twice: a Pool runs once; build another with NewPool")
	}
	defer func() {
		p.runErr = err
		close(p.done)
	}()
	p.mu.Lock()
	qs := p.queues[:len(opts)]
	p.budget = newBudget(p.cfg.concurrency(), p.cfg.Strict)
	for i, q := range qs {
		q.c.cfg.Concurrency = opts[i].Max
		q.c.share = p.budget.add(opts[i].Min, opts[i].Weight, opts[i].Priority)
	}
	for _, g := range readGroups(p.rdb, qs) {
		r := g[0].c.cfg // the queues of a group share its group and consumer name
		rr, _ := r.resolve()
		s := newSharedReader(p.rdb, rr.Group, rr.Consumer, len(g))
		defer s.close() // after every queue's Run has returned
		for _, q := range g {
			q.c.reader = s.member()
		}
		p.shared = append(p.shared, s)
	}
	p.mu.Unlock()
	type result struct {
		q   *Queue
		err error
	}
	results := make(chan result, len(qs))
	for _, q := range qs {
		go func() { results <- result{q, q.c.Run(ctx)} }()
	}
	var errs []error
	var stopping sync.WaitGroup
	stopped := false
	stopAll := func(sctx context.Context, timeout bool) {
		if stopped {
			return
		}
		stopped = true
		stopping.Go(func() {
			var wg sync.WaitGroup
			for _, q := range qs {
				wg.Go(func() {
					c := sctx
					if timeout {
						var cancel context.CancelFunc
						c, cancel = context.WithTimeout(context.Background(), q.c.shutdownTimeout())
						defer cancel()
					}
					_ = q.c.Shutdown(c) // its Run reports the outcome
				})
			}
			wg.Wait()
		})
	}
	cancelled := ctx.Done()
	for range qs {
		var r result
	wait:
		for {
			select {
			case r = <-results:
				break wait
			case sctx := <-p.stopReq:
				stopAll(sctx, false)
			case <-cancelled:
				stopped = true // every queue drains on ctx itself
				cancelled = nil
			}
		}
		if r.err != nil {
			errs = append(errs, fmt.Errorf("queue %q: %w", r.q.cfg.Stream, r.err))
		}
		stopAll(nil, true)
	}
	stopping.Wait()
	return errors.Join(errs...)
}

// shutdownTimeout is the drain deadline of c's Config, for a pool that
// stops its queues because one of them returned.
func (c *Consumer) shutdownTimeout() time.Duration {
	if c.cfg.ShutdownTimeout > 0 {
		return c.cfg.ShutdownTimeout
	}
	return DefaultShutdownTimeout
}

// Shutdown stops a running pool: every queue stops reading at once and
// waits for its running handlers until ctx is done, then cancels their
// contexts with cause [ErrShutdown]. It returns when Run has returned, with
// Run's error, or with ctx's error if Run has not returned shortly after
// the deadline. Called before Run, it returns nil at once, and Run stops
// as soon as it has started.
func (p *Pool) Shutdown(ctx context.Context) error {
	select {
	case p.stopReq <- ctx:
	default:
	}
	if !p.started.Load() {
		return nil
	}
	select {
	case <-p.done:
		return p.runErr
	case <-ctx.Done():
	}
	select {
	case <-p.done:
		return p.runErr
	case <-time.After(time.Second):
		return fmt.Errorf("consumer: pool shutdown: %w", ctx.Err())
	}
}

// PoolHealth is a snapshot of a pool's state, from [Pool.Health].
type PoolHealth struct {
	// Ready: every queue is Ready (see [Health.Ready]).
	Ready bool `json:"ready"`
	// Live: no queue's Run has returned.
	Live bool `json:"live"`
	// Problem names the first queue that is not ready, and why; "" when
	// all are.
	Problem string `json:"problem,omitempty"`
	// Queues holds each queue's health, in the order they were added.
	Queues []QueueHealth `json:"queues"`
}

// QueueHealth is one queue's part of [PoolHealth].
type QueueHealth struct {
	// Stream and Group name the queue.
	Stream string `json:"stream"`
	Group  string `json:"group"`
	// Health is the queue's consumer's [Consumer.Health].
	Health
	// Running is the number of the pool's slots the queue holds (jobs
	// running); Waiting the number of its jobs waiting for one.
	Running int `json:"running"`
	Waiting int `json:"waiting"`
}

// Health returns the pool's state and every queue's. It asks Redis
// nothing (see [Consumer.Health]).
func (p *Pool) Health() PoolHealth {
	p.mu.Lock()
	qs := p.snapshotLocked()
	shares := make([]*share, len(qs))
	for i, q := range qs {
		shares[i] = q.c.share
	}
	p.mu.Unlock()
	h := PoolHealth{Ready: len(qs) > 0, Live: len(qs) > 0}
	if len(qs) == 0 {
		h.Problem = "no queue: call Pool.Add"
	}
	// Every queue's slots read at one moment (the pool's queues share one
	// budget), so that Running adds up to no more than the budget holds.
	used := make([][2]int, len(qs))
	var locked *budget
	for i, s := range shares {
		if s == nil {
			continue
		}
		if s.b != locked {
			if locked != nil {
				locked.mu.Unlock()
			}
			locked = s.b
			locked.mu.Lock()
		}
		used[i] = [2]int{s.used, len(s.waiters)}
	}
	if locked != nil {
		locked.mu.Unlock()
	}
	for i, q := range qs {
		qh := QueueHealth{Stream: q.cfg.Stream, Group: q.cfg.Group, Health: q.c.Health()}
		qh.Running, qh.Waiting = used[i][0], used[i][1]
		if !qh.Ready && h.Ready {
			h.Ready = false
			h.Problem = fmt.Sprintf("queue %q: %s", qh.Stream, qh.Problem)
		}
		h.Live = h.Live && qh.Live
		h.Queues = append(h.Queues, qh)
	}
	return h
}

// ReadyHandler serves the pool's [PoolHealth] as JSON, with status 200 when
// every queue is Ready and 503 otherwise: a Kubernetes readinessProbe.
func (p *Pool) ReadyHandler() http.Handler {
	return p.healthHandler(func(h PoolHealth) bool { return h.Ready })
}

// LiveHandler serves the pool's [PoolHealth] as JSON, with status 200 while
// every queue is Live and 503 after: a Kubernetes livenessProbe.
func (p *Pool) LiveHandler() http.Handler {
	return p.healthHandler(func(h PoolHealth) bool { return h.Live })
}

func (p *Pool) healthHandler(ok func(PoolHealth) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := p.Health()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok(h) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
}
