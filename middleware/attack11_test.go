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
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func a11Chain(t *testing.T, h consumer.HandlerFunc) (consumer.Handler, string, stream.Keys, *redis.Client) {
	return a11ChainP(t, h, "")
}

func a11ChainP(t *testing.T, h consumer.HandlerFunc, lockPrefix string) (consumer.Handler, string, stream.Keys, *redis.Client) {
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}*") })
	store := idem.NewRedisStore(rdb, idem.RedisConfig{Retention: time.Hour})
	ch := consumer.Chain(h,
		middleware.Lock(rdb, middleware.LockConfig{Prefix: lockPrefix, TTL: 900 * time.Millisecond, ConflictDelay: time.Millisecond}),
		middleware.Idempotency(store, middleware.IdempotencyConfig{InProgressDelay: time.Millisecond}))
	return ch, name, keys, rdb
}

var a11Seq atomic.Int64

func a11Job(name, ik, lk string) *stream.Job {
	n := a11Seq.Add(1)
	return &stream.Job{ID: fmt.Sprintf("j%d", n), Type: "t", Stream: name, Group: "g",
		EntryID: fmt.Sprintf("%d-%d", 1700000000000+n, n), IdempotencyKey: ik, LockKey: lk, AttemptLimit: 5}
}

// runUntilNil delivers the job again (new entry ID, as a redelivery or a
// snoozed re-add would) until the chain returns nil.
func a11RunUntilNil(t *testing.T, h consumer.Handler, mk func() *stream.Job) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := h.Process(context.Background(), mk())
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("never succeeded: last %w", err)
		}
	}
}

// Fused Lock+Idempotency: concurrent deliveries of one operation run it once; jobs of
// one lock key with distinct operations never overlap and each runs once.
func TestAttack11_FusedOnceAndExclusive(t *testing.T) {
	for _, pfx := range []string{"", "a11shared:lock:"} { // fused, then lock in another slot (not fused)
		t.Run("prefix="+pfx, func(t *testing.T) { a11OnceExclusive(t, pfx) })
	}
}

func a11OnceExclusive(t *testing.T, pfx string) {
	var (
		running  atomic.Int32
		overlaps atomic.Int32
		mu       sync.Mutex
		effects  = map[string]int{}
	)
	var h consumer.Handler
	var rdb *redis.Client
	h, name, keys, rdb := a11ChainP(t, func(ctx context.Context, j *stream.Job) error {
		if running.Add(1) != 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		if err := rdb.Ping(ctx).Err(); err != nil { // some work
			return err
		}
		mu.Lock()
		effects[j.IdempotencyKey]++
		mu.Unlock()
		return nil
	}, pfx)
	if pfx != "" {
		keys.Lock = pfx
		t.Cleanup(func() { redistest.DeleteKeys(rdb, pfx+"*") })
	}
	_ = rdb
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for op := 0; op < 6; op++ {
				ik := fmt.Sprintf("op%d", (op+g)%6)
				if err := a11RunUntilNil(t, h, func() *stream.Job { return a11Job(name, ik, "acct") }); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if o := overlaps.Load(); o != 0 {
		t.Fatalf("%d overlapping runs under one lock key", o)
	}
	for op := 0; op < 6; op++ {
		if n := effects[fmt.Sprintf("op%d", op)]; n != 1 {
			t.Fatalf("op%d ran %d times", op, n)
		}
	}
	// nothing left forever
	ctx := context.Background()
	for _, k := range []string{keys.Lock + "{acct}", keys.Idem + "op0"} {
		if rdb.Exists(ctx, k).Val() == 1 && rdb.PTTL(ctx, k).Val() < 0 {
			t.Fatalf("key %s has no TTL", k)
		}
	}
}

// Losing the lock mid-handler cancels the handler with ErrLockLost, and the operation
// is not recorded as done: the next delivery runs it again, once.
func TestAttack11_FusedLockLossCancels(t *testing.T) {
	started := make(chan struct{}, 1)
	var cause atomic.Value
	var h2runs atomic.Int32
	phase := atomic.Int32{}
	h, name, keys, rdb := a11Chain(t, func(ctx context.Context, j *stream.Job) error {
		if phase.Load() == 0 {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				cause.Store(context.Cause(ctx))
				return ctx.Err()
			case <-time.After(60 * time.Second):
				return errors.New("not cancelled")
			}
		}
		h2runs.Add(1)
		return nil
	})
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- h.Process(ctx, a11Job(name, "lossop", "lossacct")) }()
	<-started
	lk := keys.Lock + "{lossacct}"
	if rdb.Exists(ctx, lk).Val() != 1 {
		t.Fatalf("lock key %s not present while the handler runs", lk)
	}
	rdb.Set(ctx, lk, "1 thief", time.Minute) // another process "took" it
	err := <-done
	c, _ := cause.Load().(error)
	if c == nil || !errors.Is(c, lockx.ErrLockLost) {
		t.Fatalf("handler ctx cause = %v (Process returned %v), want ErrLockLost", c, err)
	}
	if err == nil {
		t.Fatal("Process returned nil for a cancelled handler")
	}
	if v := rdb.Get(ctx, lk).Val(); v != "1 thief" {
		t.Fatalf("the thief's lock was changed to %q", v)
	}
	rdb.Del(ctx, lk)
	phase.Store(1)
	if err := a11RunUntilNil(t, h, func() *stream.Job { return a11Job(name, "lossop", "lossacct") }); err != nil {
		t.Fatal(err)
	}
	if n := h2runs.Load(); n != 1 {
		t.Fatalf("operation ran %d times after the lost run", n)
	}
}

