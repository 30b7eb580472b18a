package middleware_test

// Outside attacks on the promises of middleware.Lock, middleware.Idempotency
// and package lockx (README "Locks and idempotency", "Failure policy"),
// written from the documentation only, against real Redis.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func a21Consumer(rdb redis.UniversalClient, name, consumerName string, h consumer.Handler, mw ...consumer.Middleware) *consumer.Consumer {
	return consumer.New(rdb, consumer.Config{
		Stream:            name,
		Group:             "g",
		Consumer:          consumerName,
		VisibilityTimeout: 10 * time.Second,
		Block:             100 * time.Millisecond,
		PromoteInterval:   20 * time.Millisecond,
		SweepInterval:     100 * time.Millisecond,
		MaxAttempts:       1000,
		Backoff:           consumer.Backoff{Base: 30 * time.Millisecond, Cap: 60 * time.Millisecond},
		Concurrency:       8,
	}).Use(mw...).Handle(h)
}

func a21Run(t *testing.T, c *consumer.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func a21Enqueue(t *testing.T, rdb redis.UniversalClient, name string, jobs ...*stream.Job) {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	if _, err := p.EnqueueBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
}

func a21Job(t *testing.T, lockKey, idemKey string) *stream.Job {
	t.Helper()
	j, err := stream.NewJSONJob("a21", map[string]string{"k": lockKey})
	if err != nil {
		t.Fatal(err)
	}
	j.LockKey, j.IdempotencyKey = lockKey, idemKey
	return j
}

// Promise: a job whose lock is held elsewhere is snoozed, not failed, and
// counts no attempt; with Idempotency inside Lock (fused), a job that did not
// get its lock does not begin (take) the idempotency record either.
// Catches: a conflict turned into a retry (Attempt > 0, LastError set,
// Stats.Retried), a dead letter, a handler run without the lock, or a fused
// script that begins the record before finding the lock held (the record then
// blocks the key, or the job runs later as "in progress elsewhere").
func TestAttack21GuardConflictSnoozesNoAttempt(t *testing.T) {
	for _, withIdem := range []bool{false, true} {
		t.Run(fmt.Sprintf("idem=%v", withIdem), func(t *testing.T) {
			rdb := redistest.Shared(t)
			name := redistest.Name(t)
			keys, _ := stream.KeysFor(name)
			t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}:*"); rdb.Del(context.Background(), name) })

			holder, err := lockx.New(rdb, lockx.Config{Prefix: keys.Lock}).TryAcquire(context.Background(), "acct-1", 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var conflicts atomic.Int64
			type seen struct {
				attempt int
				lastErr string
				fence   int64
			}
			ran := make(chan seen, 4)
			h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				l, ok := lockx.FromContext(ctx)
				var f int64
				if ok {
					f = l.Fence()
				}
				ran <- seen{job.Attempt, job.LastError, f}
				return nil
			})
			mw := []consumer.Middleware{middleware.Lock(rdb, middleware.LockConfig{
				TTL: 2 * time.Second, ConflictDelay: 20 * time.Millisecond,
				OnConflict: func(string) { conflicts.Add(1) },
			})}
			if withIdem {
				mw = append(mw, middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{Lease: 2 * time.Second}))
			}
			c := a21Consumer(rdb, name, "c1", h, mw...)
			stop := a21Run(t, c)
			a21Enqueue(t, rdb, name, a21Job(t, "acct-1", "op-1"))

			poll.Until(t, 30*time.Second, func() (bool, string) {
				return conflicts.Load() >= 5, fmt.Sprintf("%d conflicts", conflicts.Load())
			})
			select {
			case s := <-ran:
				t.Fatalf("handler ran while the lock was held elsewhere: %+v", s)
			default:
			}
			if withIdem {
				// The record must not have been begun by a job that did not get its lock.
				if n, _ := rdb.Exists(context.Background(), keys.Idem+"op-1").Result(); n != 0 {
					v, _ := rdb.Get(context.Background(), keys.Idem+"op-1").Result()
					t.Errorf("a job snoozed on its lock left the idempotency record %q", v)
				}
			}
			if err := holder.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			var s seen
			select {
			case s = <-ran:
			case <-time.After(60 * time.Second):
				t.Fatal("job never ran after the lock was released")
			}
			if s.attempt != 0 || s.lastErr != "" {
				t.Errorf("snoozes counted as attempts: attempt=%d last_error=%q", s.attempt, s.lastErr)
			}
			if s.fence <= holder.Fence() {
				t.Errorf("fence %d of the next holder not above the released holder's %d", s.fence, holder.Fence())
			}
			poll.Until(t, 20*time.Second, func() (bool, string) {
				st := c.Stats()
				return st.Acked == 1, fmt.Sprintf("%+v", st)
			})
			stop()
			st := c.Stats()
			if st.Retried != 0 || st.DeadLettered != 0 || st.Snoozed == 0 {
				t.Errorf("stats %+v: want Retried 0, DeadLettered 0, Snoozed > 0", st)
			}
		})
	}
}

