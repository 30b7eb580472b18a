package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

// setup returns a tracing Config whose spans go, synchronously, to the
// returned in-memory exporter.
func setup(t *testing.T) (tracing.Config, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing.Config{TracerProvider: tp}, exp
}

// byName returns the ended spans named name.
func byName(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the one ended span named name.
func one(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	spans := byName(exp, name)
	if len(spans) != 1 {
		var names []string
		for _, s := range exp.GetSpans() {
			names = append(names, s.Name)
		}
		t.Fatalf("%d spans named %q, want 1; spans: %q", len(spans), name, names)
	}
	return spans[0]
}

// attrs returns a span's attributes by key.
func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// deliveredJob returns a job as the consumer delivers it, on stream "jobs".
func deliveredJob() *stream.Job {
	return &stream.Job{ID: "job-1", Type: "email.send", Payload: []byte(`{}`), Attempt: 2,
		EntryID: "1700000000000-0", Stream: "jobs", Group: "workers", Deliveries: 3}
}

const (
	traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanID  = "00f067aa0ba902b7"
)

func TestMiddleware_parent(t *testing.T) {
	t.Parallel()
	cfg, exp := setup(t)
	job := deliveredJob()
	job.TraceParent = "00-" + traceID + "-" + spanID + "-01"
	job.TraceState = "rojo=00f067aa0ba902b7"
	var inner trace.SpanContext
	h := tracing.Middleware(cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		inner = trace.SpanContextFromContext(ctx)
		return nil
	}))
	if err := h.Process(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	s := one(t, exp, "process jobs")
	if got := s.SpanContext.TraceID().String(); got != traceID {
		t.Errorf("trace ID %s, want the job's %s", got, traceID)
	}
	if got := s.Parent.SpanID().String(); got != spanID || !s.Parent.IsRemote() {
		t.Errorf("parent span %s (remote %v), want the job's %s", got, s.Parent.IsRemote(), spanID)
	}
	if got := s.SpanContext.TraceState().Get("rojo"); got != "00f067aa0ba902b7" {
		t.Errorf("tracestate rojo=%q, want the job's", got)
	}
	if s.SpanKind != trace.SpanKindConsumer {
		t.Errorf("kind %v, want consumer", s.SpanKind)
	}
	if inner.SpanID() != s.SpanContext.SpanID() {
		t.Errorf("the handler's context holds span %s, want the consumer span %s", inner.SpanID(), s.SpanContext.SpanID())
	}
	want := map[attribute.Key]attribute.Value{
		"messaging.system":              attribute.StringValue("redis"),
		"messaging.destination.name":    attribute.StringValue("jobs"),
		"messaging.consumer.group.name": attribute.StringValue("workers"),
		"messaging.operation.type":      attribute.StringValue("process"),
		"messaging.operation.name":      attribute.StringValue("process"),
		"messaging.message.id":          attribute.StringValue("1700000000000-0"),
		"messaging.message.body.size":   attribute.IntValue(2),
		"pelican.job.type":              attribute.StringValue("email.send"),
		"pelican.job.id":                attribute.StringValue("job-1"),
		"pelican.job.attempt":           attribute.IntValue(2),
		"pelican.job.deliveries":        attribute.IntValue(3),
		"pelican.outcome":               attribute.StringValue("ack"),
	}
	got := attrs(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %v, want %v", k, got[k].Emit(), v.Emit())
		}
	}
}

func TestMiddleware_link(t *testing.T) {
	t.Parallel()
	cfg, exp := setup(t)
	cfg.Link = true
	job := deliveredJob()
	job.TraceParent = "00-" + traceID + "-" + spanID + "-01"
	h := tracing.Middleware(cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	if err := h.Process(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	s := one(t, exp, "process jobs")
	if s.Parent.IsValid() {
		t.Errorf("parent %v, want none (a new root)", s.Parent)
	}
	if s.SpanContext.TraceID().String() == traceID {
		t.Error("the consumer span is in the producer's trace, want a new trace")
	}
	if len(s.Links) != 1 || s.Links[0].SpanContext.TraceID().String() != traceID || s.Links[0].SpanContext.SpanID().String() != spanID {
		t.Errorf("links %+v, want one to %s/%s", s.Links, traceID, spanID)
	}
}

func TestMiddleware_noTraceContext(t *testing.T) {
	t.Parallel()
	for _, tp := range []string{"", "00-nothex-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		t.Run(fmt.Sprintf("%q", tp), func(t *testing.T) {
			t.Parallel()
			cfg, exp := setup(t)
			job := deliveredJob()
			job.TraceParent = tp
			called := false
			h := tracing.Middleware(cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error { called = true; return nil }))
			if err := h.Process(context.Background(), job); err != nil || !called {
				t.Fatalf("err %v, handler called %v", err, called)
			}
			if s := one(t, exp, "process jobs"); s.Parent.IsValid() || len(s.Links) != 0 {
				t.Errorf("parent %v, links %v: want a new root", s.Parent, s.Links)
			}
		})
	}
}

