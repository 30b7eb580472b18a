package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// retryDescribe names the outcome of err: "nil", "retry <delay>",
// "snooze <delay>", "dead <reason>", or "error: <text>" for an error that
// is no outcome.
func retryDescribe(err error) string {
	if err == nil {
		return "nil"
	}
	var o *consumer.Outcome
	if !errors.As(err, &o) {
		return "error: " + err.Error()
	}
	switch {
	case o.IsDead():
		return "dead " + o.Reason()
	case o.CountsAttempt():
		return fmt.Sprintf("retry %v", o.Delay())
	default:
		return fmt.Sprintf("snooze %v", o.Delay())
	}
}

// retryRun passes job through Retry(cfg) around a handler that returns err.
func retryRun(ctx context.Context, cfg middleware.RetryConfig, job *stream.Job, err error) error {
	h := middleware.Retry(cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return err }))
	return h.Process(ctx, job)
}

type retryMarked bool

func (r retryMarked) Error() string   { return fmt.Sprintf("marked retryable=%v", bool(r)) }
func (r retryMarked) Retryable() bool { return bool(r) }

type retryNetErr struct{ timeout bool }

func (e retryNetErr) Error() string   { return "net failure" }
func (e retryNetErr) Timeout() bool   { return e.timeout }
func (e retryNetErr) Temporary() bool { return false }

var _ net.Error = retryNetErr{}

func TestBackoff_Raw(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		b       middleware.Backoff
		attempt int
		want    time.Duration
	}{
		{"defaults first", middleware.Backoff{}, 0, time.Second},
		{"defaults doubled", middleware.Backoff{}, 3, 8 * time.Second},
		{"defaults capped", middleware.Backoff{}, 10, 10 * time.Minute},
		{"negative attempt", middleware.Backoff{Base: time.Second}, -5, time.Second},
		{"base", middleware.Backoff{Base: 3 * time.Millisecond, Cap: time.Hour}, 0, 3 * time.Millisecond},
		{"doubling", middleware.Backoff{Base: 3 * time.Millisecond, Cap: time.Hour}, 4, 48 * time.Millisecond},
		{"exactly cap", middleware.Backoff{Base: time.Second, Cap: 8 * time.Second}, 3, 8 * time.Second},
		{"just over cap", middleware.Backoff{Base: time.Second, Cap: 8*time.Second - 1}, 3, 8*time.Second - 1},
		{"base over cap", middleware.Backoff{Base: time.Hour, Cap: time.Minute}, 0, time.Minute},
		{"attempt 61", middleware.Backoff{Base: 1, Cap: math.MaxInt64}, 61, 1 << 61},
		{"attempt 62 no overflow", middleware.Backoff{Base: 1, Cap: math.MaxInt64}, 62, math.MaxInt64},
		{"attempt 63 no overflow", middleware.Backoff{Base: time.Second, Cap: time.Hour}, 63, time.Hour},
		{"attempt 64 no overflow", middleware.Backoff{Base: time.Second, Cap: time.Hour}, 64, time.Hour},
		{"huge attempt", middleware.Backoff{Base: time.Second, Cap: time.Hour}, math.MaxInt, time.Hour},
		{"overflowing shift", middleware.Backoff{Base: time.Hour, Cap: math.MaxInt64}, 40, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.b.Raw(tc.attempt); got != tc.want {
				t.Errorf("Raw(%d) = %v, want %v", tc.attempt, got, tc.want)
			}
		})
	}
}

