package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/leakcheck"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// lockSetup returns a lockx Client with a key prefix of the test's own on
// the shared Redis (deleted at the end of the test), the Redis client and
// the prefix.
func lockSetup(t *testing.T) (*lockx.Client, *redis.Client, string) {
	t.Helper()
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb)
	return lockx.New(rdb, lockx.Config{Prefix: prefix}), rdb, prefix
}

// lockFree reports whether nobody holds key's lock, taking and releasing it.
func lockFree(t *testing.T, locks *lockx.Client, key string) bool {
	t.Helper()
	l, err := locks.TryAcquire(context.Background(), key, time.Minute)
	if errors.Is(err, lockx.ErrNotObtained) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return true
}

func TestLock_conflictSnoozes(t *testing.T) {
	t.Parallel()
	locks, rdb, prefix := lockSetup(t)
	held, err := locks.TryAcquire(t.Context(), "customer:7", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	var conflicts []string
	var ran atomic.Bool
	h := middleware.Lock(rdb, middleware.LockConfig{
		Prefix:        prefix,
		ConflictDelay: 200 * time.Millisecond,
		OnConflict:    func(key string) { conflicts = append(conflicts, key) },
	})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran.Store(true)
		return nil
	}))
	for range 20 {
		err := h.Process(t.Context(), &stream.Job{Type: "sync", LockKey: "customer:7"})
		var o *consumer.Outcome
		if !errors.As(err, &o) || o.CountsAttempt() || o.IsDead() {
			t.Fatalf("Process: %v; want a snooze that counts no attempt", err)
		}
		if d := o.Delay(); d < 100*time.Millisecond || d > 300*time.Millisecond {
			t.Errorf("snoozed for %v, want 200ms ±50%%", d)
		}
	}
	if ran.Load() {
		t.Error("the handler ran while the lock was held elsewhere")
	}
	if len(conflicts) != 20 || conflicts[0] != "customer:7" {
		t.Errorf("OnConflict calls: %v, want 20 × customer:7", conflicts)
	}
	if err := held.Extend(t.Context(), time.Minute); err != nil {
		t.Errorf("the holder's lock was disturbed: %v", err)
	}
}

// The handler runs holding the lock, which is in its context with its
// fencing token; the lock is released when it returns. Key can come from a
// function; a job without a key runs without a lock.
func TestLock_holdsLock(t *testing.T) {
	t.Parallel()
	locks, rdb, prefix := lockSetup(t)
	var fences []int64
	h := middleware.Lock(rdb, middleware.LockConfig{
		Prefix: prefix,
		Key: func(job *stream.Job) string {
			if job.Type == "nolock" {
				return ""
			}
			return "acct:" + job.ID
		},
	})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		l, ok := lockx.FromContext(ctx)
		if job.Type == "nolock" {
			if ok {
				t.Errorf("a job without a key has lock %q", l.Key())
			}
			return nil
		}
		if !ok {
			t.Fatal("no lock in the handler's context")
		}
		if l.Key() != "acct:1" {
			t.Errorf("lock key %q, want acct:1", l.Key())
		}
		if lockFree(t, locks, "acct:1") {
			t.Error("the lock is free while the handler runs")
		}
		fences = append(fences, l.Fence())
		return nil
	}))
	for range 3 {
		if err := h.Process(t.Context(), &stream.Job{ID: "1", Type: "sync"}); err != nil {
			t.Fatal(err)
		}
		if !lockFree(t, locks, "acct:1") {
			t.Error("the lock is held after the handler returned")
		}
	}
	// Each run and each lockFree probe is an acquisition.
	if len(fences) != 3 || fences[0] < 1 || fences[1] <= fences[0] || fences[2] <= fences[1] {
		t.Errorf("fences %v, want growing with every acquisition", fences)
	}
	if err := h.Process(t.Context(), &stream.Job{ID: "2", Type: "nolock"}); err != nil {
		t.Fatal(err)
	}
}

// A lock lost while the handler runs (here deleted behind its back) cancels
// the handler's context with a cause matching lockx.ErrLockLost and naming
// the key.
func TestLock_lostCancels(t *testing.T) {
	t.Parallel()
	_, rdb, prefix := lockSetup(t)
	h := middleware.Lock(rdb, middleware.LockConfig{Prefix: prefix, TTL: 150 * time.Millisecond})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if err := rdb.Del(ctx, prefix+"{"+job.LockKey+"}").Err(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(3 * time.Second):
				return errors.New("the handler's context was not cancelled")
			}
		}))
	err := h.Process(t.Context(), &stream.Job{LockKey: "k1"})
	if !errors.Is(err, lockx.ErrLockLost) || !strings.Contains(err.Error(), `"k1"`) {
		t.Fatalf("handler ended with %v; want a cause matching lockx.ErrLockLost naming k1", err)
	}
}

