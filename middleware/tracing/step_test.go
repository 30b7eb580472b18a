package tracing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

type fenceKey struct{}

// gate is a fake lock middleware: it passes a value in the context, or
// returns err without calling next when err is set.
func gate(err error, after func()) consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if err != nil {
				return err
			}
			res := next.Process(context.WithValue(ctx, fenceKey{}, 42), job)
			if after != nil {
				after()
			}
			return res
		})
	}
}

func TestAround(t *testing.T) {
	t.Parallel()
	cfg, exp := setup(t)
	var fence any
	var handlerParent trace.SpanContext
	afterLock := false
	h := consumer.Chain(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		fence = ctx.Value(fenceKey{})
		return errors.New("boom")
	}),
		tracing.Middleware(cfg),
		tracing.Around(tracing.SpanLock, gate(nil, func() { afterLock = true }), cfg),
		tracing.Around(tracing.SpanIdempotency, gate(nil, nil), cfg),
		func(next consumer.Handler) consumer.Handler {
			return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				handlerParent = trace.SpanContextFromContext(ctx)
				return next.Process(ctx, job)
			})
		},
		tracing.Handler(cfg),
	)
	if err := h.Process(context.Background(), deliveredJob()); err == nil {
		t.Fatal("the handler's error was lost")
	}
	if fence != 42 || !afterLock {
		t.Errorf("fence %v, lock's after-work ran %v: the wrapped middleware's context or flow was lost", fence, afterLock)
	}
	root := one(t, exp, "process jobs")
	lock := one(t, exp, tracing.SpanLock)
	idem := one(t, exp, tracing.SpanIdempotency)
	handler := one(t, exp, tracing.SpanHandler)
	for _, s := range []struct {
		name   string
		parent trace.SpanContext
	}{{"lock", lock.Parent}, {"idempotency", idem.Parent}, {"handler", handler.Parent}, {"rest of chain", handlerParent}} {
		if s.parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("%s's parent is %s, want the consumer span %s", s.name, s.parent.SpanID(), root.SpanContext.SpanID())
		}
	}
	if lock.EndTime.After(idem.StartTime) || idem.EndTime.After(handler.StartTime) {
		t.Errorf("steps overlap: lock %v–%v, idempotency %v–%v, handler from %v",
			lock.StartTime, lock.EndTime, idem.StartTime, idem.EndTime, handler.StartTime)
	}
	if a := attrs(lock); !a["pelican.next_called"].AsBool() {
		t.Errorf("lock span: next_called %v, want true", a["pelican.next_called"].Emit())
	}
	if lock.Status.Code == codes.Error {
		t.Errorf("lock span has status error although the lock was taken")
	}
	if handler.Status.Code != codes.Error || root.Status.Code != codes.Error {
		t.Errorf("handler status %v, consumer status %v: want errors", handler.Status, root.Status)
	}
}

func TestAround_noNext(t *testing.T) {
	t.Parallel()
	boom := errors.New("redis down")
	tests := []struct {
		name   string
		err    error
		failed bool
	}{
		{name: "snooze", err: consumer.Snooze(time.Second)},
		{name: "skip", err: nil},
		{name: "redis.Nil", err: redis.Nil},
		{name: "failure", err: boom, failed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, exp := setup(t)
			skip := func(next consumer.Handler) consumer.Handler {
				return consumer.HandlerFunc(func(context.Context, *stream.Job) error { return tt.err })
			}
			ran := false
			h := consumer.Chain(consumer.HandlerFunc(func(context.Context, *stream.Job) error { ran = true; return nil }),
				tracing.Middleware(cfg), tracing.Around(tracing.SpanLock, skip, cfg), tracing.Handler(cfg))
			if err := h.Process(context.Background(), deliveredJob()); err != tt.err || ran {
				t.Fatalf("returned %v, handler ran %v", err, ran)
			}
			lock := one(t, exp, tracing.SpanLock)
			if a := attrs(lock); a["pelican.next_called"].AsBool() {
				t.Error("next_called true, want false")
			}
			if failed := lock.Status.Code == codes.Error; failed != tt.failed {
				t.Errorf("status %v, want error %v", lock.Status, tt.failed)
			}
			if n := len(byName(exp, tracing.SpanHandler)); n != 0 {
				t.Errorf("%d handler spans, want none", n)
			}
		})
	}
}

func TestHandler_notErrors(t *testing.T) {
	t.Parallel()
	for _, err := range []error{nil, consumer.Snooze(time.Second), redis.Nil} {
		cfg, exp := setup(t)
		h := tracing.Handler(cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return err }))
		_ = h.Process(context.Background(), deliveredJob())
		if s := one(t, exp, tracing.SpanHandler); s.Status.Code == codes.Error || len(s.Events) != 0 {
			t.Errorf("%v: status %v, events %v: want no error", err, s.Status, s.Events)
		}
	}
}
