package tracing

import (
	"context"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelicanqueue/pelican/stream"
)

// Producer returns a hook for [stream.ProducerConfig.Prepare] that traces
// each job enqueued on streamName: it starts and ends a span
// "send <streamName>" of kind Producer, a child of the span in the Enqueue
// call's context, and writes that span's context into the job's
// traceparent and tracestate fields (the message's creation context, as the
// messaging semantic conventions ask: one span per message, so that each
// job of a batch has its own). When the context has no span but the job
// already carries a traceparent (a job re-enqueued by the application),
// the new span continues that trace. cfg.Group, cfg.Link and
// cfg.MaxAttempts are not used.
//
// The span covers the preparation, not the XADD, whose result the hook does
// not see: it ends before the entry is written, and has no message ID.
func Producer(streamName string, cfg Config) func(ctx context.Context, job *stream.Job) {
	cfg = cfg.withDefaults()
	tracer := cfg.tracer()
	name := "send " + streamName
	return func(ctx context.Context, job *stream.Job) {
		if !trace.SpanContextFromContext(ctx).IsValid() && job.TraceParent != "" {
			ctx = cfg.Propagator.Extract(ctx, jobCarrier{job})
		}
		ctx, span := tracer.Start(ctx, name,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingSystemKey.String(MessagingSystem),
				semconv.MessagingDestinationName(streamName),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingOperationName("send"),
				semconv.MessagingMessageBodySize(len(job.Payload)),
				AttrJobType.String(job.Type),
				AttrJobID.String(job.ID),
			))
		job.TraceParent, job.TraceState = "", ""
		cfg.Propagator.Inject(ctx, jobCarrier{job})
		span.End()
	}
}