// Promise: a lock released by a finished job can be taken at once by the next
// job of the same key in the same process (the tombstone holds the fence,
// not the lock). Catches: a released lock that still blocks for its TTL
// (conflict snoozes), or an unreleased one.
func TestAttack21GuardReleasedLockTakenAtOnce(t *testing.T) {
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}:*"); rdb.Del(context.Background(), name) })
	var conflicts atomic.Int64
	done := make(chan int64, 1)
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		l, _ := lockx.FromContext(ctx)
		done <- l.Fence()
		return nil
	})
	c := a21Consumer(rdb, name, "c1", h,
		middleware.Lock(rdb, middleware.LockConfig{TTL: time.Minute, ConflictDelay: 10 * time.Second,
			OnConflict: func(string) { conflicts.Add(1) }}),
		middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{}))
	a21Run(t, c)
	var last int64
	for i := 0; i < 8; i++ {
		a21Enqueue(t, rdb, name, a21Job(t, "acct", fmt.Sprintf("op-%d", i)))
		select {
		case f := <-done:
			if f <= last {
				t.Errorf("job %d: fence %d not above %d", i, f, last)
			}
			last = f
		case <-time.After(8 * time.Second): // ConflictDelay is 10 s: a conflict shows as a wait
			t.Fatalf("job %d of the key did not run promptly after the previous one finished (conflicts %d)", i, conflicts.Load())
		}
		poll.Until(t, 20*time.Second, func() (bool, string) {
			return c.Stats().Acked == uint64(i+1), fmt.Sprintf("%+v", c.Stats())
		})
	}
	if conflicts.Load() != 0 {
		t.Errorf("%d conflicts on a lock released by the previous job", conflicts.Load())
	}
}

