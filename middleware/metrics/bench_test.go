package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// BenchmarkMiddleware measures the middleware's cost per job, without
// Redis.
func BenchmarkMiddleware(b *testing.B) {
	m := metrics.New(prometheus.NewRegistry(), metrics.Config{})
	h := m.Middleware()(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	job := testJob("email", time.Second)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = h.Process(ctx, job)
		}
	})
}

// BenchmarkConsumer compares the throughput of a bare consumer with a
// no-op handler and of the same consumer with the metrics middleware, on
// the shared test Redis (REDIS_ADDR).
func BenchmarkConsumer(b *testing.B) {
	for _, withMetrics := range []bool{false, true} {
		name := "bare"
		if withMetrics {
			name = "metrics"
		}
		b.Run(name, func(b *testing.B) {
			rdb := redistest.Shared(b)
			s := redistest.Name(b)
			keys, _ := stream.KeysFor(s)
			b.Cleanup(func() { rdb.Del(context.Background(), keys.Stream, keys.Dead, keys.Delayed) })
			ctx := context.Background()
			p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
			jobs := make([]*stream.Job, 0, 100)
			for i := 0; i < b.N; i += 100 {
				jobs = jobs[:0]
				for range min(100, b.N-i) {
					jobs = append(jobs, &stream.Job{Type: "noop", Payload: []byte(`{}`)})
				}
				if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
					b.Fatal(err)
				}
			}
			c := consumer.New(rdb, consumer.Config{Stream: s, Group: "g", Consumer: "c", Concurrency: 64,
				Block: 50 * time.Millisecond, Logger: quiet}).
				Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
			if withMetrics {
				c.Use(metrics.New(prometheus.NewRegistry(), metrics.Config{}).Middleware())
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			b.ResetTimer()
			go func() { done <- c.Run(runCtx) }()
			for c.Stats().Acked < uint64(b.N) {
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			stop()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
}