func TestBackoff_Delay(t *testing.T) {
	t.Parallel()

	// A raw delay of 3ns has few enough values that every one of them,
	// bounds included, shows up: the bounds are exact, not approximate.
	t.Run("exact bounds", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			jitter middleware.Jitter
			want   []time.Duration // every possible value
		}{
			{middleware.JitterFull, []time.Duration{0, 1, 2, 3}},
			{middleware.JitterEqual, []time.Duration{1, 2, 3}},
			{middleware.JitterNone, []time.Duration{3}},
		} {
			b := middleware.Backoff{Base: 3, Cap: 3, Jitter: tc.jitter}
			r := rand.New(rand.NewPCG(1, 2))
			seen := map[time.Duration]int{}
			for range 2000 {
				seen[b.Delay(0, r)]++
			}
			if len(seen) != len(tc.want) {
				t.Errorf("jitter %d: values %v, want exactly %v", tc.jitter, seen, tc.want)
			}
			for _, w := range tc.want {
				if seen[w] == 0 {
					t.Errorf("jitter %d: value %v never drawn (seen %v)", tc.jitter, w, seen)
				}
			}
		}
	})

	t.Run("within bounds", func(t *testing.T) {
		t.Parallel()
		r := rand.New(rand.NewPCG(3, 4))
		for _, b := range []middleware.Backoff{
			{Base: 100 * time.Millisecond, Cap: time.Minute, Jitter: middleware.JitterFull},
			{Base: 100 * time.Millisecond, Cap: time.Minute, Jitter: middleware.JitterEqual},
			{Base: 7, Cap: 1001, Jitter: middleware.JitterEqual}, // odd raw delays
			{Base: 100 * time.Millisecond, Cap: time.Minute, Jitter: middleware.JitterNone},
			{}, // defaults: equal jitter
		} {
			for attempt := range 20 {
				raw := b.Raw(attempt)
				lo, hi := raw/2, raw
				switch b.Jitter {
				case middleware.JitterFull:
					lo = 0
				case middleware.JitterNone:
					lo = raw
				}
				for _, rr := range []*rand.Rand{r, nil} {
					for range 200 {
						if d := b.Delay(attempt, rr); d < lo || d > hi {
							t.Fatalf("%+v Delay(%d) = %v, want within [%v, %v]", b, attempt, d, lo, hi)
						}
					}
				}
			}
		}
	})

	t.Run("largest delays", func(t *testing.T) {
		t.Parallel()
		r := rand.New(rand.NewPCG(5, 6))
		for _, j := range []middleware.Jitter{middleware.JitterFull, middleware.JitterEqual, middleware.JitterNone} {
			b := middleware.Backoff{Base: time.Hour, Cap: math.MaxInt64, Jitter: j}
			for range 100 {
				if d := b.Delay(1000, r); d < 0 || (j == middleware.JitterEqual && d < math.MaxInt64/2) {
					t.Fatalf("jitter %d: Delay = %v", j, d)
				}
			}
		}
	})

	t.Run("seeded is reproducible", func(t *testing.T) {
		t.Parallel()
		b := middleware.Backoff{}
		r1, r2 := rand.New(rand.NewPCG(7, 8)), rand.New(rand.NewPCG(7, 8))
		for attempt := range 10 {
			if d1, d2 := b.Delay(attempt, r1), b.Delay(attempt, r2); d1 != d2 {
				t.Fatalf("attempt %d: %v then %v from the same seed", attempt, d1, d2)
			}
		}
	})
}