// A lock is renewed while its handler runs five times its TTL. A run in
// which this process or Redis went TTL/3 or longer without a reply (a busy
// machine), or the handler could not probe for three TTLs, checked nothing
// and is repeated with a wider TTL.
func TestLock_renews(t *testing.T) {
	t.Parallel()
	locks, rdb, prefix := lockSetup(t)
	redistest.Widen(t, "ttl", 100*time.Millisecond, func(t *testing.T, ttl time.Duration) time.Duration {
		stalls := redistest.WatchStalls(rdb, 2*redistest.StallInterval)
		defer stalls.Stop()
		var first, last time.Time // the first and the latest probe that found the lock held
		h := middleware.Lock(rdb, middleware.LockConfig{Prefix: prefix, TTL: ttl})(
			consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				end := time.Now().Add(5 * ttl)
				for time.Now().Before(end) {
					if ctx.Err() != nil {
						return context.Cause(ctx)
					}
					at := time.Now()
					if first.IsZero() {
						first = at
					}
					if lockFree(t, locks, job.LockKey) {
						err := fmt.Errorf("the lock expired %v after the first probe (%v after the last that found it held)", at.Sub(first), at.Sub(last))
						select { // did the watchdog hear of the loss?
						case <-ctx.Done():
						case <-time.After(ttl):
						}
						return fmt.Errorf("%w; then, within the TTL, the handler's context: %v", err, context.Cause(ctx))
					}
					last = at
					time.Sleep(10 * time.Millisecond)
				}
				return nil
			}))
		err := h.Process(t.Context(), &stream.Job{LockKey: "k-" + ttl.String()})
		stall := stalls.Longest()
		switch {
		case err != nil && stall >= ttl/3:
			t.Logf("the run checked nothing: this process or Redis went %v without a reply, TTL/3 = %v (%v)", stall, ttl/3, err)
			return 4 * stall
		case err != nil:
			t.Fatalf("%v (the longest stall was %v, under TTL/3)", err, stall)
		case last.Sub(first) < 3*ttl:
			t.Logf("the run checked nothing: the probes covered only %v of the handler's %v", last.Sub(first), 5*ttl)
			return 2 * ttl
		}
		return 0
	})
}

// The lock is released whatever the handler does: returns an error, returns
// an outcome, panics (the panic goes on after the release). Not parallel,
// so that no renewal goroutine of another test is running when it checks
// that none is left.
func TestLock_releasesAlways(t *testing.T) {
	locks, rdb, prefix := lockSetup(t)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"error", func() error { return boom }},
		{"outcome", func() error { return consumer.Retry(time.Second, boom) }},
		{"panic", func() error { panic(boom) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hctx context.Context
			h := middleware.Lock(rdb, middleware.LockConfig{Prefix: prefix, TTL: 150 * time.Millisecond})(
				consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
					hctx = ctx
					return tc.do()
				}))
			var recovered any
			var err error
			func() {
				defer func() { recovered = recover() }()
				err = h.Process(t.Context(), &stream.Job{LockKey: "k"})
			}()
			if tc.name == "panic" {
				if recovered != boom {
					t.Errorf("recovered %v, want the handler's panic", recovered)
				}
			} else if !errors.Is(err, boom) {
				t.Errorf("Process: %v, want the handler's error", err)
			}
			if !lockFree(t, locks, "k") {
				t.Error("the lock is still held")
			}
			if hctx.Err() == nil {
				t.Error("the handler's context is still live after it returned")
			}
		})
	}
	if leaked := leakcheck.Leaked(time.Second, "pelican/lockx.", "pelican/middleware.Lock"); leaked != "" {
		t.Errorf("goroutines left running:\n%s", leaked)
	}
}

// When Redis cannot be asked, the job fails with an error that is not an
// outcome: a failure, retried by policy.
func TestLock_redisDown(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	h := middleware.Lock(rdb, middleware.LockConfig{})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			t.Error("the handler ran without its lock")
			return nil
		}))
	err := h.Process(t.Context(), &stream.Job{Stream: "orders", LockKey: "k"})
	var o *consumer.Outcome
	if err == nil || errors.As(err, &o) || !strings.Contains(err.Error(), `lock "k"`) {
		t.Errorf("Process: %v; want a plain error naming the lock", err)
	}
}

