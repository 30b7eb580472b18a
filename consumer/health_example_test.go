package consumer_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// A program driving a consumer (a probe, a test, a benchmark) learns that
// it is reading and that it has drained without asking Redis; Kubernetes
// probes get the same from ReadyHandler and LiveHandler.
func ExampleConsumer_WaitIdle() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	c := consumer.New(rdb, consumer.Config{Stream: "{mail}:jobs", Group: "senders", Block: 50 * time.Millisecond}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error { return nil }))
	probes := http.NewServeMux() // serve it with http.ListenAndServe
	probes.Handle("/readyz", c.ReadyHandler())
	probes.Handle("/livez", c.LiveHandler())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	<-c.Reading()
	fmt.Println("ready:", c.Health().Ready)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "{mail}:jobs"})
	for range 3 {
		job, _ := stream.NewJob("email.send", nil)
		_, _ = p.Enqueue(ctx, job)
	}
	if err := c.WaitIdle(ctx); err != nil {
		panic(err)
	}
	fmt.Println("acknowledged:", c.Stats().Acked)
	cancel()
	<-done
	fmt.Println("live after Run returned:", c.Health().Live)
	// Output:
	// ready: true
	// acknowledged: 3
	// live after Run returned: false
}
