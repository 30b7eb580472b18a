package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// A pool of two queues sharing four worker slots: payments weighs three
// times as much as emails and has one slot reserved, and both queues share
// one middleware chain.
func ExamplePool() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	for _, s := range []string{"payments", "emails"} {
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
		for i := range 5 {
			job, _ := stream.NewJob(s+".send", i)
			if _, err := p.Enqueue(ctx, job); err != nil {
				panic(err)
			}
		}
	}

	var mu sync.Mutex
	done := map[string]int{}
	counting := func(next consumer.Handler) consumer.Handler { // shared by both queues
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			err := next.Process(ctx, job)
			mu.Lock()
			done[job.Stream]++
			mu.Unlock()
			return err
		})
	}
	ok := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })

	pool := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Logger: slog.New(slog.DiscardHandler)})
	payments := pool.Add(consumer.Config{Stream: "payments", Group: "workers", Block: 50 * time.Millisecond},
		consumer.QueueOptions{Weight: 3, Min: 1}).Use(counting).Handle(ok)
	emails := pool.Add(consumer.Config{Stream: "emails", Group: "workers", Block: 50 * time.Millisecond},
		consumer.QueueOptions{Weight: 1}).Use(counting).Handle(ok)
	if err := pool.Validate(); err != nil {
		panic(err)
	}

	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if payments.Stats().Acked == 5 && emails.Stats().Acked == 5 {
				break
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = pool.Shutdown(sctx)
	}()
	if err := pool.Run(ctx); err != nil {
		panic(err)
	}
	fmt.Println("payments done:", done["payments"])
	fmt.Println("emails done:", done["emails"])
	// Output:
	// payments done: 5
	// emails done: 5
}
