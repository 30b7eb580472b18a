package middleware

import (
	"context"
	"fmt"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// ReasonExpired is the dead-letter reason of a job older than
// [DeadLetterConfig.MaxAge], dead-lettered without running.
const ReasonExpired = "expired"

// DeadLetterConfig configures [DeadLetter]. Zero values mean the defaults.
type DeadLetterConfig struct {
	// MaxAge, when positive, is the age (since the job's created_at, kept
	// across retries, measured with this process's clock) past which a job
	// is dead-lettered with reason [ReasonExpired] instead of running.
	// Defaults to 0: no limit.
	MaxAge time.Duration
}

// Validate reports the first field of cfg that is out of range, named.
func (cfg DeadLetterConfig) Validate() error {
	if cfg.MaxAge < 0 {
		return fmt.Errorf("middleware: DeadLetterConfig.MaxAge (%v) must not be negative", cfg.MaxAge)
	}
	return nil
}

// DeadLetter returns a middleware that dead-letters a job older than
// MaxAge with reason [ReasonExpired] without calling the next handler.
// How every dead job is recorded is the consumer's: where it goes and how
// many are kept (Config.DeadLetterStream, Config.DeadLetterMaxLen), the
// redaction of its fields (Config.RedactDeadLetter) and the alert hook
// (Config.OnDeadLetter), whoever decides the death.
//
// An invalid cfg makes [consumer.Consumer.Run] fail (see
// [consumer.Invalid]).
func DeadLetter(cfg DeadLetterConfig) consumer.Middleware {
	if err := cfg.Validate(); err != nil {
		return consumer.Invalid(err)
	}
	return func(next consumer.Handler) consumer.Handler {
		if cfg.MaxAge == 0 {
			return next
		}
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if !job.CreatedAt.IsZero() {
				if age := time.Since(job.CreatedAt); age > cfg.MaxAge {
					return consumer.Dead(ReasonExpired, fmt.Errorf("middleware: job created %v ago, older than MaxAge %v",
						age.Round(time.Millisecond), cfg.MaxAge))
				}
			}
			return next.Process(ctx, job)
		})
	}
}