// Promise (lockx): fences strictly increase per key while a key holds its
// fence (held, or released less than a TTL ago), and after the key is gone
// (tombstone or unreleased lock expired) and after a Redis restart without
// persistence; and two holders never hold one key at once. Many keys,
// concurrent contenders recording their fence while holding the lock: the
// sequence recorded under exclusion must be strictly increasing.
// Catches: fences reused within a microsecond, a fence that drops after
// release/expiry/restart, or two concurrent holders.
func TestAttack21GuardFencesIncrease(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	lc := lockx.New(rdb, lockx.Config{})
	ctx := context.Background()
	const nkeys = 12
	var mu sync.Mutex
	seq := make(map[string][]int64)
	held := make(map[string]int)
	var overlaps atomic.Int64
	// Contenders record their fence while holding the lock; with a TTL of a
	// few milliseconds a descheduled holder's lock can expire before it
	// records, so the short-TTL rounds run one goroutine per key (the
	// acquisition order is then program order), 40 acquisitions each.
	round := func(phase string, ttl time.Duration, after func(l *lockx.Lock)) {
		var wg sync.WaitGroup
		gs, per := 4, 10
		if ttl < time.Second {
			gs, per = 1, 40
		}
		for k := 0; k < nkeys; k++ {
			key := fmt.Sprintf("k%d", k)
			for g := 0; g < gs; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < per; n++ {
						l, err := lc.Acquire(ctx, key, ttl, lockx.AcquireOptions{Backoff: func(int) time.Duration { return time.Millisecond }, Wait: 30 * time.Second})
						if err != nil {
							t.Errorf("%s: acquire %s: %v", phase, key, err)
							return
						}
						mu.Lock()
						held[key]++
						if held[key] > 1 {
							overlaps.Add(1)
						}
						seq[key] = append(seq[key], l.Fence())
						held[key]--
						mu.Unlock()
						after(l)
					}
				}()
			}
		}
		wg.Wait()
	}
	// Released at once: the next holder takes the key while it holds the fence.
	round("release", 5*time.Second, func(l *lockx.Lock) {
		if err := l.Release(ctx); err != nil {
			t.Errorf("release: %v", err)
		}
	})
	// Unreleased: each lock expires (TTL 5 ms) and the next takes a gone key.
	round("expire", 5*time.Millisecond, func(l *lockx.Lock) {})
	// Released with a tiny TTL: the tombstone expires before the next acquisition.
	round("tombstone", 3*time.Millisecond, func(l *lockx.Lock) {
		_ = l.Release(ctx)
		rk, _ := lc.RedisKey(l.Key())
		poll.Until(t, 10*time.Second, func() (bool, string) {
			n, _ := rdb.Exists(ctx, rk).Result()
			return n == 0, "tombstone still there"
		})
	})
	// Redis restarted without persistence: every key lost.
	srv.Kill9()
	srv.Restart()
	round("restart", 5*time.Second, func(l *lockx.Lock) { _ = l.Release(ctx) })
	if overlaps.Load() != 0 {
		t.Errorf("%d times two holders held one key at once", overlaps.Load())
	}
	for k, s := range seq {
		if len(s) != 4*4*10 {
			t.Errorf("%s: %d acquisitions, want %d", k, len(s), 160)
		}
		for i := 1; i < len(s); i++ {
			if s[i] <= s[i-1] {
				t.Errorf("%s: fence #%d %d not above #%d %d", k, i, s[i], i-1, s[i-1])
				break
			}
		}
	}
	// Nothing left beyond the tombstones of the last round (TTL 5 s at most).
	ks, _ := rdb.Keys(ctx, "*").Result()
	for _, k := range ks {
		ttl, _ := rdb.PTTL(ctx, k).Result()
		if ttl < 0 || ttl > 5*time.Second {
			t.Errorf("key %s left with TTL %v", k, ttl)
		}
	}
	if len(ks) > nkeys {
		t.Errorf("%d keys for %d lock keys: %v", len(ks), nkeys, ks)
	}
}

