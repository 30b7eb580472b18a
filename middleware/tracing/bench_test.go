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
	cfg := tracing.Config{TracerProvider: tp}
	// The full chain's configuration: 1% of new traces sampled, and the
	// producer's decision followed; the job's producer span was not sampled,
	// so the consumer span is dropped.
	sampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))
	b.Cleanup(func() { _ = sampled.Shutdown(context.Background()) })
	dropCfg := tracing.Config{TracerProvider: sampled}
	for _, bc := range []struct {
		name  string
		h     consumer.Handler
		flags string
	}{
		{"bare", noop, "01"},
		{"consumer-span", tracing.Middleware(cfg)(noop), "01"},
		{"consumer+handler-span", consumer.Chain(noop, tracing.Middleware(cfg), tracing.Handler(cfg)), "01"},
		{"dropped", tracing.Middleware(dropCfg)(noop), "00"},
		{"dropped-consumer+handler-span", consumer.Chain(noop, tracing.Middleware(dropCfg), tracing.Handler(dropCfg)), "00"},
		{"dropped-root", tracing.Middleware(dropCfg)(noop), ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			job := deliveredJob()
			if bc.flags != "" {
				job.TraceParent = "00-" + traceID + "-" + spanID + "-" + bc.flags
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_ = bc.h.Process(ctx, job)
			}
		})
	}
}
