package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// The retry middleware turns a handler's errors into outcomes: a retry after
// the backoff of the job's attempt, a Retry-After delay capped by the policy,
// or a dead-letter decision.
func ExampleRetry() {
	retry := middleware.Retry(middleware.RetryConfig{
		Backoff:       middleware.Backoff{Base: time.Second, Cap: time.Minute, Jitter: middleware.JitterNone},
		MaxAttempts:   5,
		MaxRetryAfter: 10 * time.Minute,
	})
	errs := map[string]error{
		"flaky":     errors.New("connection reset"),
		"throttled": consumer.RetryAfter(time.Hour, errors.New("429 Too Many Requests")),
		"invalid":   consumer.Permanent(errors.New("no such customer")),
	}
	h := retry(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		return errs[job.Type]
	}))
	for _, job := range []*stream.Job{
		{Type: "flaky", Attempt: 2},
		{Type: "flaky", Attempt: 4},
		{Type: "throttled"},
		{Type: "invalid"},
	} {
		fmt.Printf("%s, attempt %d: %v\n", job.Type, job.Attempt, h.Process(context.Background(), job))
	}
	// Output:
	// flaky, attempt 2: retry in 4s: connection reset
	// flaky, attempt 4: dead-letter (exhausted): attempt 5 of 5: connection reset
	// throttled, attempt 0: retry in 10m0s: 429 Too Many Requests
	// invalid, attempt 0: dead-letter (permanent): no such customer
}

// Delays of the first attempts with equal jitter: between half and all of
// the raw delay, which doubles from Base up to Cap.
func ExampleBackoff_Delay() {
	b := middleware.Backoff{Base: time.Second, Cap: 10 * time.Second, Jitter: middleware.JitterEqual}
	r := rand.New(rand.NewPCG(1, 2)) // seeded, for a reproducible example
	for attempt := range 6 {
		fmt.Printf("attempt %d: raw %v, delay %v\n", attempt, b.Raw(attempt), b.Delay(attempt, r).Round(time.Millisecond))
	}
	// Output:
	// attempt 0: raw 1s, delay 885ms
	// attempt 1: raw 2s, delay 1.616s
	// attempt 2: raw 4s, delay 3.569s
	// attempt 3: raw 8s, delay 7.186s
	// attempt 4: raw 10s, delay 6.171s
	// attempt 5: raw 10s, delay 5.206s
}

// A job that overruns its time limit fails with ErrJobTimeout, which the
// retry middleware outside it retries.
func ExampleTimeout() {
	h := middleware.Retry(middleware.RetryConfig{Backoff: middleware.Backoff{Jitter: middleware.JitterNone}})(
		middleware.Timeout(middleware.TimeoutConfig{PerType: map[string]time.Duration{"report": 10 * time.Millisecond}})(
			consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				<-ctx.Done() // a slow report
				return ctx.Err()
			})))
	err := h.Process(context.Background(), &stream.Job{Type: "report"})
	fmt.Println(errors.Is(err, middleware.ErrJobTimeout))
	fmt.Println(err)
	// Output:
	// true
	// retry in 1s: middleware: job timeout after 10ms: context deadline exceeded
}

// The dead-letter middleware redacts the payload of the dead-letter copy and
// alerts, whoever decides that the job dies: here the retry middleware, on a
// permanent error.
func ExampleDeadLetter() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "{billing}:jobs"})
	if _, err := p.Enqueue(ctx, &stream.Job{Type: "charge", Payload: []byte(`{"card":"4111 1111 1111 1111"}`)}); err != nil {
		panic(err)
	}

	alerted := make(chan consumer.DeadLetter, 1)
	c := consumer.New(rdb, consumer.Config{
		Stream: "{billing}:jobs", Group: "billing", Consumer: "worker-1",
		Block: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}).Use(
		middleware.Retry(middleware.RetryConfig{}),
		middleware.DeadLetter(middleware.DeadLetterConfig{
			MaxAge: 24 * time.Hour,
			Redact: func(*stream.Job) map[string]string { return map[string]string{"payload": "<redacted>"} },
			OnDeadLetter: func(ctx context.Context, d consumer.DeadLetter) {
				alerted <- d // page someone
			},
		}),
	).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		return consumer.Permanent(errors.New("card declined"))
	}))
	go func() {
		if err := c.Run(ctx); err != nil {
			panic(err)
		}
	}()
	var d consumer.DeadLetter
	select {
	case d = <-alerted:
	case <-time.After(10 * time.Second):
		panic("no dead letter")
	}
	_ = c.Shutdown(ctx)

	fmt.Println("alert:", d.Job.Type, d.Reason, d.Error)
	keys, _ := stream.KeysFor("{billing}:jobs")
	dead, _ := rdb.XRange(ctx, keys.Dead, d.DeadEntryID, d.DeadEntryID).Result()
	for _, e := range dead {
		fmt.Println("dead-letter entry:", e.Values["type"], e.Values["payload"], e.Values["dead_reason"], e.Values["dead_error"])
	}
	// Output:
	// alert: charge permanent card declined
	// dead-letter entry: charge <redacted> permanent card declined
}