// By default each queue locks in its own namespace, in its stream's slot:
// a key held in one queue does not stop the same key in another queue,
// while the same queue still excludes it.
func TestLock_perQueue(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	payments, orders := redistest.Name(t), "{"+redistest.Name(t)+"}:orders"
	t.Cleanup(func() {
		redistest.DeleteKeys(rdb, "{"+payments+"}:*")
		redistest.DeleteKeys(rdb, orders+":*")
	})
	var inner error
	var h consumer.Handler
	h = middleware.Lock(rdb, middleware.LockConfig{})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if job.Stream == payments {
			l, _ := lockx.FromContext(ctx)
			if n := rdb.Exists(ctx, "{"+payments+"}:lock:{invoice-1}").Val(); n != 1 {
				t.Errorf("payments' lock is not at {%s}:lock:{invoice-1}", payments)
			}
			// The same key, held here: another queue runs, this one snoozes.
			inner = h.Process(ctx, &stream.Job{Stream: orders, LockKey: l.Key()})
			var o *consumer.Outcome
			if err := h.Process(ctx, &stream.Job{Stream: payments, LockKey: l.Key()}); !errors.As(err, &o) || o.CountsAttempt() {
				t.Errorf("the same key in the same queue: %v, want a snooze", err)
			}
			return nil
		}
		if n := rdb.Exists(ctx, orders+":lock:{invoice-1}").Val(); n != 1 {
			t.Errorf("orders' lock is not at %s:lock:{invoice-1}", orders)
		}
		return nil
	}))
	if err := h.Process(t.Context(), &stream.Job{Stream: payments, LockKey: "invoice-1"}); err != nil {
		t.Fatal(err)
	}
	if inner != nil {
		t.Errorf("orders' job with the key payments held: %v, want it run", inner)
	}
}

// A lock is one Redis key, so any key locks, even one starting with '}'
// under a prefix without a hash tag (once refused: its fencing counter
// would have hashed elsewhere).
func TestLock_anyKey(t *testing.T) {
	t.Parallel()
	locks, rdb, prefix := lockSetup(t)
	ran := false
	h := middleware.Lock(rdb, middleware.LockConfig{Prefix: prefix})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			_, ran = lockx.FromContext(ctx)
			return nil
		}))
	if err := h.Process(t.Context(), &stream.Job{Stream: "orders", LockKey: "}evil"}); err != nil || !ran {
		t.Fatalf("Process: %v, ran holding the lock: %v", err, ran)
	}
	if !lockFree(t, locks, "}evil") {
		t.Error("the lock is held after the handler returned")
	}
}

// Without a Prefix, a job must name its queue; a Prefix whose braces form
// no hash tag is refused at construction, naming the field.
func TestLock_config(t *testing.T) {
	t.Parallel()
	h := middleware.Lock(nil, middleware.LockConfig{})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		t.Error("the handler ran without its lock")
		return nil
	}))
	if err := h.Process(t.Context(), &stream.Job{LockKey: "k"}); err == nil || !strings.Contains(err.Error(), "job.Stream") {
		t.Errorf("a job without a stream: %v, want an error naming job.Stream", err)
	}
	bad := middleware.LockConfig{Prefix: "a{b"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "LockConfig.Prefix") {
		t.Errorf("Validate = %v, want an error naming LockConfig.Prefix", err)
	}
	err := middleware.Lock(nil, bad)(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })).
		Process(t.Context(), &stream.Job{Stream: "s", LockKey: "k"})
	if err == nil || !strings.Contains(err.Error(), "LockConfig.Prefix") {
		t.Errorf("Process = %v, want an error naming LockConfig.Prefix", err)
	}
}

// Lock fused with Idempotency (same client, same slot): a record lost while
// the handler runs (here deleted behind its back) cancels the handler's
// context with a cause matching idem.ErrNotOwner, as Idempotency alone
// does; the lock and the record share one cancellable context.
func TestLock_fusedRecordLostCancels(t *testing.T) {
	t.Parallel()
	_, q := idemSetup(t)
	rdb := redistest.Shared(t)
	store := idem.NewRedisStore(rdb, idem.RedisConfig{}) // on rdb: fused
	var cause error
	h := middleware.Lock(rdb, middleware.LockConfig{})(
		middleware.Idempotency(store, middleware.IdempotencyConfig{Lease: 150 * time.Millisecond})(
			consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				if _, ok := lockx.FromContext(ctx); !ok {
					return errors.New("no lock in the handler's context")
				}
				if err := rdb.Del(ctx, q.record(job.IdempotencyKey)).Err(); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
				case <-time.After(5 * time.Second):
					cause = errors.New("the handler's context was not cancelled")
				}
				return cause
			})))
	job := q.job("op")
	job.LockKey = "k1"
	_ = h.Process(t.Context(), job)
	if !errors.Is(cause, idem.ErrNotOwner) {
		t.Fatalf("handler's context ended with %v; want a cause matching idem.ErrNotOwner", cause)
	}
}
