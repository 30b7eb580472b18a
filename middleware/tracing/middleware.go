package tracing

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"

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
	// AttrDelayMS is the delay of a retry or snooze, in milliseconds: the
	// one the consumer schedules.
	AttrDelayMS = attribute.Key("pelican.delay_ms")
)

// Values of [AttrOutcome]: the [consumer.Kind] of the consumer's decision.
const (
	// OutcomeAck: the job is done and acknowledged.
	OutcomeAck = string(consumer.KindAck)
	// OutcomeRetry: the attempt failed; the next one is scheduled.
	OutcomeRetry = string(consumer.KindRetry)
	// OutcomeSnooze: the job is rescheduled without counting an attempt
	// (a lock held elsewhere, a rate limit). Not an error.
	OutcomeSnooze = string(consumer.KindSnooze)
	// OutcomeDeadLetter: the job is moved to the dead-letter stream.
	OutcomeDeadLetter = string(consumer.KindDead)
	// OutcomeAbandoned: the consumer took the job back (shutdown past the
	// drain deadline, or lease lost) and leaves it pending for another
	// consumer. Not an error of the job.
	OutcomeAbandoned = string(consumer.KindAbandoned)
)

// Middleware returns the outermost middleware of a traced consumer: for
// each job it extracts the trace context from the job's traceparent and
// tracestate fields and starts a span "process <stream>" of kind Consumer,
// which it puts in the context of the rest of the chain, so that spans
// started by inner middleware and the handler are its children. See the
// package documentation for the span's parent, attributes and status.
//
// A job whose span the sampler drops costs next to nothing: the sampler is
// asked first, with the attributes known before the job (system, stream,
// group, operation), and the job's own attributes and its outcome are
// computed only for a span that records.
func Middleware(cfg Config) consumer.Middleware {
	cfg = cfg.withDefaults()
	tracer := cfg.tracer()
	var starts startCache
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			parent := ctx
			if job.TraceParent != "" {
				parent = cfg.Propagator.Extract(ctx, jobCarrier{job})
			}
			st := starts.of(job.Stream, job.Group)
			opts := st.opts
			if cfg.Link {
				opts = append(slices.Clip(opts), trace.WithNewRoot())
				if sc := trace.SpanContextFromContext(parent); sc.IsValid() {
					opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
				}
			}
			spanCtx, span := tracer.Start(parent, st.name, opts...)
			if !span.IsRecording() {
				// Dropped: the handler still gets the (non-recording) span
				// context, so its own spans are dropped too.
				return next.Process(spanCtx, job)
			}
			defer span.End()
			span.SetAttributes(
				semconv.MessagingMessageID(job.EntryID),
				semconv.MessagingMessageBodySize(len(job.Payload)),
				AttrJobType.String(job.Type),
				AttrJobID.String(job.ID),
				AttrAttempt.Int(job.Attempt),
				AttrDeliveries.Int(job.Deliveries),
			)
			defer func() {
				if v := recover(); v != nil { // the consumer recovers it and settles the job
					err := &consumer.PanicError{Value: v}
					recordOutcome(span, consumer.Decide(ctx, job, err), err, context.Cause(ctx))
					panic(v)
				}
			}()
			err := next.Process(spanCtx, job)
			recordOutcome(span, consumer.Decide(ctx, job, err), err, context.Cause(ctx))
			return err
		})
	}
}

// start is how the spans of one stream and group start: the span's name
// and the options with the attributes known before the job.
type start struct {
	stream, group string
	name          string
	opts          []trace.SpanStartOption
}

// startCache keeps the start of the stream and group last seen (a
// middleware usually serves one consumer).
type startCache struct{ last atomic.Pointer[start] }

// of returns the start of streamName and group.
func (c *startCache) of(streamName, group string) *start {
	if st := c.last.Load(); st != nil && st.stream == streamName && st.group == group {
		return st
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(MessagingSystem),
		semconv.MessagingDestinationName(streamName),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
	}
	if group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(group))
	}
	st := &start{stream: streamName, group: group, name: "process " + streamName,
		opts: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}}
	c.last.Store(st)
	return st
}

// recordOutcome sets the span's outcome attributes from the consumer's
// decision d about the chain's err and, for real failures, its error
// status.
func recordOutcome(span trace.Span, d consumer.Decision, err, cause error) {
	span.SetAttributes(AttrOutcome.String(string(d.Kind)))
	switch d.Kind {
	case consumer.KindAbandoned:
		if err != nil {
			span.AddEvent("abandoned", trace.WithAttributes(attribute.String("cause", errText(cause)), attribute.String("error", err.Error())))
		}
	case consumer.KindRetry, consumer.KindSnooze:
		span.SetAttributes(AttrDelayMS.Int64(d.Delay.Milliseconds()))
	case consumer.KindDead:
		span.SetAttributes(AttrDeadReason.String(d.Reason))
	}
	if d.Failed() && !errors.Is(err, redis.Nil) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// setError records err on span and sets its status to Error when it is a
// real failure: one the consumer would retry or dead-letter
// ([consumer.Decide]), not nil, a snooze (a deliberate reschedule) or
// redis.Nil (a missing key is an answer, not a fault).
func setError(ctx context.Context, job *stream.Job, span trace.Span, err error) {
	if err == nil || !span.IsRecording() || errors.Is(err, redis.Nil) || !consumer.Decide(ctx, job, err).Failed() {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
