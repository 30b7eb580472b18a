package middleware

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [RetryConfig] and [Backoff].
const (
	DefaultBackoffBase      = time.Second
	DefaultBackoffCap       = 10 * time.Minute
	DefaultRetryMaxAttempts = 25
	DefaultMaxRetryAfter    = time.Hour
)

// Jitter is how [Backoff] randomises a delay, so that jobs that failed
// together do not all retry together.
type Jitter int

const (
	// JitterEqual waits between half and all of the raw delay: [raw/2, raw].
	// It is the zero value, and so the default.
	JitterEqual Jitter = iota
	// JitterFull waits between nothing and the raw delay: [0, raw].
	JitterFull
	// JitterNone waits exactly the raw delay.
	JitterNone
)

// Backoff is an exponential backoff: the raw delay before the retry that
// follows attempt n (0 for the first run) is min(Cap, Base·2ⁿ), randomised
// by Jitter.
type Backoff struct {
	// Base is the raw delay after the first attempt. Defaults to
	// [DefaultBackoffBase].
	Base time.Duration
	// Cap bounds the raw delay. Defaults to [DefaultBackoffCap].
	Cap time.Duration
	// Jitter randomises the delay. Defaults to [JitterEqual].
	Jitter Jitter
}

// Raw returns the delay before jitter after attempt earlier attempts:
// min(Cap, Base·2^attempt), without overflow for any attempt. A negative
// attempt counts as 0.
func (b Backoff) Raw(attempt int) time.Duration {
	base, ceil := b.Base, b.Cap
	if base <= 0 {
		base = DefaultBackoffBase
	}
	if ceil <= 0 {
		ceil = DefaultBackoffCap
	}
	attempt = max(attempt, 0)
	if attempt >= 62 || base > ceil>>uint(attempt) {
		return ceil
	}
	return min(base<<uint(attempt), ceil)
}

// Delay returns the delay before the retry that follows attempt earlier
// attempts: [Backoff.Raw] randomised by b.Jitter, drawn from r (the
// process-wide source when r is nil). A *rand.Rand is not safe for
// concurrent use: the caller serialises calls that share one.
func (b Backoff) Delay(attempt int, r *rand.Rand) time.Duration {
	raw := b.Raw(attempt)
	switch b.Jitter {
	case JitterNone:
		return raw
	case JitterFull:
		return retryUniform(r, 0, raw)
	default:
		return retryUniform(r, raw/2, raw)
	}
}

// retryUniform returns a uniform duration in [lo, hi], drawn from r or, when
// r is nil, the process-wide source.
func retryUniform(r *rand.Rand, lo, hi time.Duration) time.Duration {
	n := int64(hi - lo)
	if n < math.MaxInt64 {
		n++ // inclusive of hi
	}
	if n <= 0 {
		return lo
	}
	if r == nil {
		return lo + time.Duration(rand.Int64N(n))
	}
	return lo + time.Duration(r.Int64N(n))
}

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

// PanicPolicy is what the retry middleware does with a job whose handler
// panicked.
type PanicPolicy int

const (
	// PanicDeadLetter dead-letters the job at once with reason
	// [consumer.ReasonPanic] and the stack. It is the default.
	PanicDeadLetter PanicPolicy = iota
	// PanicRetry treats the panic as a retryable error.
	PanicRetry
)

// RetryConfig configures [Retry]. Zero values mean the defaults.
type RetryConfig struct {
	// Backoff is the delay policy of retryable errors. Defaults to the zero
	// Backoff: 1s doubling, capped at 10m, equal jitter.
	Backoff Backoff
	// Classify, if set, is asked first about every error that is not
	// already a [consumer.Outcome]; ClassDefault falls through to the
	// built-in rules. It must not block. Defaults to nil: the built-in
	// rules only.
	Classify func(job *stream.Job, err error) Class
	// MaxAttempts is the number of attempts of a job whose max_attempts
	// field is 0; a retryable failure of the last attempt dead-letters the
	// job with reason [consumer.ReasonExhausted]. Keep it at most the
	// consumer's Config.MaxAttempts, which the core enforces as well.
	// Defaults to [DefaultRetryMaxAttempts].
	MaxAttempts int
	// MaxRetryAfter caps the delay of a [consumer.RetryAfter] error.
	// Defaults to [DefaultMaxRetryAfter].
	MaxRetryAfter time.Duration
	// PanicPolicy decides what a panic does. Defaults to [PanicDeadLetter].
	PanicPolicy PanicPolicy
	// PerType holds the backoff of job types that need their own; a type
	// not in it uses Backoff. An entry's zero fields mean the package
	// defaults, not Backoff's. Defaults to nil: every type uses Backoff.
	PerType map[string]Backoff
	// Rand is the source of jitter, for reproducible tests; calls are
	// serialised. Defaults to nil: the process-wide source.
	Rand *rand.Rand
	// Unknown is the class of an error no rule recognises. Defaults to
	// ClassRetryable.
	Unknown Class
}

