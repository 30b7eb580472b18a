package middleware

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [RetryConfig].
const (
	DefaultMaxRetryAfter = time.Hour
)

// Class is what the retry middleware makes of an error.
type Class int

const (
	// ClassDefault, returned by [RetryConfig.Classify], leaves the error to
	// the built-in rules. As [RetryConfig.Unknown] it means ClassRetryable.
	ClassDefault Class = iota
	// ClassRetryable: a later attempt may succeed.
	ClassRetryable
	// ClassPermanent: no attempt can succeed; the job is dead-lettered with
	// reason [consumer.ReasonPermanent].
	ClassPermanent
)

// String returns the class's name.
func (c Class) String() string {
	switch c {
	case ClassRetryable:
		return "retryable"
	case ClassPermanent:
		return "permanent"
	default:
		return "default"
	}
}

// RetryConfig configures [Retry]. Zero values mean the defaults.
type RetryConfig struct {
	// Classify, if set, is asked first about every error that is not
	// already a [consumer.Outcome]; ClassDefault falls through to the
	// built-in rules. It must not block. Defaults to nil: the built-in
	// rules only.
	Classify func(job *stream.Job, err error) Class
	// MaxRetryAfter caps the delay of a [consumer.RetryAfter] error.
	// Defaults to [DefaultMaxRetryAfter].
	MaxRetryAfter time.Duration
	// PerType holds the backoff of job types that need their own; a type
	// not in it is retried with the consumer's Config.Backoff. An entry's
	// zero fields mean consumer.Backoff's defaults (the consumer's, 1s
	// doubling capped at one hour). Defaults to nil: every type uses the
	// consumer's backoff.
	PerType map[string]consumer.Backoff
	// Unknown is the class of an error no rule recognises. Defaults to
	// ClassRetryable.
	Unknown Class
}

// Validate reports the first field of cfg that is out of range, named
// ("middleware: RetryConfig.MaxRetryAfter ...").
func (cfg RetryConfig) Validate() error {
	if cfg.MaxRetryAfter < 0 {
		return fmt.Errorf("middleware: RetryConfig.MaxRetryAfter (%v) must not be negative", cfg.MaxRetryAfter)
	}
	if cfg.Unknown < ClassDefault || cfg.Unknown > ClassPermanent {
		return fmt.Errorf("middleware: RetryConfig.Unknown (%d) is not a Class", cfg.Unknown)
	}
	for _, typ := range slices.Sorted(maps.Keys(cfg.PerType)) {
		if err := cfg.PerType[typ].Validate(); err != nil {
			return fmt.Errorf("middleware: RetryConfig.PerType[%q]: %v", typ, err)
		}
	}
	return nil
}

// Retry returns a middleware that classifies the errors of the handler
// (and of the middleware inside it) for the consumer, which decides and
// applies the outcome (see [consumer.Decide]):
//
//   - nil, errors that already are a [consumer.Outcome] (Retry, Snooze,
//     Dead) or a [consumer.PanicError], and errors returned while the
//     consumer takes the job back (its context cancelled with
//     [consumer.ErrShutdown] or [consumer.ErrLeaseLost]) pass through
//     untouched;
//   - every other error is classified, the first rule that answers winning:
//     RetryConfig.Classify; the marks of [consumer.Permanent],
//     [consumer.Retryable] and [consumer.RetryAfter]; a Retryable() bool
//     method (false means permanent); a timeout (a net.Error whose Timeout()
//     is true, context.DeadlineExceeded, [ErrJobTimeout]); [stream.ErrPayload]
//     (permanent); RetryConfig.Unknown.
//
// A permanent error becomes consumer.Dead(consumer.ReasonPermanent, err). A
// retryable one becomes consumer.Retry(delay, err) with the RetryAfter delay
// capped by MaxRetryAfter, or the backoff of the job's type when PerType has
// one, or else consumer.Retryable(err): the consumer's Config.Backoff. On
// the job's last attempt the consumer turns the retry into a dead letter
// with reason [consumer.ReasonExhausted]: the attempt limit is the
// consumer's (job.AttemptLimit), never the middleware's. Panics are the
// consumer's too ([consumer.Config.Panic]).
//
// An invalid cfg makes [consumer.Consumer.Run] fail (see
// [consumer.Invalid]).
func Retry(cfg RetryConfig) consumer.Middleware {
	if err := cfg.Validate(); err != nil {
		return consumer.Invalid(err)
	}
	if cfg.MaxRetryAfter == 0 {
		cfg.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if cfg.Unknown == ClassDefault {
		cfg.Unknown = ClassRetryable
	}
	p := &retryPolicy{cfg: cfg}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			return p.classifyOutcome(ctx, job, next.Process(ctx, job))
		})
	}
}

// retryPolicy is one Retry middleware's resolved configuration.
type retryPolicy struct {
	cfg RetryConfig
}

// classifyOutcome turns err into the outcome or class the consumer applies.
func (p *retryPolicy) classifyOutcome(ctx context.Context, job *stream.Job, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*consumer.Outcome](err); ok {
		return err
	}
	if _, ok := errors.AsType[*consumer.PanicError](err); ok {
		return err
	}
	if k := consumer.Decide(ctx, job, err).Kind; k == consumer.KindAbandoned || k == consumer.KindCancelled {
		return err
	}
	class, after := p.classify(job, err)
	switch {
	case class == ClassPermanent:
		return consumer.Dead(consumer.ReasonPermanent, err)
	case after > 0:
		return consumer.Retry(min(after, p.cfg.MaxRetryAfter), err)
	}
	if b, ok := p.cfg.PerType[job.Type]; ok {
		return consumer.Retry(b.Delay(job), err)
	}
	return consumer.Retryable(err)
}

// retryableError is an error that says whether it is worth retrying.
type retryableError interface {
	error
	Retryable() bool
}

// classify returns err's class (never ClassDefault) and, for a RetryAfter
// error, its delay.
func (p *retryPolicy) classify(job *stream.Job, err error) (Class, time.Duration) {
	if p.cfg.Classify != nil {
		if c := p.cfg.Classify(job, err); c != ClassDefault {
			return c, 0
		}
	}
	if ce, ok := errors.AsType[*consumer.ClassifiedError](err); ok {
		if ce.Permanent {
			return ClassPermanent, 0
		}
		return ClassRetryable, ce.After
	}
	if r, ok := errors.AsType[retryableError](err); ok {
		if r.Retryable() {
			return ClassRetryable, 0
		}
		return ClassPermanent, 0
	}
	if errors.Is(err, ErrJobTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return ClassRetryable, 0
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return ClassRetryable, 0
	}
	if errors.Is(err, stream.ErrPayload) {
		return ClassPermanent, 0
	}
	return p.cfg.Unknown, 0
}