// Promise: if a renewal finds the lock gone (taken by another process),
// the handler's context is cancelled with a cause matching lockx.ErrLockLost.
// Simulated in process: the test deletes the lock key and takes it with
// another client. Catches: a watchdog that does not notice, or a cause that
// is not ErrLockLost. With Idempotency inside too (the fused path).
func TestAttack21GuardLossCancelsHandler(t *testing.T) {
	for _, withIdem := range []bool{false, true} {
		t.Run(fmt.Sprintf("idem=%v", withIdem), func(t *testing.T) {
			rdb := redistest.Shared(t)
			other := redistest.Shared(t)
			name := redistest.Name(t)
			keys, _ := stream.KeysFor(name)
			t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}:*"); rdb.Del(context.Background(), name) })
			started := make(chan int64, 1)
			cause := make(chan error, 1)
			h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				l, _ := lockx.FromContext(ctx)
				started <- l.Fence()
				select {
				case <-ctx.Done():
					cause <- context.Cause(ctx)
					return context.Cause(ctx)
				case <-time.After(60 * time.Second):
					cause <- nil
					return nil
				}
			})
			mw := []consumer.Middleware{middleware.Lock(rdb, middleware.LockConfig{TTL: 300 * time.Millisecond, ConflictDelay: 20 * time.Millisecond})}
			if withIdem {
				mw = append(mw, middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{Lease: 10 * time.Second}))
			}
			c := a21Consumer(rdb, name, "c1", h, mw...)
			a21Run(t, c)
			a21Enqueue(t, rdb, name, a21Job(t, "acct", "op"))
			var f1 int64
			select {
			case f1 = <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("job did not start")
			}
			rk := keys.Lock + "{acct}"
			if err := other.Del(context.Background(), rk).Err(); err != nil {
				t.Fatal(err)
			}
			l2, err := lockx.New(other, lockx.Config{Prefix: keys.Lock}).TryAcquire(context.Background(), "acct", time.Minute)
			if err != nil {
				t.Fatalf("take the deleted lock: %v", err)
			}
			defer l2.Release(context.Background())
			_ = f1
			select {
			case err := <-cause:
				if !errors.Is(err, lockx.ErrLockLost) {
					t.Errorf("handler context ended with cause %v, want lockx.ErrLockLost", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the loss of the lock was not noticed within 30 s (TTL 300 ms)")
			}
		})
	}
}