func TestMiddleware_outcome(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name       string
		err        error
		maxAtt     int   // job's max_attempts
		cause      error // the context's cancel cause
		outcome    string
		reason     string
		failed     bool
		delayMS    int64
		hasDelayMS bool
		backoff    bool // delay_ms is the consumer's backoff for the job
	}{
		{name: "ack", outcome: "ack"},
		{name: "retry", err: consumer.Retry(2*time.Second, boom), outcome: "retry", failed: true, delayMS: 2000, hasDelayMS: true},
		{name: "plain error", err: boom, outcome: "retry", failed: true, backoff: true},
		{name: "retry after", err: consumer.RetryAfter(time.Second, boom), outcome: "retry", failed: true, delayMS: 1000, hasDelayMS: true},
		{name: "last attempt", err: boom, maxAtt: 3, outcome: "dead_letter", reason: "exhausted", failed: true},
		{name: "dead", err: consumer.Dead("bad_input", boom), outcome: "dead_letter", reason: "bad_input", failed: true},
		{name: "permanent", err: consumer.Permanent(boom), outcome: "dead_letter", reason: "permanent", failed: true},
		{name: "payload", err: fmt.Errorf("decode: %w", stream.ErrPayload), outcome: "dead_letter", reason: "permanent", failed: true},
		{name: "snooze", err: consumer.Snooze(time.Second), outcome: "snooze", delayMS: 1000, hasDelayMS: true},
		{name: "redis.Nil", err: fmt.Errorf("get user: %w", redis.Nil), outcome: "retry", backoff: true},
		{name: "shutdown", err: context.Canceled, cause: consumer.ErrShutdown, outcome: "abandoned"},
		{name: "shutdown but done", cause: consumer.ErrShutdown, outcome: "ack"},
		{name: "lease lost", err: context.Canceled, cause: consumer.ErrLeaseLost, outcome: "abandoned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, exp := setup(t)
			job := deliveredJob()
			job.MaxAttempts = tt.maxAtt
			if tt.backoff {
				tt.delayMS, tt.hasDelayMS = consumer.Backoff{}.Delay(job).Milliseconds(), true
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			h := tracing.Middleware(cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
				if tt.cause != nil {
					cancel(tt.cause)
				}
				return tt.err
			}))
			if err := h.Process(ctx, job); err != tt.err {
				t.Fatalf("returned %v, want the handler's %v", err, tt.err)
			}
			s := one(t, exp, "process jobs")
			a := attrs(s)
			if got := a["pelican.outcome"].AsString(); got != tt.outcome {
				t.Errorf("outcome %q, want %q", got, tt.outcome)
			}
			if got := a["pelican.dead_reason"].AsString(); got != tt.reason {
				t.Errorf("dead reason %q, want %q", got, tt.reason)
			}
			if d, ok := a["pelican.delay_ms"]; ok != tt.hasDelayMS || d.AsInt64() != tt.delayMS {
				t.Errorf("delay_ms %v (set %v), want %d (set %v)", d.AsInt64(), ok, tt.delayMS, tt.hasDelayMS)
			}
			if failed := s.Status.Code == codes.Error; failed != tt.failed {
				t.Errorf("status %v %q, want error %v", s.Status.Code, s.Status.Description, tt.failed)
			}
			if recorded := len(s.Events) > 0 && s.Events[0].Name == "exception"; recorded != tt.failed {
				t.Errorf("error recorded %v, want %v (events %v)", recorded, tt.failed, s.Events)
			}
		})
	}
}

func TestMiddleware_panic(t *testing.T) {
	t.Parallel()
	cfg, exp := setup(t)
	h := tracing.Middleware(cfg)(consumer.HandlerFunc(func(context.Context, *stream.Job) error { panic("oops") }))
	func() {
		defer func() {
			if v := recover(); v != "oops" {
				t.Errorf("recovered %v, want the handler's panic to pass through", v)
			}
		}()
		_ = h.Process(context.Background(), deliveredJob())
	}()
	s := one(t, exp, "process jobs")
	if a := attrs(s); a["pelican.outcome"].AsString() != "dead_letter" || a["pelican.dead_reason"].AsString() != "panic" {
		t.Errorf("attributes %v, want a dead_letter, reason panic", s.Attributes)
	}
	if s.Status.Code != codes.Error {
		t.Errorf("status %v, want error", s.Status)
	}
}
