package pelicantest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/pelicantest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// signup is the payload of a user.signup job.
type signup struct {
	Email string `msgpack:"email"`
}

// welcome is a handler under test: it sends the welcome email by enqueueing
// an email.send job on another queue.
func welcome(emails *stream.Producer) consumer.HandlerFunc {
	return func(ctx context.Context, job *stream.Job) error {
		var s signup
		if err := job.Decode(&s); err != nil {
			return err
		}
		if s.Email == "" {
			return consumer.Permanent(errors.New("no email address"))
		}
		mail, err := stream.NewJob("email.send", map[string]string{"to": s.Email})
		if err != nil {
			return err
		}
		mail.IdempotencyKey = "welcome:" + s.Email
		_, err = emails.Enqueue(ctx, mail)
		return err
	}
}

// A job through a real consumer: the outcome, and what the handler enqueued.
func ExampleRun() {
	t := newExampleT() // a *testing.T in a test
	defer t.done()

	r := pelicantest.NewRedis(t)
	emails := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: r.Name("emails")})
	job, _ := stream.NewJob("user.signup", signup{Email: "ana@example.com"})

	res := pelicantest.Run(t, welcome(emails), job, pelicantest.WithRedis(r))
	fmt.Println("outcome:", res.Outcome)
	for _, j := range res.Enqueued {
		fmt.Println("enqueued:", j.Type, j.IdempotencyKey)
	}
	mail := pelicantest.RequireEnqueued(t, r.Client, r.Name("emails"), pelicantest.Type("email.send"))
	var to map[string]string
	_ = mail.Decode(&to)
	fmt.Println("to:", to["to"])
	// Output:
	// outcome: done
	// enqueued: email.send welcome:ana@example.com
	// to: ana@example.com
}

// The application's own middleware chain decides: a permanent error is
// dead-lettered by middleware.Retry at once.
func ExampleWithMiddleware() {
	t := newExampleT()
	defer t.done()

	r := pelicantest.NewRedis(t)
	emails := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: r.Name("emails")})
	job, _ := stream.NewJob("user.signup", signup{})

	res := pelicantest.Run(t, welcome(emails), job, pelicantest.WithRedis(r),
		pelicantest.WithMiddleware(middleware.Retry(middleware.RetryConfig{})))
	fmt.Println("outcome:", res.Outcome, res.Reason)
	fmt.Println("dead_error:", res.DeadError)
	fmt.Println("enqueued:", len(res.Enqueued))
	// Output:
	// outcome: dead permanent
	// dead_error: no email address
	// enqueued: 0
}

// A retry: its delay, and the job as its next attempt will see it.
func ExampleRun_retry() {
	t := newExampleT()
	defer t.done()

	flaky := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		return consumer.Retry(time.Minute, errors.New("smtp: 421 try later"))
	})
	job, _ := stream.NewJob("email.send", map[string]string{"to": "bo@example.com"})

	res := pelicantest.Run(t, flaky, job)
	fmt.Println("outcome:", res.Outcome, "in", res.Delay)
	fmt.Println("next attempt:", res.Next.Attempt, "last error:", res.Next.LastError)
	// Output:
	// outcome: retried in 1m0s
	// next attempt: 1 last error: smtp: 421 try later
}

// Advance makes an hour pass for Redis: a job scheduled in an hour falls
// due, and a job whose worker died looks idle past the visibility timeout.
func ExampleRedis_Advance() {
	t := newExampleT()
	defer t.done()
	ctx := context.Background()

	r := pelicantest.NewRedis(t)
	reminders := r.Name("reminders")
	p := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: reminders})
	later, _ := stream.NewJob("reminder.send", nil)
	_ = p.EnqueueIn(ctx, later, time.Hour)

	moved, _ := stream.PromoteDue(ctx, r.Client, reminders, 10)
	fmt.Println("due now:", moved)
	r.Advance(t, time.Hour)
	moved, _ = stream.PromoteDue(ctx, r.Client, reminders, 10)
	fmt.Println("due after an hour:", moved)

	// A worker read the job and died: after the visibility timeout the
	// sweep of any consumer takes it over.
	_ = r.Client.XGroupCreate(ctx, reminders, "senders", "0").Err()
	_ = r.Client.Do(ctx, "XREADGROUP", "GROUP", "senders", "dead-worker", "COUNT", 1, "STREAMS", reminders, ">").Err()
	r.Advance(t, consumer.DefaultVisibilityTimeout)
	pending, _ := r.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: reminders, Group: "senders", Start: "-", End: "+", Count: 10}).Result()
	fmt.Println("idle past the visibility timeout:", pending[0].Idle >= consumer.DefaultVisibilityTimeout)
	// Output:
	// due now: 0
	// due after an hour: 1
	// idle past the visibility timeout: true
}

// What a handler schedules is in Result.Scheduled; a job snoozed without a
// delay comes back at once, and its new entry is not counted as enqueued.
func ExampleResult_scheduled() {
	t := newExampleT()
	defer t.done()

	r := pelicantest.NewRedis(t)
	reminders := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: r.Name("reminders")})
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		later, _ := stream.NewJob("reminder.send", nil)
		if err := reminders.EnqueueIn(ctx, later, 24*time.Hour); err != nil {
			return err
		}
		return consumer.Snooze(0) // the quota is used up: run again later, not counted as a failure
	})
	job, _ := stream.NewJob("trial.started", nil)

	res := pelicantest.Run(t, h, job, pelicantest.WithRedis(r))
	fmt.Println("outcome:", res.Outcome, "attempt:", res.Next.Attempt, "delay:", res.Delay)
	fmt.Println("enqueued:", len(res.Enqueued))
	for _, s := range res.Scheduled {
		fmt.Println("scheduled:", s.Job.Type, "in about", time.Until(s.Due).Round(time.Hour))
	}
	// Output:
	// outcome: snoozed attempt: 0 delay: 0s
	// enqueued: 0
	// scheduled: reminder.send in about 24h0m0s
}
