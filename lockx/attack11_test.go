package lockx_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/redis/go-redis/v9"
)

func a11Client(t *testing.T) (*lockx.Client, string) {
	rdb := redistest.Shared(t)
	prefix := redistest.Name(t) + ":lock:"
	t.Cleanup(func() { redistest.DeleteKeys(rdb, prefix+"*") })
	return lockx.New(rdb, lockx.Config{Prefix: prefix}), prefix
}

// Contending goroutines: never two holders at once, and fences strictly grow
// in the order the lock was held.
func TestAttack11_FenceMonotonicUnderContention(t *testing.T) {
	c, _ := a11Client(t)
	ctx := context.Background()
	var (
		held   atomic.Int32
		mu     sync.Mutex
		last   int64
		n      int
		wg     sync.WaitGroup
		failed atomic.Value
	)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				l, err := c.Acquire(ctx, "k", 10*time.Second, lockx.AcquireOptions{Backoff: func(int) time.Duration { return time.Millisecond }})
				if err != nil {
					failed.Store(err.Error())
					return
				}
				if held.Add(1) != 1 {
					failed.Store("two holders at once")
				}
				mu.Lock()
				if l.Fence() <= last {
					failed.Store("fence did not grow")
				}
				last = l.Fence()
				n++
				mu.Unlock()
				held.Add(-1)
				if err := l.Release(ctx); err != nil {
					failed.Store(err.Error())
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f != nil {
		t.Fatal(f)
	}
	if n != 8*40 {
		t.Fatalf("acquired %d", n)
	}
}

// No key left forever: whatever TTL is given, the lock key has a TTL, after
// acquire, Extend and Release.
func TestAttack11_NoKeyForever(t *testing.T) {
	c, _ := a11Client(t)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	for i, ttl := range []time.Duration{0, -time.Second, 500 * time.Microsecond, time.Millisecond, time.Hour} {
		key := "ttl" + string(rune('a'+i))
		rk, err := c.RedisKey(key)
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.TryAcquire(ctx, key, ttl)
		if err != nil {
			continue // refused: fine
		}
		check := func(what string) {
			pt := rdb.PTTL(ctx, rk).Val()
			if rdb.Exists(ctx, rk).Val() == 1 && pt < 0 {
				t.Fatalf("ttl %v %s: key %s has no TTL (%v)", ttl, what, rk, pt)
			}
		}
		check("acquire")
		for _, e := range []time.Duration{0, -time.Second, 1} {
			_ = l.Extend(ctx, e)
			check("extend " + e.String())
		}
		_ = l.Release(ctx)
		check("release")
	}
}

// The tombstone: a release leaves the fence for the TTL, and a re-take after
// the key expired still gets a larger fence.
func TestAttack11_FenceAfterExpiry(t *testing.T) {
	c, _ := a11Client(t)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	rk, _ := c.RedisKey("e")
	var last int64
	for i := 0; i < 20; i++ {
		l, err := c.TryAcquire(ctx, "e", 20*time.Millisecond)
		if err != nil {
			// held by nobody but the tombstone? must not be refused
			deadline := time.Now().Add(10 * time.Second)
			for errors.Is(err, lockx.ErrNotObtained) && time.Now().Before(deadline) {
				l, err = c.TryAcquire(ctx, "e", 20*time.Millisecond)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if l.Fence() <= last {
			t.Fatalf("round %d: fence %d <= %d", i, l.Fence(), last)
		}
		last = l.Fence()
		if i%2 == 0 {
			_ = l.Release(ctx)
		}
		deadline := time.Now().Add(10 * time.Second)
		for rdb.Exists(ctx, rk).Val() == 1 {
			if time.Now().After(deadline) {
				t.Fatal("lock key never expired")
			}
		}
	}
}

// Loss of the lock (deleted, or overwritten by another holder) cancels the Guard ctx.
func TestAttack11_LossCancelsGuard(t *testing.T) {
	c, _ := a11Client(t)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	for _, how := range []string{"del", "overwrite", "persist-other"} {
		l, err := c.TryAcquire(ctx, "g"+how, 900*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		gctx, cancel := l.Guard(ctx)
		l.KeepAlive(ctx)
		rk, _ := c.RedisKey("g" + how)
		switch how {
		case "del":
			rdb.Del(ctx, rk)
		case "overwrite":
			rdb.Set(ctx, rk, "1 othertoken", time.Minute)
		case "persist-other":
			rdb.Set(ctx, rk, "99 "+l.Token()+"x", 0)
		}
		select {
		case <-gctx.Done():
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: guard ctx not cancelled", how)
		}
		if l.Err() == nil {
			t.Fatalf("%s: Err nil after loss", how)
		}
		_ = l.Release(ctx)
		if how != "del" && rdb.Exists(ctx, rk).Val() != 1 {
			t.Fatalf("%s: release of a lost lock deleted the new holder's key", how)
		}
		cancel()
	}
}

// Redis frozen (SIGSTOP) past the TTL: Lost must close (renewals failed for a whole TTL).
func TestAttack11_FrozenRedisLoses(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t, func(o *redis.Options) {
		o.ReadTimeout = 200 * time.Millisecond
		o.WriteTimeout = 200 * time.Millisecond
	})
	c := lockx.New(rdb, lockx.Config{})
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "frozen", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gctx, cancel := l.Guard(ctx)
	defer cancel()
	l.KeepAlive(ctx)
	srv.Stop()
	defer srv.Cont()
	select {
	case <-gctx.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("Redis frozen for 60 s with a 1 s lock: guard ctx never cancelled")
	}
	if l.Err() == nil {
		t.Fatal("Err nil")
	}
}
