package tracing

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Attribute keys of Pelican's own span attributes (the messaging.* ones are
// the OpenTelemetry semantic conventions').
const (
	// AttrJobType is the job's type.
	AttrJobType = attribute.Key("pelican.job.type")
	// AttrJobID is the job's ID, stable across retries (the entry ID is
	// messaging.message.id).
	AttrJobID = attribute.Key("pelican.job.id")
	// AttrAttempt is the job's earlier attempts, 0 on the first run.
	AttrAttempt = attribute.Key("pelican.job.attempt")
	// AttrDeliveries is how many times Redis has delivered the entry, this
	// delivery included. The semantic conventions have no general
	// delivery-count attribute (only per-system ones).
	AttrDeliveries = attribute.Key("pelican.job.deliveries")
	// AttrOutcome is what the consumer does with the job: one of the
	// Outcome* values.
	AttrOutcome = attribute.Key("pelican.outcome")
	// AttrDeadReason is the dead-letter reason, on dead_letter outcomes.
	AttrDeadReason = attribute.Key("pelican.dead_reason")
	// AttrDelayMS is the delay of a retry or snooze, in milliseconds, when
	// the handler chose it (absent: the consumer's backoff).
	AttrDelayMS = attribute.Key("pelican.delay_ms")
)

// Values of [AttrOutcome].
const (
	// OutcomeAck: the job is done and acknowledged.
	OutcomeAck = "ack"
	// OutcomeRetry: the attempt failed; the next one is scheduled.
	OutcomeRetry = "retry"
	// OutcomeSnooze: the job is rescheduled without counting an attempt
	// (a lock held elsewhere, a rate limit). Not an error.
	OutcomeSnooze = "snooze"
	// OutcomeDeadLetter: the job is moved to the dead-letter stream.
	OutcomeDeadLetter = "dead_letter"
	// OutcomeAbandoned: the consumer took the job back (shutdown past the
	// drain deadline, or lease lost) and leaves it pending for another
	// consumer. Not an error of the job.
	OutcomeAbandoned = "abandoned"
)

// Middleware returns the outermost middleware of a traced consumer: for
// each job it extracts the trace context from the job's traceparent and
// tracestate fields and starts a span "process <stream>" of kind Consumer,
// which it puts in the context of the rest of the chain, so that spans
// started by inner middleware and the handler are its children. See the
// package documentation for the span's parent, attributes and status.
func Middleware(cfg Config) consumer.Middleware {
	cfg = cfg.withDefaults()
	tracer := cfg.tracer()
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			created := cfg.Propagator.Extract(ctx, jobCarrier{job})
			attrs := []attribute.KeyValue{
				semconv.MessagingSystemKey.String(MessagingSystem),
				semconv.MessagingDestinationName(job.Stream),
				semconv.MessagingOperationTypeProcess,
				semconv.MessagingOperationName("process"),
				semconv.MessagingMessageID(job.EntryID),
				semconv.MessagingMessageBodySize(len(job.Payload)),
				AttrJobType.String(job.Type),
				AttrJobID.String(job.ID),
				AttrAttempt.Int(job.Attempt),
				AttrDeliveries.Int(job.Deliveries),
			}
			if cfg.Group != "" {
				attrs = append(attrs, semconv.MessagingConsumerGroupName(cfg.Group))
			}
			opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
			if cfg.Link {
				opts = append(opts, trace.WithNewRoot())
				if sc := trace.SpanContextFromContext(created); sc.IsValid() {
					opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
				}
			}
			spanCtx, span := tracer.Start(created, "process "+job.Stream, opts...)
			defer span.End()
			defer func() {
				if v := recover(); v != nil { // the consumer recovers it and dead-letters the job
					recordOutcome(span, job, cfg.MaxAttempts, &consumer.PanicError{Value: v}, nil)
					panic(v)
				}
			}()
			err := next.Process(spanCtx, job)
			recordOutcome(span, job, cfg.MaxAttempts, err, context.Cause(ctx))
			return err
		})
	}
}

// recordOutcome sets the span's outcome attributes and, for real failures,
// its error status. It mirrors the consumer's settlement of err.
func recordOutcome(span trace.Span, job *stream.Job, maxAttempts int, err, cause error) {
	if errors.Is(cause, consumer.ErrLeaseLost) || (err != nil && errors.Is(cause, consumer.ErrShutdown)) {
		span.SetAttributes(AttrOutcome.String(OutcomeAbandoned))
		if err != nil {
			span.AddEvent("abandoned", trace.WithAttributes(attribute.String("cause", cause.Error()), attribute.String("error", err.Error())))
		}
		return
	}
	if err == nil {
		span.SetAttributes(AttrOutcome.String(OutcomeAck))
		return
	}
	var (
		o  *consumer.Outcome
		p  *consumer.PanicError
		ce *consumer.ClassifiedError
	)
	outcome, reason, counts := OutcomeRetry, "", true
	switch {
	case errors.As(err, &o) && o.IsDead():
		outcome, reason = OutcomeDeadLetter, o.Reason()
	case errors.As(err, &o):
		counts = o.CountsAttempt()
		if !counts {
			outcome = OutcomeSnooze
		}
		if o.Delay() > 0 {
			span.SetAttributes(AttrDelayMS.Int64(o.Delay().Milliseconds()))
		}
	case errors.As(err, &p):
		outcome, reason = OutcomeDeadLetter, consumer.ReasonPanic
	case errors.As(err, &ce) && ce.Permanent, errors.Is(err, stream.ErrPayload):
		outcome, reason = OutcomeDeadLetter, consumer.ReasonPermanent
	case errors.As(err, &ce) && ce.After > 0:
		span.SetAttributes(AttrDelayMS.Int64(ce.After.Milliseconds()))
	}
	if outcome == OutcomeRetry {
		limit := job.MaxAttempts
		if limit == 0 {
			limit = maxAttempts
		}
		if job.Attempt+1 >= limit {
			outcome, reason = OutcomeDeadLetter, consumer.ReasonExhausted
		}
	}
	span.SetAttributes(AttrOutcome.String(outcome))
	if reason != "" {
		span.SetAttributes(AttrDeadReason.String(reason))
	}
	if counts {
		setError(span, err)
	}
}

// setError records err on span and sets its status to Error, unless err is
// not a failure: nil, a snooze (a deliberate reschedule) or redis.Nil (a
// missing key is an answer, not a fault).
func setError(span trace.Span, err error) {
	if !failure(err) {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// failure reports whether err is a real failure (see setError).
func failure(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	var o *consumer.Outcome
	return !errors.As(err, &o) || o.IsDead() || o.CountsAttempt()
}
