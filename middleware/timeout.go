package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// ErrJobTimeout is the cause with which [Timeout] cancels a job's context
// when the job's time is up, and is wrapped by the error the middleware then
// returns. [Retry] classifies it as retryable, unlike a cancellation by the
// consumer ([consumer.ErrShutdown], [consumer.ErrLeaseLost]).
var ErrJobTimeout = errors.New("middleware: job timeout")

// TimeoutConfig configures [Timeout]. Zero values mean the defaults.
type TimeoutConfig struct {
	// Default is the time a job of a type not in PerType may run. Zero or
	// negative means no limit. Defaults to 0.
	Default time.Duration
	// PerType holds the time limits of job types that need their own; an
	// entry of zero or less removes the limit for that type. Defaults to
	// nil: every type uses Default.
	PerType map[string]time.Duration
}

// Timeout returns a middleware that bounds the run of each job: the handler's
// context is cancelled with cause [ErrJobTimeout] (context.Cause; ctx.Err()
// is context.DeadlineExceeded) once the job's time limit passes. A handler
// that then returns an error has it wrapped so that errors.Is(err,
// ErrJobTimeout) holds (a [consumer.Outcome] is passed through as it is),
// and the [Retry] middleware outside retries it. A handler that returns nil
// succeeded, late or not. Like every context deadline, it only works for
// handlers that watch ctx.
func Timeout(cfg TimeoutConfig) consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			d := cfg.Default
			if v, ok := cfg.PerType[job.Type]; ok {
				d = v
			}
			if d <= 0 {
				return next.Process(ctx, job)
			}
			tctx, cancel := context.WithTimeoutCause(ctx, d, ErrJobTimeout)
			defer cancel()
			err := next.Process(tctx, job)
			if err == nil || !errors.Is(context.Cause(tctx), ErrJobTimeout) || errors.Is(err, ErrJobTimeout) {
				return err
			}
			var o *consumer.Outcome
			if errors.As(err, &o) {
				return err
			}
			return fmt.Errorf("%w after %v: %w", ErrJobTimeout, d, err)
		})
	}
}