func TestRetry_Classify(t *testing.T) {
	t.Parallel()
	plain := errors.New("plain")
	snooze := consumer.Snooze(time.Minute)
	dead := consumer.Dead("custom", plain)
	badPayload := (&stream.Job{ID: "j", ContentType: stream.ContentTypeJSON, Payload: []byte("{")}).Decode(&struct{}{})
	if !errors.Is(badPayload, stream.ErrPayload) {
		t.Fatalf("setup: %v is not ErrPayload", badPayload)
	}
	shutdownCtx, cancel := context.WithCancelCause(context.Background())
	cancel(consumer.ErrShutdown)
	leaseCtx, cancel := context.WithCancelCause(context.Background())
	cancel(consumer.ErrLeaseLost)
	// Backoff without jitter: a retry after attempt 0 waits 1s.
	base := middleware.RetryConfig{Backoff: middleware.Backoff{Base: time.Second, Jitter: middleware.JitterNone}}
	toPermanent := func(*stream.Job, error) middleware.Class { return middleware.ClassPermanent }
	toRetryable := func(*stream.Job, error) middleware.Class { return middleware.ClassRetryable }
	toDefault := func(*stream.Job, error) middleware.Class { return middleware.ClassDefault }

	for _, tc := range []struct {
		name string
		mod  func(*middleware.RetryConfig)
		ctx  context.Context
		err  error
		want string
		same bool // the very error returned by the handler comes out
	}{
		{name: "nil", err: nil, want: "nil"},
		{name: "snooze outcome untouched", err: snooze, want: "snooze 1m0s", same: true},
		{name: "dead outcome untouched", err: dead, want: "dead custom", same: true},
		{name: "wrapped retry outcome untouched", err: fmt.Errorf("ctx: %w", consumer.Retry(time.Hour, plain)), want: "retry 1h0m0s", same: true},
		{name: "permanent mark", err: consumer.Permanent(plain), want: "dead permanent"},
		{name: "wrapped permanent mark", err: fmt.Errorf("send: %w", consumer.Permanent(plain)), want: "dead permanent"},
		{name: "retryable mark", err: consumer.Retryable(plain), want: "retry 1s"},
		{name: "retry after", err: consumer.RetryAfter(5*time.Second, plain), want: "retry 5s"},
		{name: "retry after capped by default", err: consumer.RetryAfter(3*time.Hour, plain), want: "retry 1h0m0s"},
		{name: "retry after capped by policy", mod: func(c *middleware.RetryConfig) { c.MaxRetryAfter = time.Minute },
			err: consumer.RetryAfter(3*time.Hour, plain), want: "retry 1m0s"},
		{name: "Retryable() true", err: fmt.Errorf("x: %w", retryMarked(true)), want: "retry 1s"},
		{name: "Retryable() false", err: retryMarked(false), want: "dead permanent"},
		{name: "Retryable() beats Unknown", mod: func(c *middleware.RetryConfig) { c.Unknown = middleware.ClassPermanent },
			err: retryMarked(true), want: "retry 1s"},
		{name: "net timeout", err: fmt.Errorf("dial: %w", retryNetErr{timeout: true}), want: "retry 1s"},
		{name: "net timeout beats Unknown", mod: func(c *middleware.RetryConfig) { c.Unknown = middleware.ClassPermanent },
			err: &net.OpError{Op: "read", Err: retryNetErr{timeout: true}}, want: "retry 1s"},
		{name: "net non-timeout is unknown", mod: func(c *middleware.RetryConfig) { c.Unknown = middleware.ClassPermanent },
			err: retryNetErr{timeout: false}, want: "dead permanent"},
		{name: "job timeout", mod: func(c *middleware.RetryConfig) { c.Unknown = middleware.ClassPermanent },
			err: fmt.Errorf("%w: slow", middleware.ErrJobTimeout), want: "retry 1s"},
		{name: "deadline exceeded", mod: func(c *middleware.RetryConfig) { c.Unknown = middleware.ClassPermanent },
			err: fmt.Errorf("query: %w", context.DeadlineExceeded), want: "retry 1s"},
		{name: "payload decode error", err: badPayload, want: "dead permanent"},
		{name: "unknown is retryable by default", err: plain, want: "retry 1s"},
		{name: "unknown configured permanent", mod: func(c *middleware.RetryConfig) { c.Unknown = middleware.ClassPermanent },
			err: plain, want: "dead permanent"},
		{name: "canceled is unknown", mod: func(c *middleware.RetryConfig) { c.Unknown = middleware.ClassPermanent },
			err: context.Canceled, want: "dead permanent"},
		{name: "user permanent", mod: func(c *middleware.RetryConfig) { c.Classify = toPermanent },
			err: plain, want: "dead permanent"},
		{name: "user beats payload rule", mod: func(c *middleware.RetryConfig) { c.Classify = toRetryable },
			err: badPayload, want: "retry 1s"},
		{name: "user beats permanent mark", mod: func(c *middleware.RetryConfig) { c.Classify = toRetryable },
			err: consumer.Permanent(plain), want: "retry 1s"},
		{name: "user default falls through", mod: func(c *middleware.RetryConfig) { c.Classify = toDefault },
			err: consumer.Permanent(plain), want: "dead permanent"},
		{name: "user not asked about outcomes", mod: func(c *middleware.RetryConfig) { c.Classify = toPermanent },
			err: snooze, want: "snooze 1m0s", same: true},
		{name: "shutdown untouched", ctx: shutdownCtx, err: context.Canceled, want: "error: context canceled", same: true},
		{name: "shutdown deadline untouched", ctx: shutdownCtx, err: context.DeadlineExceeded, want: "error: context deadline exceeded", same: true},
		{name: "shutdown permanent untouched", ctx: shutdownCtx, err: consumer.Permanent(plain), want: "error: plain", same: true},
		{name: "lease lost untouched", ctx: leaseCtx, err: plain, want: "error: plain", same: true},
		{name: "shutdown error untouched", err: fmt.Errorf("x: %w", consumer.ErrShutdown), want: "error: x: " + consumer.ErrShutdown.Error(), same: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			cfg := base
			if tc.mod != nil {
				tc.mod(&cfg)
			}
			got := retryRun(ctx, cfg, &stream.Job{ID: "j", Type: "t"}, tc.err)
			if d := retryDescribe(got); d != tc.want {
				t.Errorf("outcome of %v = %q, want %q", tc.err, d, tc.want)
			}
			if tc.same && got != tc.err {
				t.Errorf("returned %#v, want the handler's own error %#v", got, tc.err)
			}
			if tc.err != nil && !errors.Is(got, tc.err) {
				t.Errorf("outcome %v does not wrap the handler's error %v", got, tc.err)
			}
		})
	}
}

