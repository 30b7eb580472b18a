package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// Overload protection for jobs that call one downstream API, outermost
// first: the circuit breaker (cheapest: no Redis, nothing allocated while
// open), the per-process concurrency limit, the limit across processes,
// and last the rate limit, so that a rate token is only spent by a job that
// is about to call the API. Every middleware that turns a job away snoozes
// it, which does not count an attempt; snoozes from inner middleware are
// neither failures nor successes to the breaker.
func Example_overload() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	api := func(job *stream.Job) string { return "billing-api" }
	down := true
	handler := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if down {
			return errors.New("billing API: 503")
		}
		return nil
	})
	h := consumer.Chain(handler,
		middleware.CircuitBreaker(middleware.CircuitBreakerConfig{Key: api, Threshold: 2, OpenFor: time.Minute}),
		middleware.Concurrency(middleware.ConcurrencyConfig{Default: 8}),
		middleware.DistributedConcurrency(rdb, middleware.DistributedConcurrencyConfig{Key: api, Limit: 20}),
		middleware.RateLimit(rdb, middleware.RateLimitConfig{Key: api, Rate: 100, Per: time.Second}),
	)

	for i := range 4 {
		err := h.Process(context.Background(), &stream.Job{Type: "invoice", Stream: "billing"})
		var o *consumer.Outcome
		switch {
		case err == nil:
			fmt.Printf("job %d: done\n", i+1)
		case errors.As(err, &o) && !o.CountsAttempt():
			fmt.Printf("job %d: snoozed, not counted as an attempt\n", i+1)
		default:
			fmt.Printf("job %d: failed: %v\n", i+1, err)
		}
	}
	// Output:
	// job 1: failed: billing API: 503
	// job 2: failed: billing API: 503
	// job 3: snoozed, not counted as an attempt
	// job 4: snoozed, not counted as an attempt
}
