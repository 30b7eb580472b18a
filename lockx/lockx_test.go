package lockx_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
)

// setup returns a Client with a key prefix of the test's own on the shared
// Redis (its keys are deleted at the end of the test), and an admin client.
func setup(t *testing.T) (*lockx.Client, *redis.Client, string) {
	t.Helper()
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb)
	return lockx.New(rdb, lockx.Config{Prefix: prefix}), rdb, prefix
}

func TestClient_TryAcquire(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t)
	ctx := t.Context()
	l, err := c.TryAcquire(ctx, "k", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := redisMicros(t, rdb)
	if l.Key() != "k" || len(l.Token()) != 32 || l.Fence() <= 0 || l.Fence() > now {
		t.Errorf("lock key %q token %q fence %d; want k, 32 hex digits, a fence up to Redis TIME %d µs", l.Key(), l.Token(), l.Fence(), now)
	}
	want := strconv.FormatInt(l.Fence(), 10) + " " + l.Token()
	if v, _ := rdb.Get(ctx, prefix+"{k}").Result(); v != want {
		t.Errorf("lock key holds %q, want %q", v, want)
	}
	if _, err := c.TryAcquire(ctx, "k", time.Second); !errors.Is(err, lockx.ErrNotObtained) {
		t.Fatalf("second TryAcquire: %v, want ErrNotObtained", err)
	}
	if v, _ := rdb.Get(ctx, prefix+"{k}").Result(); v != want {
		t.Errorf("lock key holds %q after a refused acquisition, want %q", v, want)
	}
	other, err := c.TryAcquire(ctx, "k2", time.Second)
	if err != nil {
		t.Fatalf("another key: %v", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := l.TTL(ctx); err != nil || d <= 0 || d > time.Second {
		t.Errorf("TTL = %v, %v; want in (0, 1s]", d, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Released: the key keeps only the fence (a tombstone), for the TTL.
	if v, _ := rdb.Get(ctx, prefix+"{k}").Result(); v != strconv.FormatInt(l.Fence(), 10) {
		t.Errorf("the lock key holds %q after Release, want the fence alone", v)
	}
	if d, _ := rdb.PTTL(ctx, prefix+"{k}").Result(); d <= 0 || d > time.Second {
		t.Errorf("the tombstone's TTL is %v, want at most the lock's (1s)", d)
	}
	if err := l.Release(ctx); !errors.Is(err, lockx.ErrNotHeld) {
		t.Errorf("second Release: %v, want ErrNotHeld", err)
	}
	if _, err := l.TTL(ctx); !errors.Is(err, lockx.ErrNotHeld) {
		t.Errorf("TTL after Release: %v, want ErrNotHeld", err)
	}
	if _, err := c.TryAcquire(ctx, "", time.Second); !errors.Is(err, lockx.ErrInvalidKey) {
		t.Errorf("empty key: %v, want ErrInvalidKey", err)
	}
	if l, err := c.TryAcquire(ctx, "}x", time.Second); err != nil {
		t.Errorf("key starting with '}': %v", err) // one key: always one slot
	} else {
		_ = l.Release(ctx)
	}
}

// redisMicros returns Redis's TIME in microseconds.
func redisMicros(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	tm, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// A holder whose lock expired cannot release, extend or read the TTL of the
// next holder's lock.
func TestLock_staleHolder(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t)
	ctx := t.Context()
	stale, err := c.TryAcquire(ctx, "k", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var fresh *lockx.Lock
	deadline := time.Now().Add(5 * time.Second)
	for fresh == nil {
		fresh, err = c.TryAcquire(ctx, "k", 10*time.Second)
		if err != nil && !errors.Is(err, lockx.ErrNotObtained) || time.Now().After(deadline) {
			t.Fatalf("acquire after expiry: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := stale.Release(ctx); !errors.Is(err, lockx.ErrNotHeld) {
		t.Errorf("stale Release: %v, want ErrNotHeld", err)
	}
	if err := stale.Extend(ctx, time.Minute); !errors.Is(err, lockx.ErrNotHeld) {
		t.Errorf("stale Extend: %v, want ErrNotHeld", err)
	}
	select {
	case <-stale.Lost():
		if !errors.Is(stale.Err(), lockx.ErrLockLost) {
			t.Errorf("stale Err() = %v, want ErrLockLost", stale.Err())
		}
	default:
		t.Error("Extend found the lock gone but Lost is open")
	}
	if _, err := stale.TTL(ctx); !errors.Is(err, lockx.ErrNotHeld) {
		t.Errorf("stale TTL: %v, want ErrNotHeld", err)
	}
	if v, _ := rdb.Get(ctx, prefix+"{k}").Result(); !strings.HasSuffix(v, " "+fresh.Token()) {
		t.Fatalf("the lock holds %q, want the new holder's token %q", v, fresh.Token())
	}
	if d, _ := rdb.PTTL(ctx, prefix+"{k}").Result(); d <= 9*time.Second {
		t.Errorf("the new holder's TTL is %v: the stale holder changed it", d)
	}
	if fresh.Err() != nil {
		t.Errorf("new holder's Err() = %v", fresh.Err())
	}
	if err := fresh.Release(ctx); err != nil {
		t.Errorf("new holder's Release: %v", err)
	}
}

func TestLock_Extend(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t)
	ctx := t.Context()
	l, err := c.TryAcquire(ctx, "k", 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d, _ := rdb.PTTL(ctx, prefix+"{k}").Result(); d <= 9*time.Second {
		t.Errorf("PTTL after Extend(10s) = %v", d)
	}
	if d, err := l.TTL(ctx); err != nil || d <= 9*time.Second {
		t.Errorf("TTL() after Extend(10s) = %v, %v", d, err)
	}
	select {
	case <-l.Lost():
		t.Error("Lost closed for a held lock")
	default:
	}
}

// The fencing token grows with every acquisition, whoever makes it, across
// releases and expiries; each key counts on its own.
func TestLock_Fence(t *testing.T) {
	t.Parallel()
	c, _, _ := setup(t)
	ctx := t.Context()
	var last int64
	for i := range 6 {
		var l *lockx.Lock
		var err error
		if i%2 == 0 {
			l, err = c.Acquire(ctx, "k", time.Minute, lockx.AcquireOptions{Wait: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		} else { // let it expire
			l, err = c.Acquire(ctx, "k", 30*time.Millisecond, lockx.AcquireOptions{Wait: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
		}
		if l.Fence() <= last {
			t.Fatalf("acquisition %d has fence %d, not above the previous %d", i+1, l.Fence(), last)
		}
		last = l.Fence()
	}
	l, err := c.Acquire(ctx, "k", time.Minute, lockx.AcquireOptions{Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.Fence() <= last {
		t.Errorf("7th acquisition has fence %d, not above the previous %d", l.Fence(), last)
	}
}

// KeepAlive keeps a lock through five times its TTL; nobody else gets it
// meanwhile; Release stops the renewal.
func TestLock_KeepAlive(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t)
	// A run in which this process or Redis went TTL/3 or longer without a
	// reply (a busy machine) checked nothing, and is repeated wider.
	redistest.Widen(t, "ttl", 150*time.Millisecond, func(t *testing.T, ttl time.Duration) time.Duration {
		ctx := t.Context()
		key := "k-" + ttl.String()
		stalls := redistest.WatchStalls(rdb, 2*redistest.StallInterval)
		defer stalls.Stop()
		l, err := c.TryAcquire(ctx, key, ttl)
		if err != nil {
			t.Fatal(err)
		}
		l.KeepAlive(context.Background())
		l.KeepAlive(context.Background()) // no second renewer
		end := time.Now().Add(5 * ttl)
		var lost error
		for time.Now().Before(end) && lost == nil {
			if _, err := c.TryAcquire(ctx, key, time.Minute); !errors.Is(err, lockx.ErrNotObtained) {
				lost = fmt.Errorf("another holder got the lock while it was kept alive: %v", err)
			}
			select {
			case <-l.Lost():
				lost = fmt.Errorf("Lost closed: %v", l.Err())
			default:
			}
			time.Sleep(10 * time.Millisecond)
		}
		if lost != nil {
			if stall := stalls.Longest(); stall >= ttl/3 {
				t.Logf("the run checked nothing: this process or Redis went %v without a reply, TTL/3 = %v (%v)", stall, ttl/3, lost)
				_ = rdb.Del(ctx, prefix+"{"+key+"}").Err()
				return 4 * stall
			}
			t.Fatal(lost)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release after 5 TTLs: %v", err)
		}
		// The tombstone (the fence alone) expires within the TTL: a renewal
		// that outlived Release would find no token to extend.
		if v, _ := rdb.Get(ctx, prefix+"{"+key+"}").Result(); v != strconv.FormatInt(l.Fence(), 10) {
			t.Errorf("the lock key holds %q after Release, want the fence alone", v)
		}
		if d, _ := rdb.PTTL(ctx, prefix+"{"+key+"}").Result(); d > ttl {
			t.Errorf("the tombstone's TTL is %v, over the lock's %v: the renewal outlived Release", d, ttl)
		}
		return 0
	})
}

// Lost closes, with ErrLockLost, when renewal finds the lock deleted behind
// its back; the renewal goroutine then ends (TestMain checks).
func TestLock_Lost(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := setup(t)
	ctx := t.Context()
	l, err := c.TryAcquire(ctx, "k", 150*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	l.KeepAlive(context.Background())
	if err := rdb.Del(ctx, prefix+"{k}").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("Lost did not close after the lock was deleted")
	}
	if !errors.Is(l.Err(), lockx.ErrLockLost) {
		t.Errorf("Err() = %v, want ErrLockLost", l.Err())
	}
	if err := l.Release(ctx); !errors.Is(err, lockx.ErrNotHeld) {
		t.Errorf("Release of a lost lock: %v, want ErrNotHeld", err)
	}
}

func TestClient_Acquire(t *testing.T) {
	t.Parallel()

	t.Run("waitsForRelease", func(t *testing.T) {
		t.Parallel()
		c, _, _ := setup(t)
		ctx := t.Context()
		held, err := c.TryAcquire(ctx, "k", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(100 * time.Millisecond)
			if err := held.Release(ctx); err != nil {
				t.Error(err)
			}
		})
		start := time.Now()
		l, err := c.Acquire(ctx, "k", time.Minute, lockx.AcquireOptions{Wait: 5 * time.Second})
		wg.Wait()
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		defer l.Release(ctx)
		if took := time.Since(start); took < 90*time.Millisecond {
			t.Errorf("Acquire returned after %v, before the holder released", took)
		}
		if l.Fence() <= held.Fence() {
			t.Errorf("fence %d, not above the previous holder's %d", l.Fence(), held.Fence())
		}
	})

	// Acquire gives up at the Wait: no earlier, and no later than the try
	// in flight then and a stall allow. It keeps trying meanwhile: its
	// backoffs and tries fill at least half the Wait, less the stalls
	// (on a busy machine, timers fire late and tries take long).
	t.Run("timesOut", func(t *testing.T) {
		t.Parallel()
		const wait, backoff = 150 * time.Millisecond, 10 * time.Millisecond
		c, rdb, _ := setup(t)
		ctx := t.Context()
		held, err := c.TryAcquire(ctx, "k", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(ctx)
		var calls redistest.CallTimer
		rdb.AddHook(&calls)
		stalls := redistest.WatchStalls(redistest.Shared(t), 2*redistest.StallInterval)
		defer stalls.Stop()
		start := time.Now()
		var tries int
		_, err = c.Acquire(ctx, "k", time.Minute, lockx.AcquireOptions{
			Wait:    wait,
			Backoff: func(n int) time.Duration { tries = n; return backoff },
		})
		took := time.Since(start)
		if !errors.Is(err, lockx.ErrNotObtained) {
			t.Fatalf("Acquire: %v, want ErrNotObtained", err)
		}
		work := calls.Total()
		stalled := stalls.Within(start, time.Now())
		if took < wait || took > wait+work+stalled+50*time.Millisecond {
			t.Errorf("Acquire gave up after %v, want %v to %v + %v in Redis calls + %v stalled + 50ms", took, wait, wait, work, stalled)
		}
		if tries < 2 || time.Duration(tries)*backoff+work < wait/2-stalled {
			t.Errorf("%d tries of %v backoff and %v in Redis calls in %v; want them to fill half the wait, less %v stalled",
				tries, backoff, work, took, stalled)
		}
	})

	t.Run("ctxDone", func(t *testing.T) {
		t.Parallel()
		c, _, _ := setup(t)
		held, err := c.TryAcquire(t.Context(), "k", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(context.Background())
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err = c.Acquire(ctx, "k", time.Minute, lockx.AcquireOptions{})
		if !errors.Is(err, lockx.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire: %v, want ErrNotObtained and DeadlineExceeded", err)
		}
	})
}

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 6: 320 * time.Millisecond, 7: 500 * time.Millisecond, 50: 500 * time.Millisecond} {
		for range 100 {
			if d := lockx.DefaultBackoff(n); d < want/2 || d > want {
				t.Fatalf("DefaultBackoff(%d) = %v, want in [%v, %v]", n, d, want/2, want)
			}
		}
	}
}

func TestContext(t *testing.T) {
	t.Parallel()
	if _, ok := lockx.FromContext(t.Context()); ok {
		t.Error("FromContext found a lock in a bare context")
	}
	c, _, _ := setup(t)
	l, err := c.TryAcquire(t.Context(), "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if got, ok := lockx.FromContext(lockx.NewContext(t.Context(), l)); !ok || got != l {
		t.Errorf("FromContext = %p, %v; want %p", got, ok, l)
	}
}

func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", "pelican:lock:", "{orders}:lock:", "{shop}:orders:lock:", "}{a}:"} {
		if err := (lockx.Config{Prefix: prefix}).Validate(); err != nil {
			t.Errorf("Validate(Prefix %q) = %v, want nil", prefix, err)
		}
	}
	for _, prefix := range []string{"a{b", "x}", "{}", "{}{a}:"} {
		err := (lockx.Config{Prefix: prefix}).Validate()
		if err == nil || !strings.Contains(err.Error(), "Config.Prefix") {
			t.Errorf("Validate(Prefix %q) = %v, want an error naming Config.Prefix", prefix, err)
		}
		c := lockx.New(nil, lockx.Config{Prefix: prefix}) // no client: Redis is never touched
		if _, err := c.TryAcquire(context.Background(), "k", time.Second); err == nil || !strings.Contains(err.Error(), "Config.Prefix") {
			t.Errorf("TryAcquire with Prefix %q = %v, want the error naming Config.Prefix", prefix, err)
		}
		if _, err := c.Acquire(context.Background(), "k", time.Second, lockx.AcquireOptions{}); err == nil || !strings.Contains(err.Error(), "Config.Prefix") {
			t.Errorf("Acquire with Prefix %q = %v, want the error naming Config.Prefix", prefix, err)
		}
	}
}

// With a hash tag in the prefix, every lock lives in the tag's slot,
// whatever braces the key has, and each key has one Redis key.
func TestClient_taggedPrefix(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	tag := redistest.Name(t)
	prefix := "{" + tag + "}:lock:"
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+tag+"}*") })
	c := lockx.New(rdb, lockx.Config{Prefix: prefix})
	ctx := t.Context()
	for _, key := range []string{"k", "}x", "{y}", "a}b", "k}:fence", "k:fence"} {
		l, err := c.TryAcquire(ctx, key, time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", key, err)
		}
		if v, _ := rdb.Get(ctx, prefix+"{"+key+"}").Result(); v != strconv.FormatInt(l.Fence(), 10)+" "+l.Token() {
			t.Errorf("%q: lock key %q holds %q, want the fence and token", key, prefix+"{"+key+"}", v)
		}
	}
	if _, err := c.TryAcquire(ctx, "", time.Second); !errors.Is(err, lockx.ErrInvalidKey) {
		t.Errorf("empty key: %v, want ErrInvalidKey", err)
	}
	keys, err := rdb.Keys(ctx, "{"+tag+"}*").Result()
	if err != nil || len(keys) != 6 {
		t.Fatalf("keys under the tag: %q, %v; want 6 locks", keys, err)
	}
	for _, k := range keys {
		if got := keyslot.Of(k); got != keyslot.Of(tag) {
			t.Errorf("key %q is in slot %d, not the tag's", k, got)
		}
	}
}
