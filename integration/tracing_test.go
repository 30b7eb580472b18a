package integration

import (
	"context"
	"log/slog"
	"net"
	"os/exec"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

// TestTracing_redisCLIProducer XADDs a job with the real redis-cli and a
// hand-written W3C traceparent, as a non-Go producer would, and checks that
// the consumer span continues that trace, as a child of the span it names.
func TestTracing_redisCLIProducer(t *testing.T) {
	t.Parallel()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found on PATH: %v", err)
	}
	s := newScenario(t, nil, "")
	host, port, err := net.SplitHostPort(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	const (
		traceID = "0af7651916cd43dd8448eb211c80319c"
		spanID  = "b7ad6b7169203331"
	)
	out, err := exec.Command(cli, "-h", host, "-p", port, "XADD", s.stream, "*",
		"type", "trace.me", "payload", `{"n":1}`,
		"traceparent", "00-"+traceID+"-"+spanID+"-01",
		"tracestate", "congo=t61rcWkgMzE").CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli XADD: %v\n%s", err, out)
	}

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := tracing.Config{TracerProvider: tp}
	c := consumer.New(s.rdb, consumer.Config{
		Stream: s.stream, Group: "g", Consumer: "c1", Block: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	}).Use(tracing.Middleware(cfg), tracing.Handler(cfg)).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	name := "process " + s.stream
	var process, handler []tracetest.SpanStub
	eventually(t, 10*time.Second, func() (bool, string) {
		process, handler = nil, nil
		for _, sp := range exp.GetSpans() {
			switch sp.Name {
			case name:
				process = append(process, sp)
			case tracing.SpanHandler:
				handler = append(handler, sp)
			}
		}
		return len(process) == 1 && len(handler) == 1, "no process span yet"
	})
	p := process[0]
	if got := p.SpanContext.TraceID().String(); got != traceID {
		t.Errorf("consumer span's trace ID %s, want the entry's %s", got, traceID)
	}
	if got := p.Parent.SpanID().String(); got != spanID || !p.Parent.IsRemote() {
		t.Errorf("consumer span's parent %s (remote %v), want the entry's span %s", got, p.Parent.IsRemote(), spanID)
	}
	if got := p.SpanContext.TraceState().Get("congo"); got != "t61rcWkgMzE" {
		t.Errorf("tracestate congo=%q, want the entry's", got)
	}
	attr := func(sp tracetest.SpanStub, key string) string {
		for _, kv := range sp.Attributes {
			if string(kv.Key) == key {
				return kv.Value.Emit()
			}
		}
		return ""
	}
	for key, want := range map[string]string{
		"messaging.destination.name": s.stream, "pelican.job.type": "trace.me", "pelican.outcome": "ack",
		"pelican.job.deliveries": "1", "messaging.consumer.group.name": "g",
	} {
		if got := attr(p, key); got != want {
			t.Errorf("attribute %s = %q, want %q", key, got, want)
		}
	}
	if attr(p, "messaging.message.id") == "" {
		t.Error("no messaging.message.id")
	}
	if handler[0].Parent.SpanID() != p.SpanContext.SpanID() {
		t.Errorf("handler span's parent %s, want the consumer span %s", handler[0].Parent.SpanID(), p.SpanContext.SpanID())
	}
}
