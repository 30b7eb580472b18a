package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// Six callers in two "processes" share one key's limit (100 per 200 ms,
// burst 5) for five periods: the limiter admits the burst plus one request per
// 2 ms interval, no more, and no fewer than the callers gave it the chance
// to. A request arrives between its call's start and return, so no arrival
// can fall in a time that holds no whole call; the limiter's capacity lapses
// only in gaps between arrivals longer than the burst, and these lie in such
// times longer than the burst, which are not counted. A run in which they
// take a third of the window or more (a busy machine, a slow Redis) could
// not check the lower bound and is repeated with a period four times as
// long (a lower rate, a longer burst, the same five periods).
func TestRateLimiter_admitsRatePerPeriod(t *testing.T) {
	t.Parallel()
	prefix, clients := distSetup(t, 2)
	redistest.Widen(t, "per", 200*time.Millisecond, func(t *testing.T, per time.Duration) time.Duration {
		return rateLimitAdmits(t, prefix+per.String()+":", clients, per)
	})
}

// rateLimitAdmits runs TestRateLimiter_admitsRatePerPeriod with the period
// per; it returns a longer one if the run could not check the lower bound.
func rateLimitAdmits(t *testing.T, prefix string, clients []*redis.Client, per time.Duration) time.Duration {
	const (
		rate  = 100
		burst = 5
	)
	every, window := per/rate, 5*per
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
	var (
		mu    sync.Mutex
		calls []redistest.Call
	)
	var allowed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range 3 {
			wg.Go(func() {
				for time.Since(start) < window {
					began := time.Now()
					ok, after, err := l.Allow(context.Background(), prefix+"api")
					ended := time.Now()
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					calls = append(calls, redistest.Call{Start: began, End: ended})
					mu.Unlock()
					if ok {
						allowed.Add(1)
					} else if after <= 0 || after > every*burst {
						t.Errorf("limited with retry-after %v, want in (0, %v]", after, every*burst)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	first, last := redistest.CallBounds(calls)
	// Arrivals from the first call's start to the last call's return:
	// at most the burst and one per interval (and one for the edges).
	span := last.End.Sub(first.Start)
	most := float64(burst) + float64(span/every) + 1
	// The time lapsed lies in stretches longer than the burst that hold no
	// whole call.
	lapsed := redistest.Uncovered(calls, burst*every)
	covered := last.Start.Sub(first.End)
	least := float64(burst) + float64((covered-lapsed)/every) - 1
	got := float64(allowed.Load())
	t.Logf("admitted %v of %d requests over %v; want %v to %v (%v of it held no whole call for over the burst)",
		got, len(calls), span.Round(time.Millisecond), least, most, lapsed.Round(time.Millisecond))
	if got > most {
		t.Errorf("admitted %v requests in %v, want at most %v: the burst %d and one per %v", got, span, most, burst, every)
	}
	if lapsed > covered/3 {
		t.Logf("the run checked nothing of the lower bound: the callers left %v of %v without a whole call", lapsed, covered)
		return 4 * per
	}
	if got < 0.95*least {
		t.Errorf("admitted %v requests, want at least %v - 5%%: the burst %d and one per %v, less %v without calls", got, least, burst, every, lapsed)
	}
	return 0
}

func TestRateLimiter_burst(t *testing.T) {
	t.Parallel()
	prefix, clients := distSetup(t, 1)
	l, err := middleware.NewRateLimiter(clients[0], middleware.RateLimitConfig{Rate: 10, Per: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Burst defaults to Rate: 10 pass at once, the 11th waits one interval
	// from the first, less the time the requests took.
	began := time.Now()
	for i := range 10 {
		if ok, _, err := l.Allow(ctx, prefix+"k"); !ok || err != nil {
			t.Fatalf("request %d of the burst: %v %v", i+1, ok, err)
		}
	}
	ok, after, err := l.Allow(ctx, prefix+"k")
	took := time.Since(began)
	if ok || err != nil {
		t.Fatalf("request 11: allowed %v, err %v, want limited", ok, err)
	}
	if after < 6*time.Second-took || after > 6*time.Second {
		t.Errorf("retry-after %v, want 6s (one interval of a minute / 10) less at most the %v the requests took", after, took)
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
	t0 := time.Now()
	if err := h.Process(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	err := h.Process(context.Background(), job)
	between := time.Since(t0) // at least the time between the two starts at Redis
	d, ok := snoozeDelay(err)
	if !ok {
		t.Fatalf("second job: %v, want a snooze", err)
	}
	// retry-after is 500ms less the time between the two starts (by the
	// Redis clock, in µs); the jitter adds at most 50ms + 500ms.
	if lo := 500*time.Millisecond - between - time.Millisecond; d < lo || d > 1100*time.Millisecond {
		t.Errorf("snooze %v, %v after the first start; want 500ms less that, plus a small jitter", d, between)
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
		err := middleware.RateLimit(nil, cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
			return errors.New("ran")
		})).Process(t.Context(), &stream.Job{Stream: "s"})
		if err == nil || err.Error() == "ran" || !strings.Contains(err.Error(), "RateLimitConfig.") {
			t.Errorf("%+v: Process = %v, want the invalid field's error without running", cfg, err)
		}
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