// Promise: with Redis full (maxmemory, noeviction) no job runs without its
// lock, no effect of a completed record happens twice, nothing is lost once
// memory is freed, and no lock or record is left without a TTL. Phase A:
// Redis full before the jobs start (no handler may run while it is full: the
// lock cannot be taken). Phase B: Redis fills while handlers run (their
// completion and release fail; the docs allow the operation to run again
// then, so at most 2 effects); after memory is freed, every key completes.
// Catches: a handler run unlocked when the lock script is refused, a job lost
// or dead-lettered, a lock/record left forever, a key wedged.
func TestAttack21GuardRedisFull(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "12mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	ctx := context.Background()
	name := "a21full"
	keys, _ := stream.KeysFor(name)
	var full atomic.Bool
	var mu sync.Mutex
	effects := map[string]int{}
	var ranWhileFull atomic.Int64
	gate := make(chan struct{})
	var gateOnce sync.Once
	var inB atomic.Bool
	var runningB atomic.Int64
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if full.Load() && !inB.Load() {
			ranWhileFull.Add(1)
		}
		if _, ok := lockx.FromContext(ctx); !ok {
			t.Errorf("job %s ran without a lock in its context", job.IdempotencyKey)
		}
		if inB.Load() && strings.HasPrefix(job.IdempotencyKey, "b-") {
			runningB.Add(1)
			<-gate
		}
		mu.Lock()
		effects[job.IdempotencyKey]++
		mu.Unlock()
		return nil
	})
	fill := func() {
		big := strings.Repeat("x", 64<<10)
		for i := 0; ; i++ {
			if err := rdb.Set(ctx, fmt.Sprintf("junk:%d", i), big, 0).Err(); err != nil {
				if strings.Contains(err.Error(), "OOM") {
					full.Store(true)
					return
				}
				t.Fatal(err)
			}
		}
	}
	free := func() {
		full.Store(false)
		redistest.DeleteKeys(rdb, "junk:*")
	}
	var jobsA, jobsB []*stream.Job
	for i := 0; i < 30; i++ {
		jobsA = append(jobsA, a21Job(t, fmt.Sprintf("acct-%d", i%5), fmt.Sprintf("a-%d", i)))
		jobsB = append(jobsB, a21Job(t, fmt.Sprintf("acct-%d", i%5+10), fmt.Sprintf("b-%d", i)))
	}
	c := a21Consumer(rdb, name, "c1", h,
		middleware.Lock(rdb, middleware.LockConfig{TTL: 900 * time.Millisecond, ConflictDelay: 30 * time.Millisecond}),
		middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{Lease: 900 * time.Millisecond, InProgressDelay: 50 * time.Millisecond}),
		middleware.Retry(middleware.RetryConfig{}))
	// Phase A.
	a21Enqueue(t, rdb, name, jobsA...)
	fill()
	stop := a21Run(t, c)
	// Observe a while: the consumer reads and tries, nothing may run.
	poll.Until(t, 30*time.Second, func() (bool, string) {
		st := c.Stats()
		return st.Retried+st.Snoozed+st.ReadErrors >= 5 || ranWhileFull.Load() > 0, fmt.Sprintf("%+v", st)
	})
	time.Sleep(time.Second)
	t.Logf("phase A, Redis full: stats %+v", c.Stats())
	if n := ranWhileFull.Load(); n != 0 {
		t.Errorf("phase A: %d handlers ran while Redis was full (the lock cannot have been taken)", n)
	}
	free()
	poll.Until(t, 60*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for k := range effects {
			if strings.HasPrefix(k, "a-") {
				n++
			}
		}
		return n == 30, fmt.Sprintf("phase A: %d of 30 keys ran; stats %+v", n, c.Stats())
	})
	// Phase B.
	inB.Store(true)
	a21Enqueue(t, rdb, name, jobsB...)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		return runningB.Load() >= 5, fmt.Sprintf("%d B handlers running", runningB.Load())
	})
	fill()
	gateOnce.Do(func() { close(gate) })
	time.Sleep(2 * time.Second) // let the handlers finish against a full Redis
	free()
	poll.Until(t, 90*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for k := range effects {
			if strings.HasPrefix(k, "b-") {
				n++
			}
		}
		xl, _ := rdb.XLen(ctx, name).Result()
		pe, _ := rdb.XPending(ctx, name, "g").Result()
		dl, _ := rdb.ZCard(ctx, keys.Delayed).Result()
		pc := int64(-1)
		if pe != nil {
			pc = pe.Count
		}
		return n == 30 && pc == 0 && dl == 0, fmt.Sprintf("phase B: %d of 30 keys ran; pending %d delayed %d xlen %d; stats %+v", n, pc, dl, xl, c.Stats())
	})
	stop()
	t.Logf("after phase B: stats %+v", c.Stats())
	mu.Lock()
	for k, n := range effects {
		if n > 1 {
			t.Logf("%s: %d effects (completion refused while full)", k, n)
		}
		if strings.HasPrefix(k, "a-") && n != 1 {
			t.Errorf("%s: %d effects (Redis was full before it started: want 1)", k, n)
		}
		if n > 2 {
			t.Errorf("%s: %d effects", k, n)
		}
	}
	mu.Unlock()
	if st := c.Stats(); st.DeadLettered != 0 || st.Lost != 0 {
		t.Errorf("stats %+v: dead or lost jobs", st)
	}
	ks, _ := rdb.Keys(ctx, "{"+name+"}:*").Result()
	for _, k := range ks {
		ttl, _ := rdb.PTTL(ctx, k).Result()
		v, _ := rdb.Get(ctx, k).Result()
		if strings.HasPrefix(k, keys.Idem) && !strings.HasPrefix(v, "c") {
			t.Errorf("record %s = %q after all jobs finished", k, v)
		}
		if ttl == -1 && (strings.HasPrefix(k, keys.Idem) || strings.HasPrefix(k, keys.Lock)) {
			t.Errorf("key %s left without a TTL", k)
		}
	}
}