// Retry returns a middleware that turns the errors of the handler (and of
// the middleware inside it) into outcomes for the consumer:
//
//   - nil, and errors that already are a [consumer.Outcome] (Retry, Snooze,
//     Dead), pass through untouched;
//   - errors returned while the consumer cancelled the job's context with
//     [consumer.ErrShutdown] or [consumer.ErrLeaseLost] pass through
//     untouched, so that the core leaves the job pending for another consumer;
//   - a panic is recovered into a [consumer.PanicError] and handled by
//     RetryConfig.PanicPolicy;
//   - every other error is classified, the first rule that answers winning:
//     RetryConfig.Classify; the marks of [consumer.Permanent],
//     [consumer.Retryable] and [consumer.RetryAfter]; a Retryable() bool
//     method (false means permanent); a timeout (a net.Error whose Timeout()
//     is true, context.DeadlineExceeded, [ErrJobTimeout]); [stream.ErrPayload]
//     (permanent); RetryConfig.Unknown.
//
// A permanent error becomes consumer.Dead(consumer.ReasonPermanent, err). A
// retryable one becomes consumer.Retry(delay, err), with the RetryAfter delay
// capped by MaxRetryAfter or else the backoff of the job's type for its
// attempt (job.Attempt, persisted in the entry); on the job's last attempt it
// becomes consumer.Dead(consumer.ReasonExhausted, err).
func Retry(cfg RetryConfig) consumer.Middleware {
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultRetryMaxAttempts
	}
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if cfg.Unknown == ClassDefault {
		cfg.Unknown = ClassRetryable
	}
	p := &retryPolicy{cfg: cfg}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			return p.decide(ctx, job, p.call(ctx, job, next))
		})
	}
}

// retryPolicy is one Retry middleware's resolved configuration.
type retryPolicy struct {
	cfg RetryConfig
	mu  sync.Mutex // serialises cfg.Rand
}

// call runs next, recovering a panic into a *consumer.PanicError.
func (p *retryPolicy) call(ctx context.Context, job *stream.Job, next consumer.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &consumer.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return next.Process(ctx, job)
}

// decide turns err into the outcome the consumer applies.
func (p *retryPolicy) decide(ctx context.Context, job *stream.Job, err error) error {
	if err == nil {
		return nil
	}
	if retryConsumerCancelled(ctx, err) {
		return err
	}
	var o *consumer.Outcome
	if errors.As(err, &o) {
		return err
	}
	var pe *consumer.PanicError
	if errors.As(err, &pe) {
		if p.cfg.PanicPolicy == PanicDeadLetter {
			return consumer.Dead(consumer.ReasonPanic, err)
		}
		return p.retry(job, 0, err)
	}
	class, after := p.classify(job, err)
	if class == ClassPermanent {
		return consumer.Dead(consumer.ReasonPermanent, err)
	}
	return p.retry(job, after, err)
}

// retry returns the outcome of a retryable err: a retry after the given
// delay (the backoff when after is 0), or dead-lettering when the job has no
// attempt left.
func (p *retryPolicy) retry(job *stream.Job, after time.Duration, err error) error {
	maxAttempts := job.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = p.cfg.MaxAttempts
	}
	if job.Attempt+1 >= maxAttempts {
		return consumer.Dead(consumer.ReasonExhausted, consumer.ExhaustedError(job.Attempt+1, maxAttempts, err))
	}
	if after > 0 {
		return consumer.Retry(min(after, p.cfg.MaxRetryAfter), err)
	}
	b, ok := p.cfg.PerType[job.Type]
	if !ok {
		b = p.cfg.Backoff
	}
	if p.cfg.Rand == nil {
		return consumer.Retry(b.Delay(job.Attempt, nil), err)
	}
	p.mu.Lock()
	d := b.Delay(job.Attempt, p.cfg.Rand)
	p.mu.Unlock()
	return consumer.Retry(d, err)
}

// classify returns err's class (never ClassDefault) and, for a RetryAfter
// error, its delay.
func (p *retryPolicy) classify(job *stream.Job, err error) (Class, time.Duration) {
	if p.cfg.Classify != nil {
		if c := p.cfg.Classify(job, err); c != ClassDefault {
			return c, 0
		}
	}
	var ce *consumer.ClassifiedError
	if errors.As(err, &ce) {
		if ce.Permanent {
			return ClassPermanent, 0
		}
		return ClassRetryable, ce.After
	}
	var r interface{ Retryable() bool }
	if errors.As(err, &r) {
		if r.Retryable() {
			return ClassRetryable, 0
		}
		return ClassPermanent, 0
	}
	var ne net.Error
	if errors.Is(err, ErrJobTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) {
		return ClassRetryable, 0
	}
	if errors.Is(err, stream.ErrPayload) {
		return ClassPermanent, 0
	}
	return p.cfg.Unknown, 0
}

// retryConsumerCancelled reports whether err came from the consumer taking
// the job back (shutdown past the drain deadline, lease lost): such a job
// must not be settled by this consumer, whatever the handler returned.
func retryConsumerCancelled(ctx context.Context, err error) bool {
	cause := context.Cause(ctx)
	return errors.Is(cause, consumer.ErrShutdown) || errors.Is(cause, consumer.ErrLeaseLost) ||
		errors.Is(err, consumer.ErrShutdown) || errors.Is(err, consumer.ErrLeaseLost)
}
