// Command metrics serves Pelican's Prometheus metrics while a consumer runs.
//
//	go run ./examples/metrics                  # http://127.0.0.1:9090/metrics
//	go run ./examples/metrics -addr :9100
//
// The address comes from -addr, else METRICS_ADDR, else 127.0.0.1:9090.
// With REDIS_URL unset it starts an embedded, in-memory Redis (miniredis),
// as examples/quickstart does; with REDIS_URL set it uses that server, on a
// stream of its own that it deletes on exit.
//
// It enqueues a few jobs (emails that succeed, one that fails once and is
// retried, one that can never succeed and is dead-lettered), runs a consumer
// with the metrics middleware outermost, and serves /metrics with the job
// metrics and the queue state collector until interrupted (Ctrl-C).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/pelicantest"
	"github.com/pelicanqueue/pelican/stream"
)

func main() {
	def := os.Getenv("METRICS_ADDR")
	if def == "" {
		def = "127.0.0.1:9090"
	}
	addr := flag.String("addr", def, "address to serve /metrics on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, ln, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves /metrics on ln and processes the example's jobs until ctx is
// cancelled. It closes ln.
func run(ctx context.Context, ln net.Listener, out io.Writer) error {
	defer ln.Close()
	// pelicantest.Open: the server at $REDIS_URL, or an embedded miniredis.
	server, err := pelicantest.Open(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	defer server.Close()
	rdb, where := server.Client, server.Where
	fmt.Fprintln(out, "redis:", where)

	name := fmt.Sprintf("metrics-example:%d", time.Now().UnixNano())
	keys, _ := stream.KeysFor(name)
	defer rdb.Del(context.WithoutCancel(ctx), keys.Stream, keys.Dead, keys.Delayed)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg, metrics.Config{})

	mux := consumer.NewMux().
		HandleFunc("email.send", func(ctx context.Context, job *stream.Job) error {
			if job.Headers["flaky"] == "1" && job.Attempt == 0 {
				return errors.New("smtp: 421 try again later") // retried
			}
			return nil
		}).
		HandleFunc("report.build", func(ctx context.Context, job *stream.Job) error {
			return consumer.Permanent(errors.New("no such month")) // dead-lettered
		})
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "example", Block: 100 * time.Millisecond,
		PromoteInterval: 100 * time.Millisecond, Logger: quiet,
		Backoff:            consumer.Backoff{Base: 200 * time.Millisecond, Cap: time.Second}}).
		Use(m.Middleware(), // outermost: it sees the final outcome
			middleware.Retry(middleware.RetryConfig{}),
		).Handle(mux)
	reg.MustRegister(metrics.NewCollector(rdb, metrics.CollectorConfig{
		Queues:    []metrics.Queue{{Stream: name, Groups: []string{"example"}}},
		Consumers: []metrics.ConsumerStats{{Stream: name, Group: "example", Stats: c.Stats}},
		CacheFor:  time.Second,
	}))

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	jobs := []*stream.Job{
		{Type: "email.send", Payload: []byte(`{"to":"ana@example.com"}`)},
		{Type: "email.send", Payload: []byte(`{"to":"bo@example.com"}`)},
		{Type: "email.send", Payload: []byte(`{"to":"cy@example.com"}`), Headers: map[string]string{"flaky": "1"}},
		{Type: "report.build", Payload: []byte(`{"month":"2026-13"}`)},
	}
	if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
		return err
	}

	routes := http.NewServeMux()
	routes.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: routes, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(out, "serving http://%s/metrics (Ctrl-C to stop)\n", ln.Addr())

	runErr := c.Run(ctx) // until ctx is cancelled
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}
