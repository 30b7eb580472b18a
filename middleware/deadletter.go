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
	// OnDeadLetter, if set, is called after the job was written to the
	// dead-letter stream, with d.DeadEntryID set: for alerting. ctx carries
	// the job's context values but is not cancelled with it. It runs in the
	// job's worker slot: keep it short, or hand the work off. Defaults to
	// nil.
	OnDeadLetter func(ctx context.Context, d consumer.DeadLetter)
	// Redact, if set, returns field values that replace the job's own in its
	// dead-letter copy, such as {"payload": "<redacted>"}; fields the entry
	// does not have are ignored, and the source entry is left as it is. It
	// must not block. Defaults to nil: the copy holds the raw fields.
	Redact func(job *stream.Job) map[string]string
}

// DeadLetter returns a middleware that owns how dead jobs are recorded. For
// each job, before calling the next handler, it registers with
// [consumer.SetDeadLetterRecorder] a recorder that applies Redact and
// OnDeadLetter, so both apply whoever dead-letters the job: the handler, a
// middleware inside or outside this one (the [Retry] middleware on the last
// attempt), or the consumer itself. Where dead jobs go and how many are kept
// is the consumer's Config.DeadLetterStream and Config.DeadLetterMaxLen (the
// entries trimmed are counted in Stats.DeadTrimmed and logged, never dropped
// silently). A job older than MaxAge is dead-lettered with reason
// [ReasonExpired] without calling the next handler.
//
// An entry that does not decode as a job never reaches the middleware: the
// consumer dead-letters it raw, with reason [consumer.ReasonMalformed].
func DeadLetter(cfg DeadLetterConfig) consumer.Middleware {
	rec := &deadLetterRecorder{cfg: cfg}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if cfg.Redact != nil || cfg.OnDeadLetter != nil {
				consumer.SetDeadLetterRecorder(ctx, rec)
			}
			if cfg.MaxAge > 0 && !job.CreatedAt.IsZero() {
				if age := time.Since(job.CreatedAt); age > cfg.MaxAge {
					return consumer.Dead(ReasonExpired, fmt.Errorf("middleware: job created %v ago, older than MaxAge %v",
						age.Round(time.Millisecond), cfg.MaxAge))
				}
			}
			return next.Process(ctx, job)
		})
	}
}

// deadLetterRecorder is the consumer.DeadLetterRecorder of a DeadLetter
// middleware.
type deadLetterRecorder struct {
	cfg DeadLetterConfig
}

// Replace implements consumer.DeadLetterRecorder.
func (r *deadLetterRecorder) Replace(d consumer.DeadLetter) map[string]string {
	if r.cfg.Redact == nil || d.Job == nil {
		return nil
	}
	return r.cfg.Redact(d.Job)
}

// Recorded implements consumer.DeadLetterRecorder.
func (r *deadLetterRecorder) Recorded(ctx context.Context, d consumer.DeadLetter) {
	if r.cfg.OnDeadLetter != nil {
		r.cfg.OnDeadLetter(context.WithoutCancel(ctx), d)
	}
}
