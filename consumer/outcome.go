package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pelicanqueue/pelican/stream"
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
	// ErrCancelled: an operator cancelled the job (control.Cancel). Unless
	// the handler then returns nil (the work completed: the job is done),
	// the job is settled as cancelled: acknowledged, its record says
	// cancelled, never retried nor dead-lettered ([KindCancelled]).
	ErrCancelled = errors.New("consumer: job cancelled")
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

// IsDead reports whether the outcome itself is a [Dead] one. What the
// consumer does with a job is [Decide]'s: a Retry on the last attempt
// dead-letters it too.
func (o *Outcome) IsDead() bool { return o.kind == kindDead }

// CountsAttempt reports whether the outcome itself uses up an attempt:
// Retry does, Snooze and Dead do not.
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
// policy; without it the consumer applies them itself (see [Decide]):
// permanent errors are dead-lettered with reason [ReasonPermanent],
// RetryAfter errors retried after their delay, and every other error
// retried with [Config.Backoff].
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

// Kind is what the consumer does with a job once its handler chain has
// returned: one of the Kind* values. Its string is the outcome label of
// the tracing and metrics middleware.
type Kind string

// Values of [Kind].
const (
	// KindAck: the job is done and acknowledged.
	KindAck Kind = "ack"
	// KindRetry: the attempt failed; the next one is scheduled after
	// Decision.Delay.
	KindRetry Kind = "retry"
	// KindSnooze: the job is rescheduled after Decision.Delay without
	// counting an attempt (a lock held elsewhere, a rate limit, an open
	// breaker). Not a failure.
	KindSnooze Kind = "snooze"
	// KindDead: the job is moved to the dead-letter stream with
	// Decision.Reason.
	KindDead Kind = "dead_letter"
	// KindAbandoned: the consumer took the job back (its lease was lost, or
	// it shuts down past its drain deadline) and leaves it pending for
	// another consumer. Not a failure of the job.
	KindAbandoned Kind = "abandoned"
	// KindCancelled: an operator cancelled the job (control.Cancel, cause
	// [ErrCancelled]); it is acknowledged and its record says cancelled.
	// Not a failure of the job.
	KindCancelled Kind = "cancelled"
)

// Decision is what the consumer does with one job given what its handler
// chain returned: the value [Decide] computes and the consumer settles the
// job from. Observers (tracing, metrics, idempotency, the circuit breaker)
// read it with Decide instead of deriving it themselves.
type Decision struct {
	// Kind is what happens to the job.
	Kind Kind
	// Delay is how long the job waits before it runs again (KindRetry,
	// KindSnooze): the exact delay the consumer schedules.
	Delay time.Duration
	// Reason is the dead-letter reason (KindDead), such as
	// [ReasonExhausted].
	Reason string
	// Err is the error as the consumer records it: the one an outcome
	// carries ([Retry], [Dead]; nil for [Snooze]), an [ExhaustedError] when
	// the last attempt failed, otherwise the chain's error. nil for KindAck.
	Err error
	// Attempt is this attempt, counted from 1 (job.Attempt+1).
	Attempt int
	// MaxAttempts is the job's attempt limit (job.AttemptLimit, filled in
	// by the consumer from the job's max_attempts or Config.MaxAttempts).
	MaxAttempts int
}

// Failed reports whether the decision is a failure of the job: a retry or
// a dead letter (not an ack, a snooze or a job taken back).
func (d Decision) Failed() bool { return d.Kind == KindRetry || d.Kind == KindDead }

// PanicPolicy is what the consumer does with a job whose handler panicked
// ([Config.Panic]).
type PanicPolicy int

const (
	// PanicDeadLetter dead-letters the job at once with reason
	// [ReasonPanic] and the stack. It is the default.
	PanicDeadLetter PanicPolicy = iota
	// PanicRetry treats the panic as a retryable error: retried with
	// [Config.Backoff] until the job's last attempt.
	PanicRetry
)

// policy is the part of a consumer's configuration that [Decide] applies.
type policy struct {
	backoff     Backoff
	panic       PanicPolicy
	maxAttempts int
}

// defaultPolicy applies outside a consumer's job (a handler called by a
// test): the defaults of Config.
var defaultPolicy = &policy{maxAttempts: DefaultMaxAttempts}

// policyOf returns the policy of the consumer running the job of ctx.
func policyOf(ctx context.Context) *policy {
	if t := taskOf(ctx); t != nil && t.policy != nil {
		return t.policy
	}
	return defaultPolicy
}