// A handler panic passes through; the lock is released and the record not completed.
func TestAttack11_FusedPanic(t *testing.T) {
	var n atomic.Int32
	h, name, keys, rdb := a11Chain(t, func(ctx context.Context, j *stream.Job) error {
		if n.Add(1) == 1 {
			panic("boom")
		}
		return nil
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("panic swallowed")
			}
		}()
		h.Process(context.Background(), a11Job(name, "pop", "pacct"))
	}()
	ctx := context.Background()
	v := rdb.Get(ctx, keys.Lock+"{pacct}").Val()
	if len(v) > 0 && len(splitSpace(v)) > 1 {
		t.Fatalf("lock still held after a panic: %q", v)
	}
	if err := a11RunUntilNil(t, h, func() *stream.Job { return a11Job(name, "pop", "pacct") }); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 2 {
		t.Fatalf("runs %d want 2", n.Load())
	}
}

func splitSpace(s string) []string {
	var out []string
	cur := ""
	for _, r := range s {
		if r == ' ' {
			out = append(out, cur)
			cur = ""
			continue
		}
		cur += string(r)
	}
	return append(out, cur)
}

// Redis frozen (SIGSTOP) while a fused Lock+Idempotency handler runs: the handler's
// context is cancelled (lock or lease lost), and after Redis resumes the operation
// completes exactly once more.
func TestAttack11_FusedFrozenRedis(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t, func(o *redis.Options) {
		o.ReadTimeout = 200 * time.Millisecond
		o.WriteTimeout = 200 * time.Millisecond
	})
	name := "{frz}"
	store := idem.NewRedisStore(rdb, idem.RedisConfig{Retention: time.Hour})
	started := make(chan struct{}, 1)
	var phase, runs atomic.Int32
	h := consumer.Chain(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		if phase.Load() == 0 {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(90 * time.Second):
				return errors.New("never cancelled")
			}
		}
		runs.Add(1)
		return nil
	}),
		middleware.Lock(rdb, middleware.LockConfig{TTL: 900 * time.Millisecond, ConflictDelay: time.Millisecond}),
		middleware.Idempotency(store, middleware.IdempotencyConfig{InProgressDelay: time.Millisecond, Lease: 900 * time.Millisecond}))
	done := make(chan error, 1)
	go func() { done <- h.Process(context.Background(), a11Job(name, "fop", "facct")) }()
	<-started
	srv.Stop()
	err := <-done
	srv.Cont()
	if err == nil || err.Error() == "never cancelled" {
		t.Fatalf("handler not cancelled while Redis was frozen past the TTL: %v", err)
	}
	phase.Store(1)
	if err := a11RunUntilNil(t, h, func() *stream.Job { return a11Job(name, "fop", "facct") }); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}
