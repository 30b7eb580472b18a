package consumer

import (
	"errors"
	"fmt"
	"time"
)

// Dead-letter reasons written by the consumer in the dead_reason field.
const (
	// ReasonMalformed: the entry is not a valid job (stream.DecodeError).
	ReasonMalformed = "malformed"
	// ReasonUnknownType: no handler for the job's type (see [Mux]).
	ReasonUnknownType = "unknown_type"
	// ReasonCrashed: the job was running when its worker stopped without
	// settling it (crash, kill, stall past the lease) [Config.MaxCrashes]
	// times, in runs it can be blamed for.
	ReasonCrashed = "crashed"
	// ReasonPanic: the handler panicked.
	ReasonPanic = "panic"
	// ReasonExhausted: the job failed [Config.MaxAttempts] times.
	ReasonExhausted = "exhausted"
	// ReasonPermanent: the handler said the job can never succeed.
	ReasonPermanent = "permanent"
)

// ExhaustedError is the error of a job dead-lettered with reason
// [ReasonExhausted] because its attempt (counted from 1) of maxAttempts
// failed with err: "attempt 3 of 3: <err>". The consumer and the retry
// middleware both write it, so dead_error reads the same whoever decided.
func ExhaustedError(attempt, maxAttempts int, err error) error {
	return &exhaustedError{attempt: attempt, max: maxAttempts, err: err}
}

type exhaustedError struct {
	attempt, max int
	err          error
}

func (e *exhaustedError) Error() string {
	return fmt.Sprintf("attempt %d of %d: %s", e.attempt, e.max, errText(e.err))
}

func (e *exhaustedError) Unwrap() error { return e.err }

// Causes with which the consumer cancels a handler's context.
var (
	// ErrLeaseLost: the job's lease ended. Either the heartbeat found the
	// job reclaimed by another consumer, or the lease was not extended for
	// [Config.VisibilityTimeout] less a tenth (Redis unreachable, the process
	// stalled, or the heartbeat disabled), so that another consumer may take
	// the job over; the handler's context is then cancelled before that can
	// happen. The cause wraps ErrLeaseLost with which of the two it was. The
	// job is not settled by this consumer.
	ErrLeaseLost = errors.New("consumer: lease lost")
	// ErrShutdown: the consumer is shutting down and its drain deadline has
	// passed. A job whose handler then returns an error stays pending, for
	// another consumer.
	ErrShutdown = errors.New("consumer: shutting down")
)

type outcomeKind int

const (
	kindRetry outcomeKind = iota
	kindSnooze
	kindDead
)

// Outcome is a handler's decision about a failed job, made by [Retry],
// [Snooze] or [Dead] and found with errors.As.
type Outcome struct {
	kind   outcomeKind
	delay  time.Duration
	reason string
	err    error
}

// Error implements error.
func (o *Outcome) Error() string {
	var what string
	switch o.kind {
	case kindRetry:
		what = fmt.Sprintf("retry in %v", o.delay)
	case kindSnooze:
		what = fmt.Sprintf("snooze %v", o.delay)
	default:
		what = "dead-letter (" + o.reason + ")"
	}
	if o.err == nil {
		return what
	}
	return what + ": " + o.err.Error()
}

// Unwrap returns the error the outcome carries.
func (o *Outcome) Unwrap() error { return o.err }

// Delay is the time to wait before the next attempt (Retry and Snooze).
func (o *Outcome) Delay() time.Duration { return o.delay }

// Reason is the dead-letter reason (Dead), or "".
func (o *Outcome) Reason() string { return o.reason }

// IsDead reports whether the outcome dead-letters the job.
func (o *Outcome) IsDead() bool { return o.kind == kindDead }

// CountsAttempt reports whether the outcome uses up an attempt: Retry does,
// Snooze does not.
func (o *Outcome) CountsAttempt() bool { return o.kind == kindRetry }

// Retry returns an error that schedules the job's next attempt after delay
// (at once if delay <= 0). The attempt counts toward the job's maximum; when
// none is left the job is dead-lettered with reason [ReasonExhausted].
func Retry(delay time.Duration, err error) error {
	return &Outcome{kind: kindRetry, delay: max(delay, 0), err: err}
}

// Snooze returns an error that reschedules the job after delay without
// counting an attempt: for a job that could not start (a lock held
// elsewhere, a rate limit), not one that failed.
func Snooze(delay time.Duration) error {
	return &Outcome{kind: kindSnooze, delay: max(delay, 0)}
}

// Dead returns an error that dead-letters the job with the given reason
// without another attempt.
func Dead(reason string, err error) error {
	if reason == "" {
		reason = ReasonPermanent
	}
	return &Outcome{kind: kindDead, reason: reason, err: err}
}

// PanicError is the error of a handler that panicked.
type PanicError struct {
	// Value is what the handler passed to panic.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

// Error implements error.
func (p *PanicError) Error() string {
	return fmt.Sprintf("panic: %v\n%s", p.Value, p.Stack)
}

// Error classes a handler (or a library it calls) can mark errors with.
// The retry middleware turns them into [Retry] or [Dead] outcomes with its
// policy; without it the consumer applies them itself: permanent errors are
// dead-lettered with reason [ReasonPermanent], RetryAfter errors retried
// after their delay, and every other error retried with Config.RetryBackoff.
var (
	// ErrPermanent matches (errors.Is) every error made by [Permanent].
	ErrPermanent = errors.New("consumer: permanent failure")
	// ErrRetryable matches every error made by [Retryable] or [RetryAfter].
	ErrRetryable = errors.New("consumer: retryable failure")
)

// ClassifiedError is an error marked permanent or retryable, made by
// [Permanent], [Retryable] or [RetryAfter].
type ClassifiedError struct {
	// Err is the marked error.
	Err error
	// Permanent reports that the job can never succeed.
	Permanent bool
	// After is how long to wait before the next attempt (RetryAfter), 0 for
	// the policy's backoff.
	After time.Duration
}

// Error implements error.
func (e *ClassifiedError) Error() string {
	if e.Err == nil {
		if e.Permanent {
			return ErrPermanent.Error()
		}
		return ErrRetryable.Error()
	}
	return e.Err.Error()
}

// Unwrap returns the marked error.
func (e *ClassifiedError) Unwrap() error { return e.Err }

// Is reports whether target is ErrPermanent or ErrRetryable, as e is.
func (e *ClassifiedError) Is(target error) bool {
	return (target == ErrPermanent && e.Permanent) || (target == ErrRetryable && !e.Permanent)
}

// Permanent marks err as a failure that no retry can fix (a validation
// error, a 4xx answer): the job is dead-lettered without another attempt.
func Permanent(err error) error { return &ClassifiedError{Err: err, Permanent: true} }

// Retryable marks err as a failure that a later attempt may not have (a
// timeout, a 5xx answer).
func Retryable(err error) error { return &ClassifiedError{Err: err} }

// RetryAfter marks err as retryable after at least d, as a server's
// Retry-After asks; the retry middleware caps d by its policy.
func RetryAfter(d time.Duration, err error) error {
	return &ClassifiedError{Err: err, After: max(d, 0)}
}