// Promise: a key in progress elsewhere is snoozed (no attempt counted), and
// once the first job completes the record, the second is acknowledged without
// running (OnHit). Two jobs of one idempotency key under different lock keys,
// so only the record keeps them apart. Catches: a second run of a running
// operation, a retry counted, a hit not recognised after completion.
func TestAttack21GuardInProgressSnoozedThenHit(t *testing.T) {
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}:*"); rdb.Del(context.Background(), name) })
	var runs, hits atomic.Int64
	gate := make(chan struct{})
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if runs.Add(1) == 1 {
			<-gate
		}
		return nil
	})
	c := a21Consumer(rdb, name, "c1", h,
		middleware.Lock(rdb, middleware.LockConfig{TTL: 2 * time.Second}),
		middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{
			Lease: 2 * time.Second, InProgressDelay: 20 * time.Millisecond,
			OnHit: func(context.Context, *stream.Job, []byte) { hits.Add(1) }}))
	stop := a21Run(t, c)
	a21Enqueue(t, rdb, name, a21Job(t, "acct-a", "op"))
	poll.Until(t, 30*time.Second, func() (bool, string) { return runs.Load() == 1, "first job not running" })
	a21Enqueue(t, rdb, name, a21Job(t, "acct-b", "op"))
	poll.Until(t, 30*time.Second, func() (bool, string) {
		return c.Stats().Snoozed >= 3, fmt.Sprintf("%+v", c.Stats())
	})
	if runs.Load() != 1 {
		t.Errorf("the operation ran %d times while in progress", runs.Load())
	}
	close(gate)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		return c.Stats().Acked == 2, fmt.Sprintf("%+v hits %d", c.Stats(), hits.Load())
	})
	stop()
	if runs.Load() != 1 || hits.Load() != 1 {
		t.Errorf("runs %d hits %d: want 1 and 1", runs.Load(), hits.Load())
	}
	if st := c.Stats(); st.Retried != 0 || st.DeadLettered != 0 {
		t.Errorf("stats %+v: an in-progress key counted as a failure", st)
	}
}

// Promise: when Redis loses a held lock (a restart without persistence),
// renewal finds it gone and the handler's context is cancelled (lock lost);
// the next holder's fence is above the lost one's (Redis TIME, clock not
// behind). Catches: a watchdog that re-creates a lost lock by renewing it,
// a loss not noticed after a restart, a fence that restarts low.
func TestAttack21GuardRedisRestartLosesLock(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	name := "a21restart"
	keys, _ := stream.KeysFor(name)
	started := make(chan int64, 4)
	cause := make(chan error, 4)
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		l, _ := lockx.FromContext(ctx)
		started <- l.Fence()
		if job.IdempotencyKey != "op-1" {
			return nil
		}
		select {
		case <-ctx.Done():
			cause <- context.Cause(ctx)
			return context.Cause(ctx)
		case <-time.After(60 * time.Second):
			cause <- nil
			return nil
		}
	})
	c := a21Consumer(rdb, name, "c1", h, middleware.Lock(rdb, middleware.LockConfig{TTL: 600 * time.Millisecond, ConflictDelay: 20 * time.Millisecond}))
	a21Run(t, c)
	a21Enqueue(t, rdb, name, a21Job(t, "acct", "op-1"))
	var f1 int64
	select {
	case f1 = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("job did not start")
	}
	srv.Kill9()
	srv.Restart()
	select {
	case err := <-cause:
		if !errors.Is(err, lockx.ErrLockLost) {
			t.Errorf("handler context ended with cause %v, want lockx.ErrLockLost", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the loss of the lock in a Redis restart was not noticed")
	}
	if v, err := rdb.Get(context.Background(), keys.Lock+"{acct}").Result(); err == nil && strings.Contains(v, " ") {
		t.Logf("lock key after the loss: %q", v)
	}
	// The restarted Redis lost the stream too: a new job of the key.
	a21Enqueue(t, rdb, name, a21Job(t, "acct", "op-2"))
	select {
	case f2 := <-started:
		if f2 <= f1 {
			t.Errorf("fence after the restart %d not above the lost lock's %d", f2, f1)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("job after the restart did not run")
	}
}
