package stream_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// With EnqueueOnce, a job with an idempotency key is added once per
// window: a retry, or another producer, gets the first job back.
func ExampleProducerConfig_enqueueOnce() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	mr.SetTime(time.UnixMilli(1700000000000))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "invoices", EnqueueOnce: 24 * time.Hour})
	first := &stream.Job{ID: "job-1", Type: "invoice.send", IdempotencyKey: "invoice-1042-send"}
	id, err := p.Enqueue(ctx, first)
	if err != nil {
		panic(err) // maybe enqueued: retrying is safe
	}
	fmt.Println("added", id, first.ID)

	again := &stream.Job{ID: "job-2", Type: "invoice.send", IdempotencyKey: "invoice-1042-send"}
	id, err = p.Enqueue(ctx, again)
	if err != nil {
		panic(err)
	}
	fmt.Println("duplicate of", id, again.ID)
	fmt.Println("entries:", rdb.XLen(ctx, "invoices").Val())
	// Output:
	// added 1700000000000-0 job-1
	// duplicate of 1700000000000-0 job-1
	// entries: 1
}
