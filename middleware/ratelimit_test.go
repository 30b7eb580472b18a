package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

func TestRateLimiter_admitsRatePerPeriod(t *testing.T) {
	t.Parallel()
	prefix, clients := distSetup(t, 2)
	const (
		rate   = 100
		per    = 200 * time.Millisecond
		burst  = 5
		window = time.Second
	)
	var limiters []*middleware.RateLimiter
	for _, rdb := range clients { // two "processes" share one key
		l, err := middleware.NewRateLimiter(rdb, middleware.RateLimitConfig{Rate: rate, Per: per, Burst: burst})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := l.Allow(context.Background(), prefix+"warm-up"); err != nil { // loads the script
			t.Fatal(err)
		}
		limiters = append(limiters, l)
	}
	var allowed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range 3 {
			wg.Go(func() {
				for time.Since(start) < window {
					ok, after, err := l.Allow(context.Background(), prefix+"api")
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						allowed.Add(1)
					} else if after <= 0 || after > per/rate*burst {
						t.Errorf("limited with retry-after %v, want in (0, %v]", after, per/rate*burst)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	want := float64(burst) + float64(rate)*window.Seconds()/per.Seconds()
	got := float64(allowed.Load())
	t.Logf("admitted %v in %v, want %v (%+.1f%%)", got, window, want, 100*(got-want)/want)
	if math.Abs(got-want) > 0.05*want {
		t.Errorf("admitted %v in %v, want %v ± 5%%", got, window, want)
	}
}

func TestRateLimiter_burst(t *testing.T) {
	t.Parallel()
	prefix, clients := distSetup(t, 1)
	l, err := middleware.NewRateLimiter(clients[0], middleware.RateLimitConfig{Rate: 10, Per: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Burst defaults to Rate: 10 pass at once, the 11th waits one interval.
	for i := range 10 {
		if ok, _, err := l.Allow(ctx, prefix+"k"); !ok || err != nil {
			t.Fatalf("request %d of the burst: %v %v", i+1, ok, err)
		}
	}
	ok, after, err := l.Allow(ctx, prefix+"k")
	if ok || err != nil {
		t.Fatalf("request 11: allowed %v, err %v, want limited", ok, err)
	}
	if after < 5900*time.Millisecond || after > 6*time.Second {
		t.Errorf("retry-after %v, want about 6s (one interval of a minute / 10)", after)
	}
	// Limited requests take nothing; other keys have their own budget.
	if ok, _, _ := l.Allow(ctx, prefix+"other"); !ok {
		t.Error("another key was limited")
	}
	if ttl := clients[0].PTTL(ctx, prefix+"k").Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("key TTL %v, want in (0, 1m]: the key must expire when idle", ttl)
	}
}

func TestRateLimit_snoozesWithoutCallingTheHandler(t *testing.T) {
	t.Parallel()
	prefix, clients := distSetup(t, 1)
	var calls atomic.Int64
	h := middleware.RateLimit(clients[0], middleware.RateLimitConfig{
		Rate: 2, Per: time.Second, Burst: 1, Prefix: prefix,
		Key: func(job *stream.Job) string { return job.Headers["api"] },
	})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		calls.Add(1)
		return nil
	}))
	job := &stream.Job{Type: "call", Headers: map[string]string{"api": "geo"}}
	if err := h.Process(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	err := h.Process(context.Background(), job)
	d, ok := snoozeDelay(err)
	if !ok {
		t.Fatalf("second job: %v, want a snooze", err)
	}
	// retry-after is about 500ms; the jitter adds at most 50ms + 500ms.
	if d < 400*time.Millisecond || d > 1100*time.Millisecond {
		t.Errorf("snooze %v, want about 500ms plus a small jitter", d)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler called %d times, want 1", calls.Load())
	}
	// A job without a key is not limited.
	for range 3 {
		if err := h.Process(context.Background(), &stream.Job{Type: "call"}); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 4 {
		t.Fatalf("handler called %d times, want 4", calls.Load())
	}
}

func TestRateLimit_config(t *testing.T) {
	t.Parallel()
	for _, cfg := range []middleware.RateLimitConfig{
		{}, {Rate: 1}, {Per: time.Second}, {Rate: -1, Per: time.Second},
		{Rate: 1, Per: time.Second, Burst: -1}, {Rate: 1e7, Per: time.Second},
	} {
		if _, err := middleware.NewRateLimiter(nil, cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%+v: RateLimit did not panic", cfg)
				}
			}()
			middleware.RateLimit(nil, cfg)
		}()
	}
	// A Redis error fails the job without running it.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	h := middleware.RateLimit(rdb, middleware.RateLimitConfig{Rate: 1, Per: time.Second})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error { return errors.New("ran") }))
	err := h.Process(context.Background(), &stream.Job{Type: "x", Stream: "orders"})
	var o *consumer.Outcome
	if err == nil || errors.As(err, &o) || err.Error() == "ran" || strings.Contains(err.Error(), "job.Stream") {
		t.Fatalf("got %v, want the Redis error", err)
	}
	// Without a Prefix, a job must name its queue.
	if err := h.Process(context.Background(), &stream.Job{Type: "x"}); err == nil || !strings.Contains(err.Error(), "job.Stream") {
		t.Fatalf("a job without a stream: %v, want an error naming job.Stream", err)
	}
}

// Geocoding jobs of queue "geo" may call the geocoding API 2 times a second
// across every process; a job over the limit is snoozed until the API has
// room.
func ExampleRateLimit() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	geocode := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		return nil // call the API
	})
	h := middleware.RateLimit(rdb, middleware.RateLimitConfig{
		Key:  func(job *stream.Job) string { return "geocoding-api" },
		Rate: 2,
		Per:  time.Second,
	})(geocode)

	for i := range 3 {
		err := h.Process(context.Background(), &stream.Job{Type: "geocode", Stream: "geo"})
		var o *consumer.Outcome
		switch {
		case err == nil:
			fmt.Printf("job %d: ran\n", i+1)
		case errors.As(err, &o) && !o.CountsAttempt():
			fmt.Printf("job %d: snoozed\n", i+1)
		}
	}
	// The queue's limiter of the API:
	fmt.Println(rdb.Exists(context.Background(), "{geo}:rate:geocoding-api").Val())
	// Output:
	// job 1: ran
	// job 2: ran
	// job 3: snoozed
	// 1
}
