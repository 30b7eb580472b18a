package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// The retry middleware classifies a handler's errors: a per-type backoff, a
// Retry-After delay capped by the policy, a permanent failure, or (no
// per-type entry) the consumer's own backoff. The consumer decides the
// rest, such as the job's last attempt (consumer.Decide).
func ExampleRetry() {
	retry := middleware.Retry(middleware.RetryConfig{
		PerType:       map[string]consumer.Backoff{"flaky": {Base: time.Second, Cap: time.Minute, Jitter: consumer.JitterNone}},
		MaxRetryAfter: 10 * time.Minute,
	})
	errs := map[string]error{
		"flaky":     errors.New("connection reset"),
		"throttled": consumer.RetryAfter(time.Hour, errors.New("429 Too Many Requests")),
		"invalid":   consumer.Permanent(errors.New("no such customer")),
		"other":     errors.New("timeout"),
	}
	h := retry(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		return errs[job.Type]
	}))
	ctx := context.Background()
	for _, job := range []*stream.Job{
		{Type: "flaky", Attempt: 2, AttemptLimit: 5},
		{Type: "flaky", Attempt: 4, AttemptLimit: 5},
		{Type: "throttled", AttemptLimit: 5},
		{Type: "invalid", AttemptLimit: 5},
		{Type: "other", Attempt: 4, AttemptLimit: 5},
	} {
		err := h.Process(ctx, job)
		d := consumer.Decide(ctx, job, err)
		fmt.Printf("%s, attempt %d: %v; decided %s %s %v\n", job.Type, job.Attempt, err, d.Kind, d.Reason, d.Delay)
	}
	// Output:
	// flaky, attempt 2: retry in 4s: connection reset; decided retry  4s
	// flaky, attempt 4: retry in 16s: connection reset; decided dead_letter exhausted 0s
	// throttled, attempt 0: retry in 10m0s: 429 Too Many Requests; decided retry  10m0s
	// invalid, attempt 0: dead-letter (permanent): no such customer; decided dead_letter permanent 0s
	// other, attempt 4: timeout; decided dead_letter exhausted 0s
}

// A job that overruns its time limit fails with ErrJobTimeout, which the
// retry middleware outside it retries.
func ExampleTimeout() {
	h := middleware.Retry(middleware.RetryConfig{})(
		middleware.Timeout(middleware.TimeoutConfig{PerType: map[string]time.Duration{"report": 10 * time.Millisecond}})(
			consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				<-ctx.Done() // a slow report
				return ctx.Err()
			})))
	job := &stream.Job{Type: "report"}
	err := h.Process(context.Background(), job)
	fmt.Println(errors.Is(err, middleware.ErrJobTimeout), errors.Is(err, consumer.ErrRetryable))
	fmt.Println(err)
	fmt.Println(consumer.Decide(context.Background(), job, err).Kind)
	// Output:
	// true true
	// middleware: job timeout after 10ms: context deadline exceeded
	// retry
}

// The consumer redacts the payload of the dead-letter copy and alerts,
// whoever decides that the job dies (here the retry middleware, on a
// permanent error); the DeadLetter middleware only bounds a job's age.
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
		RedactDeadLetter: func(*stream.Job) map[string]string { return map[string]string{"payload": "<redacted>"} },
		OnDeadLetter: func(ctx context.Context, d consumer.DeadLetter) {
			alerted <- d // page someone
		},
	}).Use(
		middleware.Retry(middleware.RetryConfig{}),
		middleware.DeadLetter(middleware.DeadLetterConfig{MaxAge: 24 * time.Hour}),
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
