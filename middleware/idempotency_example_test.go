package middleware_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// The same business operation enqueued three times in queue "payments" runs
// once; the duplicates are acknowledged as hits and see the stored result.
// The record is the queue's: a job of another queue with the same key runs
// its own operation.
func ExampleIdempotency() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	store := idem.NewRedisStore(rdb, idem.RedisConfig{Retention: 7 * 24 * time.Hour})
	charge := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		fmt.Println("charging", job.IdempotencyKey)
		if c, ok := idem.ClaimFromContext(ctx); ok {
			c.SetResult([]byte("receipt-1"))
		}
		return nil
	})
	h := consumer.Chain(charge, middleware.Idempotency(store, middleware.IdempotencyConfig{
		// Retries for 25 attempts of at most 10 minutes, replays within 3 days.
		RetryHorizon: idem.RetryHorizon(25, 10*time.Minute, 72*time.Hour),
		OnHit: func(_ context.Context, job *stream.Job, result []byte) {
			fmt.Printf("hit %s (%s): %s\n", job.IdempotencyKey, job.ID, result)
		},
	}))
	for _, id := range []string{"a", "b", "c"} {
		job := &stream.Job{ID: id, Stream: "payments", Type: "charge", IdempotencyKey: "order-7", EntryID: "1-0"}
		if err := h.Process(context.Background(), job); err != nil {
			fmt.Println("error:", err)
		}
	}
	fmt.Println("record:", rdb.Get(context.Background(), "{payments}:idem:order-7").Val()[:1]) // c: completed
	job := &stream.Job{ID: "d", Stream: "refunds", Type: "charge", IdempotencyKey: "order-7", EntryID: "2-0"}
	if err := h.Process(context.Background(), job); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// charging order-7
	// hit order-7 (b): receipt-1
	// hit order-7 (c): receipt-1
	// record: c
	// charging order-7
}
