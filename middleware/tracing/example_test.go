package tracing_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

// The consumer span continues the trace a producer wrote into the job's
// traceparent field; here a job as a non-Go producer would write it.
func ExampleMiddleware() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	cfg := tracing.Config{TracerProvider: tp}

	h := consumer.Chain(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		return consumer.Snooze(0) // a deliberate reschedule: not an error
	}), tracing.Middleware(cfg), tracing.Handler(cfg))
	job := &stream.Job{Type: "email.send", Stream: "emails", EntryID: "1700000000000-0", Deliveries: 1,
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	_ = h.Process(context.Background(), job)

	spans := exp.GetSpans() // in the order they ended
	handler, process := spans[0], spans[1]
	fmt.Printf("%s: trace %s, parent %s (remote), outcome %s, status %s\n", process.Name,
		process.SpanContext.TraceID(), process.Parent.SpanID(), attrs(process)[tracing.AttrOutcome].AsString(), process.Status.Code)
	fmt.Printf("%s: child of %q: %v\n", handler.Name, process.Name, handler.Parent.SpanID() == process.SpanContext.SpanID())
	// Output:
	// process emails: trace 4bf92f3577b34da6a3ce929d0e0e4736, parent 00f067aa0ba902b7 (remote), outcome snooze, status Unset
	// pelican.handler: child of "process emails": true
}
