package tracing

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer this package uses.
const ScopeName = "github.com/pelicanqueue/pelican/middleware/tracing"

// MessagingSystem is the messaging.system attribute of every span: the
// semantic conventions list no value for Redis Streams, so Pelican uses the
// name of the server, "redis", as a custom value.
const MessagingSystem = "redis"

// Config configures [Middleware], [Around], [Handler] and [Producer].
type Config struct {
	// Link, when true, starts each consumer span as a new trace with a link
	// to the producer's span instead of as its child. Defaults to false
	// (child of the producer's span).
	Link bool
	// Propagator reads and writes the job's trace context. Defaults to
	// propagation.TraceContext{} (W3C traceparent and tracestate, the
	// fields of the wire format), not the global propagator.
	Propagator propagation.TextMapPropagator
	// TracerProvider creates the tracer. Defaults to the global provider,
	// otel.GetTracerProvider(), looked up when the middleware is built.
	TracerProvider trace.TracerProvider
}

// Validate reports whether cfg is valid: every Config is (its zero fields
// mean the defaults), so it returns nil. Constructors in this package
// return their value, never an error, and never panic on a Config.
func (cfg Config) Validate() error { return nil }

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) withDefaults() Config {
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	return cfg
}

// tracer returns the package's tracer from cfg's provider.
func (cfg Config) tracer() trace.Tracer {
	return cfg.TracerProvider.Tracer(ScopeName)
}
