package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

type email struct {
	To string `msgpack:"to"`
}

// A consumer with a logging middleware and a Mux: two email jobs are sent,
// and a job of a type nobody handles goes to the dead-letter stream.
func Example() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	// Enqueue.
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "{mail}:jobs"})
	for _, to := range []string{"bob@example.com", "ann@example.com"} {
		job, _ := stream.NewJob("email.send", email{To: to})
		if _, err := p.Enqueue(ctx, job); err != nil {
			panic(err)
		}
	}
	fax, _ := stream.NewJob("fax.send", email{To: "+1 555 0100"})
	if _, err := p.Enqueue(ctx, fax); err != nil {
		panic(err)
	}

	// Process.
	var mu sync.Mutex
	var sent, seen []string
	logging := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			err := next.Process(ctx, job)
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s error=%v", job.Type, err != nil))
			mu.Unlock()
			return err
		})
	}
	mux := consumer.NewMux().HandleFunc("email.send", func(ctx context.Context, job *stream.Job) error {
		var e email
		if err := job.Decode(&e); err != nil {
			return err // a payload that does not decode is dead-lettered
		}
		mu.Lock()
		sent = append(sent, e.To)
		mu.Unlock()
		return nil
	})
	c := consumer.New(rdb, consumer.Config{
		Stream:   "{mail}:jobs",
		Group:    "mailers",
		Consumer: "worker-1",
		Block:    50 * time.Millisecond,
		Logger:   slog.New(slog.DiscardHandler),
	}).Use(logging).Handle(mux)

	go func() {
		// Wait until every job is settled, then stop.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if s := c.Stats(); s.Acked+s.DeadLettered == 3 {
				break
			}
		}
		_ = c.Shutdown(ctx)
	}()
	if err := c.Run(ctx); err != nil {
		panic(err)
	}

	// Summarise.
	slices.Sort(sent)
	slices.Sort(seen)
	fmt.Println("sent:", sent)
	fmt.Println("seen:", seen)
	keys, _ := stream.KeysFor("{mail}:jobs")
	dead, _ := rdb.XRange(ctx, keys.Dead, "-", "+").Result()
	for _, d := range dead {
		fmt.Println("dead:", d.Values["type"], d.Values["dead_reason"])
	}
	s := c.Stats()
	fmt.Printf("acked=%d dead=%d pending=%d\n", s.Acked, s.DeadLettered,
		rdb.XPending(ctx, "{mail}:jobs", "mailers").Val().Count)
	// Output:
	// sent: [ann@example.com bob@example.com]
	// seen: [email.send error=false email.send error=false fax.send error=true]
	// dead: fax.send unknown_type
	// acked=2 dead=1 pending=0
}

// Decide is the one place the outcome rules live: the consumer settles
// every job from its Decision, and middleware that needs the outcome asks
// it rather than deriving it. Outside a consumer the Config defaults apply.
func ExampleDecide() {
	ctx := context.Background()
	job := &stream.Job{ID: "job-1", EntryID: "1700000000000-0", Type: "email.send", Attempt: 2, AttemptLimit: 3}
	for _, err := range []error{
		nil,
		consumer.Snooze(time.Minute),
		consumer.Permanent(errors.New("no such mailbox")),
		errors.New("smtp: connection refused"), // the third and last attempt
	} {
		d := consumer.Decide(ctx, job, err)
		fmt.Printf("%v: %s %s (attempt %d of %d)\n", err, d.Kind, d.Reason, d.Attempt, d.MaxAttempts)
	}
	// Output:
	// <nil>: ack  (attempt 3 of 3)
	// snooze 1m0s: snooze  (attempt 3 of 3)
	// no such mailbox: dead_letter permanent (attempt 3 of 3)
	// smtp: connection refused: dead_letter exhausted (attempt 3 of 3)
}

// Delays of the first attempts with equal jitter: between half and all of
// the raw delay, which doubles from Base up to Cap. The jitter comes from a
// hash of the job, so the delay of one job's attempt is the same wherever
// it is computed.
func ExampleBackoff_Delay() {
	b := consumer.Backoff{Base: time.Second, Cap: 10 * time.Second}
	job := &stream.Job{ID: "job-1", EntryID: "1700000000000-0"}
	for attempt := range 6 {
		job.Attempt = attempt
		d := b.Delay(job)
		fmt.Printf("attempt %d: raw %v, delay within [raw/2, raw]: %v\n", attempt, b.Raw(attempt), d >= b.Raw(attempt)/2 && d <= b.Raw(attempt))
	}
	// Output:
	// attempt 0: raw 1s, delay within [raw/2, raw]: true
	// attempt 1: raw 2s, delay within [raw/2, raw]: true
	// attempt 2: raw 4s, delay within [raw/2, raw]: true
	// attempt 3: raw 8s, delay within [raw/2, raw]: true
	// attempt 4: raw 10s, delay within [raw/2, raw]: true
	// attempt 5: raw 10s, delay within [raw/2, raw]: true
}

// A configuration is checked before Run touches Redis; Validate checks it
// earlier. A middleware built from an invalid configuration (Invalid) makes
// Run fail the same way.
func ExampleConfig_Validate() {
	fmt.Println(consumer.Config{Stream: "emails"}.Validate())
	fmt.Println(consumer.Config{Stream: "emails", Group: "senders", Backoff: consumer.Backoff{Base: 2 * time.Hour}}.Validate())
	c := consumer.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), consumer.Config{Stream: "emails", Group: "senders"}).
		Use(consumer.Invalid(errors.New("mymiddleware: Config.Limit (-1) must not be negative"))).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	fmt.Println(c.Run(context.Background()))
	// Output:
	// consumer: Config.Group is required
	// consumer: Config.Backoff.Base (2h0m0s) must not exceed Backoff.Cap (1h0m0s)
	// mymiddleware: Config.Limit (-1) must not be negative
}

// A consumer holds up to Prefetch jobs read but not started beyond the
// Concurrency it runs: here 2 running and 3 queued, all pending under it
// (their leases kept by the heartbeat), while the other 5 wait in the
// stream for whichever consumer has room.
func ExampleConfig_prefetch() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "{mail}:prefetch"})
	for range 10 {
		job, _ := stream.NewJob("email.send", email{To: "bob@example.com"})
		if _, err := p.Enqueue(ctx, job); err != nil {
			panic(err)
		}
	}
	release := make(chan struct{})
	c := consumer.New(rdb, consumer.Config{Stream: "{mail}:prefetch", Group: "senders", Consumer: "c1",
		Concurrency: 2, Prefetch: 3, Logger: slog.New(slog.DiscardHandler)}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			<-release
			return nil
		}))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	held := func() int64 {
		pe, err := rdb.XPending(ctx, "{mail}:prefetch", "senders").Result()
		if err != nil {
			return 0
		}
		return pe.Count
	}
	for deadline := time.Now().Add(5 * time.Second); held() < 5 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("held by the consumer:", held())
	close(release)
	for deadline := time.Now().Add(5 * time.Second); c.Stats().Acked < 10 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("acknowledged:", c.Stats().Acked)
	if err := c.Shutdown(ctx); err != nil {
		panic(err)
	}
	<-done
	// Output:
	// held by the consumer: 5
	// acknowledged: 10
}
