package lockx_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
)

// renewCounter counts, per script call a client sends, the lock renewals
// ("le" operations) it carries.
type renewCounter struct {
	mu    sync.Mutex
	calls []int // renewals per script call that carried any
}

func (c *renewCounter) note(cmd redis.Cmder) {
	args := cmd.Args()
	if name := strings.ToLower(cmd.Name()); (name != "evalsha" && name != "eval") || len(args) < 3 {
		return
	}
	n := 0
	for _, a := range args[3:] {
		if a == "le" {
			n++
		}
	}
	if n > 0 {
		c.mu.Lock()
		c.calls = append(c.calls, n)
		c.mu.Unlock()
	}
}

func (c *renewCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *renewCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.note(cmd)
		return next(ctx, cmd)
	}
}
func (c *renewCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.note(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *renewCounter) snapshot() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.calls...)
}

// One watchdog per redis client renews every lock kept alive in one round
// trip (one script call: the locks share a slot) per tick, however many
// locks are held, and none of them is lost meanwhile.
func TestLock_KeepAlive_oneRoundTripPerTick(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	prefix := redistest.Prefix(t, shared)
	rdb := redis.NewClient(&redis.Options{Addr: shared.Options().Addr})
	defer rdb.Close()
	counter := &renewCounter{}
	rdb.AddHook(counter)
	c := lockx.New(rdb, lockx.Config{Prefix: "{" + prefix + "}:"})
	const n, ttl = 50, 3 * time.Second
	ctx := t.Context()
	locks := make([]*lockx.Lock, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range locks { // together: batched, so acquired at about the same time
		wg.Go(func() { locks[i], errs[i] = c.TryAcquire(ctx, "k"+string(rune('A'+i)), ttl) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range locks {
		l.KeepAlive(context.Background())
	}
	defer func() {
		for _, l := range locks {
			_ = l.Release(context.Background())
		}
		redistest.DeleteKeys(shared, "{"+prefix+"}:*")
	}()
	// Three renewals of every lock: a TTL and a bit.
	deadline := time.Now().Add(time.Minute)
	for {
		sum := 0
		for _, k := range counter.snapshot() {
			sum += k
		}
		if sum >= 3*n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in a minute, want %d", sum, 3*n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Locks acquired more than half a renewal interval apart (a stalled
	// machine) are renewed in two calls once, then together.
	calls := counter.snapshot()
	partial := 0
	for _, k := range calls {
		if k != n {
			partial++
		}
	}
	if partial > 2 || calls[len(calls)-1] != n {
		t.Errorf("renewal calls carried %v of the %d locks; want all in one call per tick (after at most one split)", calls, n)
	}
	for _, l := range locks {
		if err := l.Err(); err != nil {
			t.Fatalf("a lock was lost while kept alive: %v", err)
		}
	}
}