func TestRetry_Attempts(t *testing.T) {
	t.Parallel()
	fail := errors.New("fail")
	cfg := middleware.RetryConfig{
		Backoff: middleware.Backoff{Base: time.Second, Cap: time.Hour, Jitter: middleware.JitterNone},
		PerType: map[string]middleware.Backoff{"fast": {Base: time.Millisecond, Cap: 4 * time.Millisecond, Jitter: middleware.JitterNone}},
	}
	small := cfg
	small.MaxAttempts = 3
	for _, tc := range []struct {
		name string
		cfg  middleware.RetryConfig
		job  stream.Job
		want string
	}{
		{"first attempt", cfg, stream.Job{Attempt: 0}, "retry 1s"},
		{"backoff from the job's attempt", cfg, stream.Job{Attempt: 5}, "retry 32s"},
		{"default max attempts, not last", cfg, stream.Job{Attempt: 23}, "retry 1h0m0s"},
		{"default max attempts (25), last", cfg, stream.Job{Attempt: 24}, "dead exhausted"},
		{"policy max attempts, not last", small, stream.Job{Attempt: 1}, "retry 2s"},
		{"policy max attempts, last", small, stream.Job{Attempt: 2}, "dead exhausted"},
		{"job max attempts beats policy", small, stream.Job{Attempt: 2, MaxAttempts: 4}, "retry 4s"},
		{"job max attempts, last", cfg, stream.Job{Attempt: 3, MaxAttempts: 4}, "dead exhausted"},
		{"job max attempts 1", cfg, stream.Job{Attempt: 0, MaxAttempts: 1}, "dead exhausted"},
		{"per type backoff", cfg, stream.Job{Type: "fast", Attempt: 1}, "retry 2ms"},
		{"per type cap", cfg, stream.Job{Type: "fast", Attempt: 9}, "retry 4ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			job := tc.job
			got := retryRun(context.Background(), tc.cfg, &job, fail)
			if d := retryDescribe(got); d != tc.want {
				t.Errorf("outcome = %q, want %q", d, tc.want)
			}
			if !errors.Is(got, fail) {
				t.Errorf("outcome %v does not wrap the handler's error", got)
			}
		})
	}

	t.Run("retry after exhausted too", func(t *testing.T) {
		t.Parallel()
		got := retryRun(context.Background(), cfg, &stream.Job{Attempt: 1, MaxAttempts: 2}, consumer.RetryAfter(time.Second, fail))
		if d := retryDescribe(got); d != "dead exhausted" {
			t.Errorf("outcome = %q, want dead exhausted", d)
		}
	})
}

