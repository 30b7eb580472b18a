// Command quickstart shows Pelican end to end in one process.
//
//	go run ./examples/quickstart
//
// With REDIS_URL unset it starts an embedded, in-memory Redis (miniredis): no
// server to install, nothing kept after exit. With REDIS_URL set (for example
// redis://127.0.0.1:6379/0) it runs against that server, on streams of its
// own that it deletes afterwards.
//
// It enqueues jobs of two types with the Go producer, one job as a non-Go
// producer would send it (a plain XADD with a JSON payload), and one entry
// that is not a valid job; processes them; shows the malformed entry in the
// dead-letter stream; prints a summary and exits 0.
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

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/pelicantest"
	"github.com/pelicanqueue/pelican/stream"
)

// Email is the payload of an email.send job.
type Email struct {
	To      string `msgpack:"to" json:"to"`
	Subject string `msgpack:"subject" json:"subject"`
}

// Report is the payload of a report.build job.
type Report struct {
	Month string `msgpack:"month"`
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	// pelicantest.Open: the server at $REDIS_URL, or an embedded miniredis.
	server, err := pelicantest.Open(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	defer server.Close()
	rdb, where := server.Client, server.Where
	fmt.Println("redis:", where)

	name := fmt.Sprintf("quickstart:%d", time.Now().UnixNano())
	keys, _ := stream.KeysFor(name)
	defer rdb.Del(context.WithoutCancel(ctx), keys.Stream, keys.Dead, keys.Delayed)

	// Enqueue: three emails and a report with the Go producer (msgpack).
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	var jobs []*stream.Job
	for _, to := range []string{"ana@example.com", "bo@example.com", "cy@example.com"} {
		j, err := stream.NewJob("email.send", Email{To: to, Subject: "Welcome"})
		if err != nil {
			return err
		}
		j.IdempotencyKey = "welcome:" + to
		jobs = append(jobs, j)
	}
	report, err := stream.NewJob("report.build", Report{Month: "2026-11"})
	if err != nil {
		return err
	}
	jobs = append(jobs, report)
	if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
		return err
	}
	// A foreign producer needs nothing but XADD (JSON is the default content type).
	if err := rdb.Do(ctx, "XADD", name, "*", "type", "email.send",
		"payload", `{"to":"dee@example.com","subject":"Hello from redis-cli"}`).Err(); err != nil {
		return err
	}
	// Not a job: no type field. It is dead-lettered, never handed to a handler.
	if err := rdb.Do(ctx, "XADD", name, "*", "payload", "no type here").Err(); err != nil {
		return err
	}
	const valid = 5

	var emails, reports atomic.Int64
	mux := consumer.NewMux().
		HandleFunc("email.send", func(ctx context.Context, job *stream.Job) error {
			var e Email
			if err := job.Decode(&e); err != nil {
				return err
			}
			emails.Add(1)
			return nil
		}).
		HandleFunc("report.build", func(ctx context.Context, job *stream.Job) error {
			var r Report
			if err := job.Decode(&r); err != nil {
				return err
			}
			reports.Add(1)
			return nil
		})
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))
	c := consumer.New(rdb, consumer.Config{
		Stream:      name,
		Group:       "quickstart",
		Concurrency: 4,
		Block:       100 * time.Millisecond,
		Logger:      quiet,
	}).Handle(mux)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := c.Stats()
		if st.Acked == valid && st.DeadLettered == 1 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			return fmt.Errorf("jobs not processed in time: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}

	dead, err := rdb.XRange(ctx, keys.Dead, "-", "+").Result()
	if err != nil {
		return err
	}
	if len(dead) != 1 {
		return errors.New("expected one dead-lettered entry")
	}
	d := dead[0].Values
	fmt.Printf("processed: %d email.send, %d report.build\n", emails.Load(), reports.Load())
	fmt.Printf("dead-lettered: 1 entry, reason %v: %v\n", d["dead_reason"], d["dead_error"])
	fmt.Printf("  raw fields kept: payload=%q\n", d["payload"])
	pending, err := rdb.XPending(ctx, name, "quickstart").Result()
	if err != nil {
		return err
	}
	fmt.Printf("pending after shutdown: %d\n", pending.Count)
	return nil
}
