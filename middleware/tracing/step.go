package tracing

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Span names of the child spans made by the recommended chain.
const (
	// SpanLock names the span of the lock middleware's wait.
	SpanLock = "pelican.lock"
	// SpanIdempotency names the span of the idempotency check.
	SpanIdempotency = "pelican.idempotency"
	// SpanHandler names the span of the handler, made by [Handler].
	SpanHandler = "pelican.handler"
)

// AttrNextCalled records, on an [Around] span, whether the wrapped
// middleware went on to the rest of the chain (false: it settled the job
// itself, for example a snooze on a held lock or a skipped duplicate).
const AttrNextCalled = attribute.Key("pelican.next_called")

// Around returns mw with a child span named name over mw's own work before
// the rest of the chain: the span starts when mw is called and ends when mw
// calls its next handler, or when mw returns if it never does. So
// Around(SpanLock, middleware.Lock(...)) measures the lock wait and
// Around(SpanIdempotency, middleware.Idempotency(...)) the idempotency
// check, not the handler they wrap.
//
// The rest of the chain runs with the context mw passed on (its values, a
// lock's fencing token for example, are kept), but with the enclosing span
// as the current span again, so that the following spans are siblings of
// this one rather than children of a span that has ended. The span's status
// is Error when mw itself returned a real failure without calling next (a
// snooze or redis.Nil is not one).
func Around(name string, mw consumer.Middleware, cfg Config) consumer.Middleware {
	cfg = cfg.withDefaults()
	tracer := cfg.tracer()
	key := &stepKey{name: name}
	return func(next consumer.Handler) consumer.Handler {
		inner := mw(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if st, ok := ctx.Value(key).(*step); ok {
				st.enter()
				ctx = trace.ContextWithSpan(ctx, st.outer)
			}
			return next.Process(ctx, job)
		}))
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			outer := trace.SpanFromContext(ctx)
			stepCtx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
			st := &step{span: span, outer: outer}
			err := inner.Process(context.WithValue(stepCtx, key, st), job)
			st.end(ctx, job, err) // if mw returned without calling next
			return err
		})
	}
}

// stepKey is the context key of one Around's per-job state; each Around
// has its own, so nested ones do not see each other's.
type stepKey struct{ name string }

// step is one job's state in an Around.
type step struct {
	span  trace.Span
	outer trace.Span
	once  sync.Once
}

// enter ends the span as mw calls next.
func (s *step) enter() {
	s.once.Do(func() {
		s.span.SetAttributes(AttrNextCalled.Bool(true))
		s.span.End()
	})
}

// end ends the span with mw's result if next was not called.
func (s *step) end(ctx context.Context, job *stream.Job, err error) {
	s.once.Do(func() {
		s.span.SetAttributes(AttrNextCalled.Bool(false))
		setError(ctx, job, s.span, err)
		s.span.End()
	})
}

// handlerKind is the start option of handler spans, made once.
var handlerKind = trace.WithSpanKind(trace.SpanKindInternal)

// Handler returns the innermost middleware of a traced consumer: a child
// span named [SpanHandler] around the handler, with the handler's error
// recorded and the span's status Error for real failures (a snooze or
// redis.Nil is not one).
func Handler(cfg Config) consumer.Middleware {
	cfg = cfg.withDefaults()
	tracer := cfg.tracer()
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			spanCtx, span := tracer.Start(ctx, SpanHandler, handlerKind)
			defer span.End()
			err := next.Process(spanCtx, job)
			setError(ctx, job, span, err)
			return err
		})
	}
}
