package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// timeoutWaiting is a handler that waits for its context and returns its
// error, reporting the deadline and cause it saw.
func timeoutWaiting(deadline *time.Duration, cause *error) consumer.HandlerFunc {
	return func(ctx context.Context, job *stream.Job) error {
		if d, ok := ctx.Deadline(); ok {
			*deadline = time.Until(d)
		} else {
			*deadline = -1
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			return errors.New("context never done")
		}
		*cause = context.Cause(ctx)
		return ctx.Err()
	}
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	cfg := middleware.TimeoutConfig{
		Default: 20 * time.Millisecond,
		PerType: map[string]time.Duration{"slow": 40 * time.Millisecond, "free": 0},
	}

	for _, tc := range []struct {
		typ   string
		limit time.Duration
	}{{"any", 20 * time.Millisecond}, {"slow", 40 * time.Millisecond}} {
		t.Run("limit "+tc.typ, func(t *testing.T) {
			t.Parallel()
			var deadline time.Duration
			var cause error
			start := time.Now()
			err := middleware.Timeout(cfg)(timeoutWaiting(&deadline, &cause)).Process(context.Background(), &stream.Job{Type: tc.typ})
			if took := time.Since(start); took < tc.limit {
				t.Errorf("returned after %v, before the limit %v", took, tc.limit)
			}
			if deadline <= 0 || deadline > tc.limit {
				t.Errorf("handler's deadline in %v, want within (0, %v]", deadline, tc.limit)
			}
			if cause != middleware.ErrJobTimeout {
				t.Errorf("handler's context cause = %v, want ErrJobTimeout", cause)
			}
			if !errors.Is(err, middleware.ErrJobTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v does not wrap both ErrJobTimeout and the handler's error", err)
			}
		})
	}

	t.Run("no limit", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name string
			cfg  middleware.TimeoutConfig
			typ  string
		}{{"zero config", middleware.TimeoutConfig{}, "any"}, {"type without limit", cfg, "free"},
			{"negative", middleware.TimeoutConfig{Default: -time.Second}, "any"}} {
			var deadline bool
			h := middleware.Timeout(c.cfg)(consumer.HandlerFunc(func(ctx context.Context, _ *stream.Job) error {
				_, deadline = ctx.Deadline()
				return nil
			}))
			if err := h.Process(context.Background(), &stream.Job{Type: c.typ}); err != nil || deadline {
				t.Errorf("%s: err %v, deadline set %v; want nil and none", c.name, err, deadline)
			}
		}
	})

	t.Run("results after the timeout", func(t *testing.T) {
		t.Parallel()
		late := func(ret error) consumer.Handler {
			return middleware.Timeout(middleware.TimeoutConfig{Default: time.Millisecond})(consumer.HandlerFunc(
				func(ctx context.Context, _ *stream.Job) error {
					<-ctx.Done()
					return ret
				}))
		}
		if err := late(nil).Process(context.Background(), &stream.Job{}); err != nil {
			t.Errorf("late success: %v, want nil", err)
		}
		snooze := consumer.Snooze(time.Second)
		if err := late(snooze).Process(context.Background(), &stream.Job{}); err != snooze {
			t.Errorf("late outcome: %v, want the outcome untouched", err)
		}
		own := errors.New("i/o")
		if err := late(own).Process(context.Background(), &stream.Job{}); !errors.Is(err, own) || !errors.Is(err, middleware.ErrJobTimeout) {
			t.Errorf("late error: %v, want it wrapped with ErrJobTimeout", err)
		}
	})

	t.Run("error before the timeout", func(t *testing.T) {
		t.Parallel()
		own := errors.New("quick failure")
		h := middleware.Timeout(cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return own }))
		if err := h.Process(context.Background(), &stream.Job{}); err != own {
			t.Errorf("err = %v, want the handler's own", err)
		}
	})

	t.Run("consumer cancellation is not a timeout", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(consumer.ErrShutdown)
		var deadline time.Duration
		var cause error
		h := middleware.Retry(middleware.RetryConfig{})(middleware.Timeout(cfg)(timeoutWaiting(&deadline, &cause)))
		err := h.Process(ctx, &stream.Job{})
		if cause != consumer.ErrShutdown || errors.Is(err, middleware.ErrJobTimeout) || err != context.Canceled {
			t.Errorf("cause %v, err %v; want ErrShutdown and context.Canceled untouched", cause, err)
		}
	})

	t.Run("retried inside Retry", func(t *testing.T) {
		t.Parallel()
		var deadline time.Duration
		var cause error
		h := middleware.Retry(middleware.RetryConfig{Unknown: middleware.ClassPermanent})(
			middleware.Timeout(middleware.TimeoutConfig{Default: time.Millisecond})(timeoutWaiting(&deadline, &cause)))
		job := &stream.Job{}
		err := h.Process(context.Background(), job)
		if consumer.Decide(context.Background(), job, err).Kind != consumer.KindRetry || !errors.Is(err, middleware.ErrJobTimeout) {
			t.Errorf("err = %v, want a retry of the job timeout", err)
		}
	})
}