func TestRetry_Panic(t *testing.T) {
	t.Parallel()
	panicking := consumer.HandlerFunc(func(context.Context, *stream.Job) error { panic("boom") })
	backoff := middleware.Backoff{Base: time.Second, Jitter: middleware.JitterNone}

	t.Run("dead-letter by default", func(t *testing.T) {
		t.Parallel()
		err := middleware.Retry(middleware.RetryConfig{})(panicking).Process(context.Background(), &stream.Job{})
		if d := retryDescribe(err); d != "dead panic" {
			t.Fatalf("outcome = %q, want dead panic", d)
		}
		var pe *consumer.PanicError
		if !errors.As(err, &pe) || pe.Value != "boom" || !strings.Contains(string(pe.Stack), "TestRetry_Panic") {
			t.Fatalf("outcome %v carries no PanicError with the value and the stack", err)
		}
	})
	t.Run("retry by policy", func(t *testing.T) {
		t.Parallel()
		mw := middleware.Retry(middleware.RetryConfig{PanicPolicy: middleware.PanicRetry, Backoff: backoff})
		err := mw(panicking).Process(context.Background(), &stream.Job{Attempt: 1})
		var pe *consumer.PanicError
		if d := retryDescribe(err); d != "retry 2s" || !errors.As(err, &pe) {
			t.Fatalf("outcome = %q (%v), want retry 2s with the PanicError", d, err)
		}
		err = mw(panicking).Process(context.Background(), &stream.Job{Attempt: 1, MaxAttempts: 2})
		if d := retryDescribe(err); d != "dead exhausted" {
			t.Fatalf("last attempt: outcome = %q, want dead exhausted", d)
		}
	})
	t.Run("panic error returned by an inner middleware", func(t *testing.T) {
		t.Parallel()
		pe := &consumer.PanicError{Value: "inner", Stack: []byte("stack")}
		if d := retryDescribe(retryRun(context.Background(), middleware.RetryConfig{}, &stream.Job{}, pe)); d != "dead panic" {
			t.Errorf("default policy: outcome = %q, want dead panic", d)
		}
		cfg := middleware.RetryConfig{PanicPolicy: middleware.PanicRetry, Backoff: backoff}
		if d := retryDescribe(retryRun(context.Background(), cfg, &stream.Job{}, pe)); d != "retry 1s" {
			t.Errorf("PanicRetry: outcome = %q, want retry 1s", d)
		}
	})
}

func TestRetry_Rand(t *testing.T) {
	t.Parallel()
	fail := errors.New("fail")
	delays := func(r *rand.Rand, parallel bool) []time.Duration {
		mw := middleware.Retry(middleware.RetryConfig{Rand: r, Backoff: middleware.Backoff{Jitter: middleware.JitterFull}})
		h := mw(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return fail }))
		out := make([]time.Duration, 50)
		var wg sync.WaitGroup
		for i := range out {
			run := func() {
				var o *consumer.Outcome
				if !errors.As(h.Process(context.Background(), &stream.Job{Attempt: 3}), &o) {
					t.Error("no outcome")
					return
				}
				out[i] = o.Delay()
			}
			if parallel {
				wg.Go(run)
			} else {
				run()
			}
		}
		wg.Wait()
		return out
	}
	a, b := delays(rand.New(rand.NewPCG(9, 9)), false), delays(rand.New(rand.NewPCG(9, 9)), false)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("same seed, different delays:\n%v\n%v", a, b)
	}
	// One Rand shared by concurrent jobs: the race detector checks that the
	// middleware serialises it.
	delays(rand.New(rand.NewPCG(1, 1)), true)
}