// Decide returns what the consumer does with job given err, what its
// handler chain (or the part of it inside the caller) returned under ctx,
// the context the consumer (or the middleware outside the caller) passed
// down. It is the one place the rules live; the consumer settles every job
// from its result, and middleware that needs the outcome calls it with its
// own ctx, job and err. The rules, the first that matches winning:
//
//   - ctx cancelled with cause [ErrLeaseLost]: abandoned, whatever err;
//   - err nil: ack (a cancelled job whose handler completed anyway is done);
//   - ctx cancelled with cause [ErrCancelled], or err wrapping it:
//     cancelled, whatever err says (a retry, a dead letter);
//   - ctx cancelled with cause [ErrShutdown], or err wrapping ErrShutdown or
//     ErrLeaseLost (a cause an inner context passed on): abandoned;
//   - a [Dead] outcome: dead-letter with its reason; [Snooze]: snooze;
//     [Retry]: retry after its delay;
//   - a [*PanicError]: dead-letter with reason [ReasonPanic], or a retry
//     under [PanicRetry];
//   - an error marked by [Permanent]: dead-letter, reason [ReasonPermanent];
//     by [RetryAfter]: retry after its delay; by [Retryable]: retry (the
//     outermost mark wins);
//   - an error wrapping [stream.ErrPayload]: dead-letter, reason
//     [ReasonPermanent];
//   - any other error: retry.
//
// A retry whose delay is not given waits [Config.Backoff]'s delay for the
// job (the same for every caller: see [Backoff.Delay]). A retry of the
// job's last attempt (Attempt ≥ MaxAttempts) dead-letters it instead, with
// reason [ReasonExhausted] and an [ExhaustedError]. job may be nil only for
// an entry that did not decode, with a Dead outcome.
//
// The policy (Config.Backoff, Config.Panic, Config.MaxAttempts) is the one
// of the consumer running the job, found through ctx; outside a consumer
// the defaults apply. Called from the same place with the same ctx, job and
// err, Decide returns the same Decision.
func Decide(ctx context.Context, job *stream.Job, err error) Decision {
	pol := policyOf(ctx)
	d := Decision{Err: err}
	if job != nil {
		d.Attempt, d.MaxAttempts = job.Attempt+1, attemptLimit(job, pol.maxAttempts)
	}
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, ErrLeaseLost):
		d.Kind = KindAbandoned
	case err == nil:
		d.Kind = KindAck
	case errors.Is(cause, ErrCancelled), errors.Is(err, ErrCancelled):
		d.Kind = KindCancelled
	case errors.Is(cause, ErrShutdown), errors.Is(err, ErrShutdown), errors.Is(err, ErrLeaseLost):
		d.Kind = KindAbandoned
	default:
		d.failed(job, err, pol)
	}
	return d
}

// failed decides about err, a failure of job's attempt.
func (d *Decision) failed(job *stream.Job, err error, pol *policy) {
	if o, ok := errors.AsType[*Outcome](err); ok {
		d.Err = o.err
		switch o.kind {
		case kindDead:
			d.Kind, d.Reason = KindDead, o.reason
		case kindSnooze:
			d.Kind, d.Delay = KindSnooze, o.delay
		default:
			d.retry(job, o.delay, pol)
		}
		return
	}
	if _, ok := errors.AsType[*PanicError](err); ok {
		if pol.panic == PanicRetry {
			d.retry(job, useBackoff, pol)
		} else {
			d.Kind, d.Reason = KindDead, ReasonPanic
		}
		return
	}
	if ce, ok := errors.AsType[*ClassifiedError](err); ok {
		switch {
		case ce.Permanent:
			d.Kind, d.Reason = KindDead, ReasonPermanent
		case ce.After > 0:
			d.retry(job, ce.After, pol)
		default:
			d.retry(job, useBackoff, pol)
		}
		return
	}
	if errors.Is(err, stream.ErrPayload) {
		d.Kind, d.Reason = KindDead, ReasonPermanent
		return
	}
	d.retry(job, useBackoff, pol)
}

// useBackoff asks Decision.retry for the policy's backoff delay.
const useBackoff time.Duration = -1

// retry makes d a retry after delay (useBackoff: the policy's), or a dead
// letter with reason exhausted when the attempt was the job's last.
func (d *Decision) retry(job *stream.Job, delay time.Duration, pol *policy) {
	if d.Attempt >= d.MaxAttempts {
		d.Kind, d.Reason, d.Err = KindDead, ReasonExhausted, ExhaustedError(d.Attempt, d.MaxAttempts, d.Err)
		return
	}
	if delay == useBackoff {
		delay = pol.backoff.Delay(job)
	}
	d.Kind, d.Delay = KindRetry, delay
}

// attemptLimit returns the number of attempts job gets: its AttemptLimit
// (filled in by the consumer), else its max_attempts, else def.
func attemptLimit(job *stream.Job, def int) int {
	switch {
	case job.AttemptLimit > 0:
		return job.AttemptLimit
	case job.MaxAttempts > 0:
		return job.MaxAttempts
	}
	return def
}
