// Command tracing shows Pelican jobs traced with OpenTelemetry and exported
// with OTLP, from the producer to the handler.
//
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_SERVICE_NAME=pelican-demo go run ./examples/tracing
//
// The exporter is OTLP over HTTP (otlptracehttp), configured by the standard
// OTEL_* environment variables only: OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_EXPORTER_OTLP_HEADERS,
// OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_EXPORTER_OTLP_COMPRESSION, and
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES for the resource. It sends
// protobuf over HTTP whatever OTEL_EXPORTER_OTLP_PROTOCOL says (a gRPC
// collector needs the otlptracegrpc exporter instead). Without an endpoint
// it sends to http://localhost:4318.
//
// With REDIS_URL unset it uses an embedded, in-memory Redis (miniredis);
// with REDIS_URL set it runs on that server, on a stream of its own that it
// deletes afterwards. It enqueues a few jobs under an application span,
// processes them (one snoozed once, one failing once and retried), flushes
// the spans to the collector and exits 0.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/pelicantest"
	"github.com/pelicanqueue/pelican/stream"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() (err error) {
	ctx := context.Background()

	// OTLP/HTTP exporter and provider, configured by OTEL_* variables.
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return fmt.Errorf("otlp exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
	defer func() {
		// Shutdown flushes the batch processor: without it the last spans
		// are lost when the process exits.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if serr := tp.Shutdown(sctx); serr != nil && err == nil {
			err = fmt.Errorf("flushing spans: %w", serr)
		}
	}()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})

	// pelicantest.Open: the server at $REDIS_URL, or an embedded miniredis.
	server, err := pelicantest.Open(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	defer server.Close()
	rdb, where := server.Client, server.Where
	fmt.Println("redis:", where)

	name := fmt.Sprintf("tracing-example:%d", time.Now().UnixNano())
	keys, _ := stream.KeysFor(name)
	defer rdb.Del(context.WithoutCancel(ctx), keys.Stream, keys.Dead, keys.Delayed)

	const group = "mailers"
	cfg := tracing.Config{} // the global provider set above

	// Producer: each job gets a "send" span, a child of the application's
	// span, whose context goes into its traceparent field.
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Prepare: tracing.Producer(name, cfg)})
	appCtx, app := tp.Tracer("example").Start(ctx, "signup")
	var jobs []*stream.Job
	for _, to := range []string{"ana@example.com", "bo@example.com", "cy@example.com"} {
		j, err := stream.NewJSONJob("email.send", map[string]string{"to": to})
		if err != nil {
			return err
		}
		jobs = append(jobs, j)
	}
	_, err = p.EnqueueBatch(appCtx, jobs)
	app.End()
	if err != nil {
		return err
	}
	fmt.Printf("enqueued %d jobs in trace %s\n", len(jobs), app.SpanContext().TraceID())

	// Consumer: tracing outermost, the handler span innermost.
	var snoozed, failed atomic.Bool
	handler := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		var m map[string]string
		if err := job.Decode(&m); err != nil {
			return err
		}
		switch {
		case m["to"] == "bo@example.com" && snoozed.CompareAndSwap(false, true):
			return consumer.Snooze(10 * time.Millisecond) // not an error in the trace
		case m["to"] == "cy@example.com" && failed.CompareAndSwap(false, true):
			return consumer.Retry(10*time.Millisecond, errors.New("smtp: 451 try again later"))
		}
		return nil
	})
	c := consumer.New(rdb, consumer.Config{
		Stream:          name,
		Group:           group,
		Block:           100 * time.Millisecond,
		PromoteInterval: 20 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1})),
	}).Use(tracing.Middleware(cfg), tracing.Handler(cfg)).Handle(handler)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Acked < uint64(len(jobs)) {
		if time.Now().After(deadline) {
			cancel()
			<-done
			return fmt.Errorf("jobs not processed in time: %+v", c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	st := c.Stats()
	fmt.Printf("processed: %d acked, %d rescheduled; spans are flushed on exit\n", st.Acked, st.Retried)
	return nil
}
