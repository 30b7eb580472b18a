package integration

// Outside tester (s24-attack) of the batched Lock and Idempotency
// operations on the middleware path, with cancellations: a consumer with
// middleware.Lock outside middleware.Idempotency is shut down while its
// handlers run; some honour the cancellation (no effect), some ignore it
// and finish their effect and return nil. A second consumer then takes the
// jobs over. Every idempotency key's effect must happen exactly once.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

func TestAttack24MiddlewareShutdownMidJob(t *testing.T) {
	t.Parallel()
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("resp%d", proto), func(t *testing.T) {
			t.Parallel()
			rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(), Protocol: proto})
			t.Cleanup(func() { rdb.Close() })
			attack24MiddlewareShutdown(t, rdb)
		})
	}
}

func attack24MiddlewareShutdown(t *testing.T, rdb *redis.Client) {
	ctx := context.Background()
	s := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })

	const keys = 24
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	for i := 0; i < keys; i++ {
		typ := "honour"
		if i%2 == 1 {
			typ = "ignore"
		}
		// Two jobs per key (a duplicate enqueue), same lock.
		for dup := 0; dup < 2; dup++ {
			k := fmt.Sprintf("k%d", i)
			if _, err := p.Enqueue(ctx, &stream.Job{Type: typ, IdempotencyKey: k, LockKey: k}); err != nil {
				t.Fatal(err)
			}
		}
	}

	var mu sync.Mutex
	effects := map[string]int{}
	var phase2 atomic.Bool
	var started atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if !phase2.Load() {
			started.Add(1)
			<-ctx.Done()
			if job.Type == "honour" {
				return context.Cause(ctx)
			}
		}
		mu.Lock()
		effects[job.IdempotencyKey]++
		mu.Unlock()
		return nil
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	newConsumer := func(name string) *consumer.Consumer {
		return consumer.New(rdb, consumer.Config{
			Stream: s, Group: "g", Consumer: name, Concurrency: 16, Logger: quiet,
			Block: 100 * time.Millisecond, VisibilityTimeout: 1500 * time.Millisecond, SweepInterval: 100 * time.Millisecond,
			Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond},
		}).Use(
			middleware.Lock(rdb, middleware.LockConfig{TTL: 3 * time.Second, ConflictDelay: 20 * time.Millisecond}),
			middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{InProgressDelay: 20 * time.Millisecond}),
		).Handle(h)
	}

	c1 := newConsumer("c1")
	done1 := make(chan error, 1)
	go func() { done1 <- c1.Run(ctx) }()
	poll.Until(t, time.Minute, func() (bool, string) {
		n := started.Load()
		return n >= 12, fmt.Sprintf("%d handlers started", n)
	})
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_ = c1.Shutdown(sctx)
	cancel()
	if err := <-done1; err != nil {
		t.Logf("c1 Run: %v", err)
	}
	phase2.Store(true)

	c2 := newConsumer("c2")
	runCtx, stop := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- c2.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done2 })
	poll.Until(t, 2*time.Minute, func() (bool, string) {
		mu.Lock()
		n := len(effects)
		mu.Unlock()
		pend, _ := rdb.XPending(ctx, s, "g").Result()
		delayed, _ := rdb.ZCard(ctx, "{"+s+"}:delayed").Result()
		var pc int64
		if pend != nil {
			pc = pend.Count
		}
		return n == keys && pc == 0 && delayed == 0, fmt.Sprintf("%d of %d keys done, %d pending, %d delayed", n, keys, pc, delayed)
	})
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := c2.WaitIdle(wctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, n := range effects {
		if n != 1 {
			t.Errorf("key %s: effect ran %d times", k, n)
		}
	}
	if dl, _ := rdb.XLen(ctx, "{"+s+"}:dlq").Result(); dl != 0 {
		t.Errorf("%d dead letters", dl)
	}
	st1, st2 := c1.Stats(), c2.Stats()
	t.Logf("c1 %+v", st1)
	t.Logf("c2 %+v", st2)
}
