package metrics_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// The metrics middleware goes first in Use, so that it sees the final
// decision of the others; its hooks plug into the lock and idempotency
// middleware:
//
//	m := metrics.New(prometheus.DefaultRegisterer, metrics.Config{})
//	c.Use(m.Middleware(),
//		middleware.Lock(rdb, middleware.LockConfig{OnConflict: m.LockConflict}),
//		middleware.Idempotency(store, middleware.IdempotencyConfig{OnHit: m.IdempotencyHit}),
//		middleware.Retry(retryCfg),
//		m.LockLost(),
//	)
//	prometheus.MustRegister(metrics.NewCollector(rdb, metrics.CollectorConfig{
//		Queues: []metrics.Queue{{Stream: "emails", Groups: []string{"senders"}}},
//	}))
//	http.Handle("/metrics", promhttp.Handler())
func ExampleMetrics_Middleware() {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Config{})
	h := consumer.Chain(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		if job.Attempt == 0 {
			return errors.New("smtp timeout") // a plain error: retried
		}
		return nil
	}), m.Middleware())

	job := &stream.Job{Type: "email.send", Stream: "emails", EntryID: "1700000000000-0"}
	_ = h.Process(context.Background(), job)
	job.Attempt++
	_ = h.Process(context.Background(), job)

	fmt.Println(testutil.ToFloat64(m.Processed("emails", "email.send", metrics.OutcomeRetry)))
	fmt.Println(testutil.ToFloat64(m.Processed("emails", "email.send", metrics.OutcomeAck)))
	// Output:
	// 1
	// 1
}
