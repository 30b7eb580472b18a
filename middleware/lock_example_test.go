package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// Jobs of one customer never run at the same time: each holds the lock of
// its lock_key field, in its queue's namespace. A job that finds its lock
// held is snoozed, which does not count an attempt. The handler passes the
// lock's fencing token to the store it writes to, which refuses stale
// tokens.
func ExampleLock() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Unix(1700000000, 0)) // Redis TIME, the fences' baseline
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	var h consumer.Handler
	h = consumer.Chain(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		l, _ := lockx.FromContext(ctx)
		fmt.Printf("%s runs holding %s, fencing token %d\n", job.ID, l.Key(), l.Fence())
		// Queue orders' lock of customer:7, in the stream's cluster slot:
		fmt.Println("held:", rdb.Exists(ctx, "{orders}:lock:{customer:7}").Val() == 1)
		// A second job of the same customer, arriving meanwhile:
		err := h.Process(ctx, &stream.Job{ID: "job-2", Stream: "orders", LockKey: "customer:7"})
		var o *consumer.Outcome
		if errors.As(err, &o) && !o.CountsAttempt() {
			fmt.Println("job-2 snoozed, not counted as an attempt")
		}
		return nil
	}), middleware.Lock(rdb, middleware.LockConfig{
		TTL:        10 * time.Second,
		OnConflict: func(key string) { fmt.Println("lock conflict on", key) },
	}))

	if err := h.Process(context.Background(), &stream.Job{ID: "job-1", Stream: "orders", LockKey: "customer:7"}); err != nil {
		panic(err)
	}
	// Output:
	// job-1 runs holding customer:7, fencing token 1700000000000000
	// held: true
	// lock conflict on customer:7
	// job-2 snoozed, not counted as an attempt
}
