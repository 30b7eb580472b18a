package integration

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// Promise (Consumer.WaitIdle): "jobs enqueued before the call have run and
// settled when it returns". Settled means acknowledged in Redis (finished jobs
// are acknowledged in batches), so when WaitIdle returns every job enqueued
// before it has run exactly once, Stats.Acked counts it, and nothing of the
// group is pending. Repeated rounds on one running consumer with Prefetch, each
// round enqueued while the consumer is busy or idle.
func TestAttack11_WaitIdleMeansSettled(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	var ran atomic.Int64
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "A",
		Concurrency: 2, Prefetch: 8, Block: 100 * time.Millisecond, IdleConsumerTimeout: -1}).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { ran.Add(1); return nil }))
	run := make(chan error, 1)
	go func() { run <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Shutdown(sctx)
		<-run
	})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	total := int64(0)
	for round := 0; round < 15; round++ {
		n := 1 + round*3
		for i := 0; i < n; i++ {
			j, _ := stream.NewJSONJob("x", i)
			if _, err := p.Enqueue(ctx, j); err != nil {
				t.Fatal(err)
			}
		}
		total += int64(n)
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := c.WaitIdle(wctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: WaitIdle: %v", round, err)
		}
		pend, err := rdb.XPending(ctx, name, "g").Result()
		if err != nil {
			t.Fatal(err)
		}
		st := c.Stats()
		if ran.Load() != total || st.Acked != uint64(total) || pend.Count != 0 {
			t.Fatalf("round %d: after WaitIdle ran %d, acked %d, pending %d; want %d, %d, 0",
				round, ran.Load(), st.Acked, pend.Count, total, total)
		}
	}
}
