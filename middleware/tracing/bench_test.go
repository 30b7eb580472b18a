package tracing_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

// BenchmarkMiddleware measures the cost per job of the consumer span (and
// the handler span) with a real SDK provider that exports nothing, against
// the bare handler: the configuration pelican-bench uses.
func BenchmarkMiddleware(b *testing.B) {
	noop := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	tp := sdktrace.NewTracerProvider()
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := tracing.Config{TracerProvider: tp, Group: "bench"}
	for _, bc := range []struct {
		name string
		h    consumer.Handler
	}{
		{"bare", noop},
		{"consumer-span", tracing.Middleware(cfg)(noop)},
		{"consumer+handler-span", consumer.Chain(noop, tracing.Middleware(cfg), tracing.Handler(cfg))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			job := deliveredJob()
			job.TraceParent = "00-" + traceID + "-" + spanID + "-01"
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_ = bc.h.Process(ctx, job)
			}
		})
	}
}
