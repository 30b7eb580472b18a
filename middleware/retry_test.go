package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// retryDescribe names the outcome of err: "nil", "retry <delay>",
// "snooze <delay>", "dead <reason>", "retryable" (marked by
// consumer.Retryable: the consumer's backoff), or "error: <text>" for an
// error that is no outcome.
func retryDescribe(err error) string {
	if err == nil {
		return "nil"
	}
	var o *consumer.Outcome
	var ce *consumer.ClassifiedError
	switch {
	case errors.As(err, &o):
	case errors.As(err, &ce) && !ce.Permanent && ce.After == 0:
		return "retryable"
	default:
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
	// The job's type has a backoff without jitter: a retry after attempt 0
	// waits 1s.
	base := middleware.RetryConfig{PerType: map[string]consumer.Backoff{"t": {Base: time.Second, Jitter: consumer.JitterNone}}}
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

// retryDecided names what the consumer decides about what Retry returned.
func retryDecided(ctx context.Context, job *stream.Job, err error) string {
	d := consumer.Decide(ctx, job, err)
	switch d.Kind {
	case consumer.KindRetry, consumer.KindSnooze:
		return fmt.Sprintf("%s %v", d.Kind, d.Delay)
	case consumer.KindDead:
		return "dead " + d.Reason
	}
	return string(d.Kind)
}

// The attempt limit is the consumer's (the job's AttemptLimit, else its
// max_attempts, else the default 25): Retry only classifies, and the
// consumer turns a retry of the last attempt into a dead letter.
func TestRetry_Attempts(t *testing.T) {
	t.Parallel()
	fail := errors.New("fail")
	cfg := middleware.RetryConfig{PerType: map[string]consumer.Backoff{
		"":     {Base: time.Second, Cap: time.Hour, Jitter: consumer.JitterNone},
		"fast": {Base: time.Millisecond, Cap: 4 * time.Millisecond, Jitter: consumer.JitterNone},
	}}
	for _, tc := range []struct {
		name string
		job  stream.Job
		want string
	}{
		{"first attempt", stream.Job{Attempt: 0}, "retry 1s"},
		{"backoff from the job's attempt", stream.Job{Attempt: 5}, "retry 32s"},
		{"default max attempts, not last", stream.Job{Attempt: 23}, "retry 1h0m0s"},
		{"default max attempts (25), last", stream.Job{Attempt: 24}, "dead exhausted"},
		{"consumer's limit, not last", stream.Job{Attempt: 1, AttemptLimit: 3}, "retry 2s"},
		{"consumer's limit, last", stream.Job{Attempt: 2, AttemptLimit: 3}, "dead exhausted"},
		{"job max attempts, last", stream.Job{Attempt: 3, MaxAttempts: 4}, "dead exhausted"},
		{"job max attempts 1", stream.Job{Attempt: 0, MaxAttempts: 1}, "dead exhausted"},
		{"per type backoff", stream.Job{Type: "fast", Attempt: 1}, "retry 2ms"},
		{"per type cap", stream.Job{Type: "fast", Attempt: 9}, "retry 4ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			job := tc.job
			got := retryRun(context.Background(), cfg, &job, fail)
			if d := retryDecided(context.Background(), &job, got); d != tc.want {
				t.Errorf("outcome = %q, want %q", d, tc.want)
			}
			if !errors.Is(got, fail) {
				t.Errorf("outcome %v does not wrap the handler's error", got)
			}
		})
	}

	t.Run("retry after exhausted too", func(t *testing.T) {
		t.Parallel()
		job := &stream.Job{Attempt: 1, MaxAttempts: 2}
		got := retryRun(context.Background(), cfg, job, consumer.RetryAfter(time.Second, fail))
		if d := retryDecided(context.Background(), job, got); d != "dead exhausted" {
			t.Errorf("outcome = %q, want dead exhausted", d)
		}
	})

	t.Run("no per-type entry: the consumer's backoff", func(t *testing.T) {
		t.Parallel()
		job := &stream.Job{ID: "j", EntryID: "1-0", Type: "other", Attempt: 20}
		got := retryRun(context.Background(), cfg, job, fail)
		if d := retryDescribe(got); d != "retryable" {
			t.Fatalf("Retry returned %q, want the error marked retryable, its delay left to the consumer", d)
		}
		if d := consumer.Decide(context.Background(), job, got); d.Kind != consumer.KindRetry || d.Delay > consumer.DefaultBackoffCap {
			t.Errorf("decided %+v, want a retry within the core's cap %v", d, consumer.DefaultBackoffCap)
		}
	})
}

// Panics are the consumer's: Retry neither recovers them nor changes a
// PanicError an inner middleware returned.
func TestRetry_Panic(t *testing.T) {
	t.Parallel()
	t.Run("not recovered", func(t *testing.T) {
		t.Parallel()
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the handler's panic to pass through Retry", v)
			}
		}()
		_ = middleware.Retry(middleware.RetryConfig{})(consumer.HandlerFunc(func(context.Context, *stream.Job) error { panic("boom") })).
			Process(context.Background(), &stream.Job{})
		t.Error("Retry returned instead of letting the panic through")
	})
	t.Run("panic error untouched", func(t *testing.T) {
		t.Parallel()
		pe := &consumer.PanicError{Value: "inner", Stack: []byte("stack")}
		if got := retryRun(context.Background(), middleware.RetryConfig{}, &stream.Job{}, pe); got != pe {
			t.Errorf("Retry returned %v, want the PanicError itself", got)
		}
	})
}

func TestRetryConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  middleware.RetryConfig
		want string
	}{
		{middleware.RetryConfig{}, ""},
		{middleware.RetryConfig{MaxRetryAfter: -1}, "RetryConfig.MaxRetryAfter"},
		{middleware.RetryConfig{Unknown: 7}, "RetryConfig.Unknown"},
		{middleware.RetryConfig{PerType: map[string]consumer.Backoff{"x": {Cap: -1}}}, `RetryConfig.PerType["x"]: Backoff.Cap`},
		{middleware.RetryConfig{PerType: map[string]consumer.Backoff{"x": {Base: time.Hour, Cap: time.Minute}}}, `RetryConfig.PerType["x"]: Backoff.Base`},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: Validate() = %v, want naming %q", tc.cfg, err, tc.want)
		}
		// The middleware of an invalid config makes Run fail, before Redis.
		c := consumer.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), consumer.Config{Stream: "s", Group: "g"}).
			Use(middleware.Retry(tc.cfg)).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
		if tc.want != "" {
			if err := c.Run(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: Run = %v, want the Validate error", tc.cfg, err)
			}
		}
	}
}
