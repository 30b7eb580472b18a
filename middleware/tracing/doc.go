// Package tracing traces Pelican jobs with OpenTelemetry, from the producer
// that enqueues a job to the handler that runs it, following the
// OpenTelemetry messaging semantic conventions.
//
//	producer ─[Producer]→ stream → consumer → [Middleware] → lock, idempotency ([Around]) → … → [Handler] → handler
//
// It is the only package of Pelican that imports OpenTelemetry; stream and
// consumer know nothing of it (a test, internal/depcheck, keeps it so). It
// imports consumer and stream; neither imports it.
//
// # Producer
//
// [Producer] is a [stream.ProducerConfig.Prepare] hook. For each job it
// starts and ends a span "send <stream>" (kind Producer,
// messaging.operation.type "send"), a child of the span in the Enqueue
// call's context, and writes that span's W3C trace context into the job's
// traceparent and tracestate fields. One span per job is the message's
// creation context, which the consumer span refers to.
//
// A producer in another language sets the same two fields (see
// docs/wire-format.md): traceparent is the W3C Trace Context header value,
// "00-<32 hex trace ID>-<16 hex parent span ID>-<2 hex flags>", for example
// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 for a sampled
// trace, lowercase hex, the span ID being that of the producer's own
// (send or create) span; tracestate, optional, is the W3C tracestate header
// value. With an OpenTelemetry SDK, inject the context into a map with the
// W3C TraceContext propagator and copy its "traceparent" and "tracestate"
// entries into the XADD's fields of the same names. An entry with a
// malformed traceparent is processed normally, in a new trace.
//
// # Consumer
//
// [Middleware], the outermost middleware, starts for each job a span
// "process <stream>" of kind Consumer (the conventions' "{operation}
// {destination}"), with the attributes
//
//	messaging.system              "redis" (the conventions have no value for Redis Streams)
//	messaging.destination.name    the stream
//	messaging.consumer.group.name the job's group (job.Group, set by the consumer)
//	messaging.operation.type      "process"
//	messaging.operation.name      "process"
//	messaging.message.id          the entry ID
//	messaging.message.body.size   the payload's length
//	pelican.job.type, pelican.job.id, pelican.job.attempt (earlier attempts, 0 first),
//	pelican.job.deliveries        Redis's delivery count of the entry (no general convention)
//
// and, when the chain returns, pelican.outcome: "ack", "retry", "snooze",
// "dead_letter" (with pelican.dead_reason, including "exhausted" for a retry
// on the last attempt), or "abandoned" (the consumer took the job back for
// shutdown or a lost lease; it stays pending for another consumer), with
// pelican.delay_ms on a retry or snooze. These are the consumer's own
// decision, consumer.Decide over what the chain returned: the delay is the
// one the consumer schedules, the limit the job's (job.AttemptLimit), and
// nothing here derives them.
//
// The sampler is asked when the span starts, with the attributes known
// before the job is read (messaging.system, the destination, the group and
// the operation); the job's own attributes and the outcome are set only on
// a span that records, so a job whose span the sampler drops costs next to
// nothing here (no attributes built, no outcome computed).
//
// Only real failures are errors: a retry or dead-letter records the error
// (span.RecordError) and sets status Error; an ack, a snooze (a deliberate
// reschedule: a lock held elsewhere, a rate limit), an abandoned job and an
// error matching redis.Nil (a missing key is an answer, not a fault) leave
// the status unset.
//
// Parent or link. The conventions recommend that a "process" span link to
// the message's creation context, and allow the creation context to be the
// parent when one message is processed at a time, which is always the case
// here. By default (Config.Link false) the consumer span is a child of the
// producer's span: producer and consumer are one trace, which is what most
// trace viewers show best for a job queue. A job that waits long in the
// queue, or is retried many times, then stretches that trace over hours;
// Config.Link true starts every consumer span as a new trace's root with a
// link to the producer's span instead. A job without trace context, or with
// a malformed traceparent, starts a new trace either way.
//
// # Child spans
//
// The consumer span is the current span of the context passed on, so spans
// that inner middleware and the handler start are its children. The
// recommended chain adds three:
//
//	c.Use(
//		tracing.Middleware(cfg),
//		tracing.Around(tracing.SpanLock, middleware.Lock(rdb, lockCfg), cfg),
//		tracing.Around(tracing.SpanIdempotency, middleware.Idempotency(store, idemCfg), cfg),
//		middleware.Retry(retryCfg),
//		middleware.DeadLetter(deadCfg),
//		middleware.Timeout(timeoutCfg),
//		tracing.Handler(cfg),
//	)
//
// [Around] gives a middleware a span over its own work before the rest of
// the chain: it ends when the middleware calls its next handler, so
// "pelican.lock" is the lock wait and "pelican.idempotency" the idempotency
// check, not the whole job; the middleware's work after the handler (a lock
// release) is in the consumer span only. The rest of the chain runs with the
// consumer span current again, so "pelican.handler", made by [Handler]
// innermost, is a sibling of the step spans, after them. A step that
// settles the job itself (a snooze on a held lock, a completed idempotency
// key) has pelican.next_called false.
//
// # Cost
//
// Middleware with a real SDK provider and no exporter
// (sdktrace.NewTracerProvider()) measures the cost of tracing itself in a
// benchmark; no other constructor is needed.
//
// Construction: [Middleware], [Around], [Handler] and [Producer] return
// their value and never fail or panic on a [Config] (every Config is valid).
package tracing
