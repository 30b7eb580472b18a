package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// policyPhase is one measured configuration of the failure-policy phases.
type policyPhase struct {
	name string
	mws  []consumer.Middleware
	h    consumer.HandlerFunc
	// done reports when all n jobs have been handled as the phase intends.
	done func(st consumer.Stats, n int) bool
}

// runPolicy fills a stream with n jobs and runs one consumer over it with
// the phase's middleware and handler until done; it returns jobs/s.
func (b *bench) runPolicy(ctx context.Context, p policyPhase, n int) float64 {
	s := b.name("policy-" + p.name)
	defer b.cleanup(ctx, s)
	saved := b.n
	b.n = n
	b.pelicanFill(ctx, s)
	b.n = saved
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: "g", Concurrency: b.concurrency, Logger: quiet(),
		PromoteInterval: 10 * time.Millisecond}).Use(p.mws...).Handle(p.h)
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- c.Run(runCtx) }()
	deadline := start.Add(5 * time.Minute)
	for !p.done(c.Stats(), n) {
		if time.Now().After(deadline) {
			log.Fatalf("policy phase %s: not done after 5 minutes: %+v", p.name, c.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}

// policyPhases measures the failure-policy paths against a bare consumer in
// the same run: each job retried once at once (retry settlement, the
// re-added entry, its second run and ack), and, when the breaker phase is
// given, jobs meeting an open circuit breaker (rescheduled without running).
func (b *bench) policyPhases(ctx context.Context, n int, extra ...policyPhase) {
	errFail := errors.New("bench: fails once")
	phases := append([]policyPhase{
		{
			name: "bare",
			h:    func(context.Context, *stream.Job) error { return nil },
			done: func(st consumer.Stats, n int) bool { return st.Acked >= uint64(n) },
		},
		{
			name: "retry-once",
			h: func(_ context.Context, j *stream.Job) error {
				if j.Attempt == 0 {
					return consumer.Retry(0, errFail)
				}
				return nil
			},
			done: func(st consumer.Stats, n int) bool { return st.Acked >= uint64(n) },
		},
	}, extra...)
	fmt.Printf("\nfailure-policy paths (%d jobs each, one consumer, concurrency %d)\n%-14s %12s %10s\n", n, b.concurrency, "path", "jobs/s", "vs bare")
	var bare float64
	for i, p := range phases {
		r := b.runPolicy(ctx, p, n)
		if i == 0 {
			bare = r
		}
		fmt.Printf("%-14s %12.0f %10.2f\n", p.name, r, r/bare)
	}
}

// deleteKeys removes the keys matching the patterns (lock fence counters
// have no TTL).
func (b *bench) deleteKeys(ctx context.Context, patterns ...string) {
	for _, p := range patterns {
		iter := b.rdb.Scan(ctx, 0, p, 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			if batch = append(batch, iter.Val()); len(batch) == 1000 {
				b.rdb.Del(ctx, batch...)
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			b.rdb.Del(ctx, batch...)
		}
	}
}

// extraPolicyPhases returns the phases of middleware: the full chain of a
// lock per job plus an idempotency record in Redis around a no-op handler,
// and an open circuit breaker, which reschedules every job without running it
// (the first job's failure opens it for an hour).
func (b *bench) extraPolicyPhases() []policyPhase {
	errDown := errors.New("bench: downstream down")
	m := metrics.New(prometheus.NewRegistry(), metrics.Config{})
	tp := sdktrace.NewTracerProvider() // the real SDK, sampling every span, with no exporter
	return []policyPhase{{
		name: "trace+metrics",
		mws: []consumer.Middleware{
			tracing.Middleware(tracing.Config{TracerProvider: tp, Group: "g"}),
			m.Middleware(),
		},
		h:    func(context.Context, *stream.Job) error { return nil },
		done: func(st consumer.Stats, n int) bool { return st.Acked >= uint64(n) },
	}, {
		name: "lock+idem",
		mws: []consumer.Middleware{
			middleware.Lock(b.rdb, middleware.LockConfig{
				Key: func(j *stream.Job) string { return j.ID },
			}),
			middleware.Idempotency(idem.NewRedisStore(b.rdb, idem.RedisConfig{Retention: time.Minute}),
				middleware.IdempotencyConfig{Missing: middleware.MissingUseJobID}),
		},
		h:    func(context.Context, *stream.Job) error { return nil },
		done: func(st consumer.Stats, n int) bool { return st.Acked >= uint64(n) },
	}, {
		name: "breaker-open",
		mws: []consumer.Middleware{middleware.CircuitBreaker(middleware.CircuitBreakerConfig{
			Threshold: 1, OpenFor: time.Hour,
		})},
		h:    func(context.Context, *stream.Job) error { return consumer.Retryable(errDown) },
		done: func(st consumer.Stats, n int) bool { return st.Retried >= uint64(n) },
	}}
}
