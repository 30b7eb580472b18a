package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// orderQueue is a running consumer on its own miniredis.
type orderQueue struct {
	t        *testing.T
	rdb      *redis.Client
	c        *consumer.Consumer
	stream   string
	dead     string
	producer *stream.Producer
}

// orderStart runs a consumer of a fresh stream with mws around h, until the
// test ends. cfg's Stream, Group, Consumer, Block, PromoteInterval and
// Logger are set here.
func orderStart(t *testing.T, cfg consumer.Config, h consumer.Handler, mws ...consumer.Middleware) *orderQueue {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	cfg.Stream = "{q}:jobs"
	cfg.Group = "workers"
	cfg.Consumer = "w1"
	cfg.Block = 20 * time.Millisecond
	cfg.PromoteInterval = 10 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	keys, err := stream.KeysFor(cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	q := &orderQueue{t: t, rdb: rdb, stream: cfg.Stream, dead: keys.Dead,
		producer: stream.NewProducer(rdb, stream.ProducerConfig{Stream: cfg.Stream})}
	q.c = consumer.New(rdb, cfg).Use(mws...).Handle(h)
	done := make(chan error, 1)
	go func() { done <- q.c.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := q.c.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return q
}

// enqueue adds a job of type typ with payload "secret" and returns it.
func (q *orderQueue) enqueue(typ string, edit func(*stream.Job)) *stream.Job {
	q.t.Helper()
	job := &stream.Job{Type: typ, Payload: []byte(`"secret"`)}
	if edit != nil {
		edit(job)
	}
	if _, err := q.producer.Enqueue(context.Background(), job); err != nil {
		q.t.Fatal(err)
	}
	return job
}

// waitFor polls cond until it holds, failing the test after 10s.
func (q *orderQueue) waitFor(what string, cond func() bool) {
	q.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			q.t.Fatalf("timed out waiting for %s (stats %+v)", what, q.c.Stats())
		}
	}
}

// waitDead waits for the dead-letter stream to hold n entries and returns
// them.
func (q *orderQueue) waitDead(n int) []redis.XMessage {
	q.t.Helper()
	var dead []redis.XMessage
	q.waitFor(fmt.Sprintf("%d dead-letter entries", n), func() bool {
		dead = q.rdb.XRange(context.Background(), q.dead, "-", "+").Val()
		return len(dead) >= n
	})
	if len(dead) != n {
		q.t.Fatalf("%d dead-letter entries, want %d", len(dead), n)
	}
	return dead
}

// orderLog records what the middleware chain and the handler do, in order.
type orderLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *orderLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *orderLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// rec returns a middleware that logs its entry (with whether the context
// has a deadline) and its exit (with the outcome it sees).
func (l *orderLog) rec(name string) consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			_, deadline := ctx.Deadline()
			l.add("%s> attempt=%d deadline=%v", name, job.Attempt, deadline)
			err := next.Process(ctx, job)
			l.add("<%s %s", name, orderDescribe(err))
			return err
		})
	}
}

// orderDescribe is retryDescribe without delays, and the first line of an
// error's text.
func orderDescribe(err error) string {
	d := retryDescribe(err)
	if strings.HasPrefix(d, "retry ") {
		d = "retry"
	}
	d, _, _ = strings.Cut(d, "\n")
	return d
}

// orderDeadLetters collects the OnDeadLetter calls.
type orderDeadLetters struct {
	mu  sync.Mutex
	got []consumer.DeadLetter
}

func (d *orderDeadLetters) hook(_ context.Context, dl consumer.DeadLetter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, dl)
}

func (d *orderDeadLetters) all() []consumer.DeadLetter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.got)
}

// orderChain is the chain under test, with recorders between its members:
// rec(outer), Retry, rec(retry|dlq), DeadLetter, rec(dlq|timeout), Timeout,
// rec(inner).
func orderChain(log *orderLog, retry middleware.RetryConfig) []consumer.Middleware {
	return []consumer.Middleware{
		log.rec("outer"),
		middleware.Retry(retry),
		log.rec("retry|dlq"),
		middleware.DeadLetter(middleware.DeadLetterConfig{MaxAge: time.Hour}),
		log.rec("dlq|timeout"),
		middleware.Timeout(middleware.TimeoutConfig{Default: 5 * time.Second, PerType: map[string]time.Duration{"slow": 20 * time.Millisecond}}),
		log.rec("inner"),
	}
}

// orderConfig is cfg with a fast backoff, a redaction of the payload and
// hooks as the dead-letter alert hook.
func orderConfig(hooks *orderDeadLetters, cfg consumer.Config) consumer.Config {
	cfg.Backoff = consumer.Backoff{Base: time.Millisecond, Jitter: consumer.JitterNone}
	cfg.RedactDeadLetter = func(*stream.Job) map[string]string { return map[string]string{"payload": "<redacted>"} }
	cfg.OnDeadLetter = hooks.hook
	return cfg
}

// orderCheckDead checks one dead-letter entry: its reason, the redacted
// payload, and the OnDeadLetter call naming it.
func orderCheckDead(t *testing.T, entry redis.XMessage, hooks *orderDeadLetters, job *stream.Job, reason string) {
	t.Helper()
	if got := entry.Values["dead_reason"]; got != reason {
		t.Errorf("dead_reason = %v, want %s (entry %v)", got, reason, entry.Values)
	}
	if got := entry.Values["payload"]; got != "<redacted>" {
		t.Errorf("dead-letter payload = %v, want <redacted>", got)
	}
	if got := entry.Values["job_id"]; got != job.ID {
		t.Errorf("dead-letter job_id = %v, want %s", got, job.ID)
	}
	var calls []consumer.DeadLetter
	for range 200 { // Recorded runs just after the write
		if calls = hooks.all(); len(calls) > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(calls) != 1 {
		t.Fatalf("OnDeadLetter called %d times, want 1", len(calls))
	}
	if c := calls[0]; c.DeadEntryID != entry.ID || c.Reason != reason || c.Job == nil || c.Job.ID != job.ID {
		t.Errorf("OnDeadLetter got entry %s reason %s job %v, want %s %s %s", c.DeadEntryID, c.Reason, c.Job, entry.ID, reason, job.ID)
	}
}

// TestOrder runs the recommended chain on a real consumer and checks the
// entry and exit order of its members and the outcome flow through them.
func TestOrder(t *testing.T) {
	t.Parallel()
	fastRetry := middleware.RetryConfig{}

	t.Run("permanent", func(t *testing.T) {
		t.Parallel()
		log, hooks := &orderLog{}, &orderDeadLetters{}
		h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			log.add("handler")
			return consumer.Permanent(errors.New("bad input"))
		})
		q := orderStart(t, orderConfig(hooks, consumer.Config{}), h, orderChain(log, fastRetry)...)
		job := q.enqueue("send", nil)
		dead := q.waitDead(1)
		orderCheckDead(t, dead[0], hooks, job, consumer.ReasonPermanent)
		if got := dead[0].Values["dead_error"]; got != "bad input" {
			t.Errorf("dead_error = %v, want bad input", got)
		}
		// Outermost first; Timeout between dlq|timeout and inner (the
		// deadline appears there); the error stays a plain marked error
		// until Retry, which makes it the Dead outcome.
		want := []string{
			"outer> attempt=0 deadline=false",
			"retry|dlq> attempt=0 deadline=false",
			"dlq|timeout> attempt=0 deadline=false",
			"inner> attempt=0 deadline=true",
			"handler",
			"<inner error: bad input",
			"<dlq|timeout error: bad input",
			"<retry|dlq error: bad input",
			"<outer dead permanent",
		}
		if got := log.get(); !slices.Equal(got, want) {
			t.Errorf("chain log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})

	t.Run("exhausted", func(t *testing.T) {
		t.Parallel()
		log, hooks := &orderLog{}, &orderDeadLetters{}
		var mu sync.Mutex
		var history [][]string
		h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			mu.Lock()
			history = append(history, job.ErrorHistory)
			mu.Unlock()
			return fmt.Errorf("flaky %d", job.Attempt)
		})
		q := orderStart(t, orderConfig(hooks, consumer.Config{}), h, orderChain(log, fastRetry)...)
		job := q.enqueue("send", func(j *stream.Job) { j.MaxAttempts = 2 })
		dead := q.waitDead(1)
		// Retry, outside DeadLetter, decided this death: the recorder
		// applies all the same.
		orderCheckDead(t, dead[0], hooks, job, consumer.ReasonExhausted)
		v := dead[0].Values
		if v["dead_attempts"] != "2" || v["error_history"] != `["flaky 0","flaky 1"]` || v["dead_error"] != "attempt 2 of 2: flaky 1" ||
			v["last_error"] != "flaky 1" || v["first_failed_at"] == nil {
			t.Errorf("dead-letter entry %v: want 2 attempts, error_history [flaky 0, flaky 1], last_error flaky 1, dead_error \"attempt 2 of 2: flaky 1\", first_failed_at", v)
		}
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(history) != "[[] [flaky 0]]" {
			t.Errorf("handler saw error histories %v, want [[] [flaky 0]]", history)
		}
		want := []string{
			"outer> attempt=0 deadline=false",
			"retry|dlq> attempt=0 deadline=false",
			"dlq|timeout> attempt=0 deadline=false",
			"inner> attempt=0 deadline=true",
			"<inner error: flaky 0",
			"<dlq|timeout error: flaky 0",
			"<retry|dlq error: flaky 0",
			"<outer retryable",
			"outer> attempt=1 deadline=false",
			"retry|dlq> attempt=1 deadline=false",
			"dlq|timeout> attempt=1 deadline=false",
			"inner> attempt=1 deadline=true",
			"<inner error: flaky 1",
			"<dlq|timeout error: flaky 1",
			"<retry|dlq error: flaky 1",
			"<outer retryable", // the consumer decides the last attempt's death
		}
		if got := log.get(); !slices.Equal(got, want) {
			t.Errorf("chain log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})

	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		log, hooks := &orderLog{}, &orderDeadLetters{}
		h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			log.add("handler")
			return nil
		})
		q := orderStart(t, orderConfig(hooks, consumer.Config{}), h, orderChain(log, fastRetry)...)
		job := q.enqueue("send", func(j *stream.Job) { j.CreatedAt = time.Now().Add(-2 * time.Hour) })
		dead := q.waitDead(1)
		orderCheckDead(t, dead[0], hooks, job, middleware.ReasonExpired)
		// DeadLetter decides before anything inside it runs; Retry passes
		// its outcome through.
		want := []string{
			"outer> attempt=0 deadline=false",
			"retry|dlq> attempt=0 deadline=false",
			"<retry|dlq dead expired",
			"<outer dead expired",
		}
		if got := log.get(); !slices.Equal(got, want) {
			t.Errorf("chain log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})

	t.Run("timeout retried", func(t *testing.T) {
		t.Parallel()
		log, hooks := &orderLog{}, &orderDeadLetters{}
		h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if job.Attempt == 0 {
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		})
		q := orderStart(t, orderConfig(hooks, consumer.Config{}), h, orderChain(log, fastRetry)...)
		q.enqueue("slow", nil)
		q.waitFor("the job acknowledged", func() bool { return q.c.Stats().Acked == 1 })
		want := []string{
			"outer> attempt=0 deadline=false",
			"retry|dlq> attempt=0 deadline=false",
			"dlq|timeout> attempt=0 deadline=false",
			"inner> attempt=0 deadline=true",
			"<inner error: context deadline exceeded",
			"<dlq|timeout error: middleware: job timeout after 20ms: context deadline exceeded",
			"<retry|dlq error: middleware: job timeout after 20ms: context deadline exceeded",
			"<outer retryable",
			"outer> attempt=1 deadline=false",
			"retry|dlq> attempt=1 deadline=false",
			"dlq|timeout> attempt=1 deadline=false",
			"inner> attempt=1 deadline=true",
			"<inner nil",
			"<dlq|timeout nil",
			"<retry|dlq nil",
			"<outer nil",
		}
		if got := log.get(); !slices.Equal(got, want) {
			t.Errorf("chain log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if n := len(hooks.all()); n != 0 {
			t.Errorf("OnDeadLetter called %d times, want 0", n)
		}
	})

	t.Run("panic dead-lettered", func(t *testing.T) {
		t.Parallel()
		log, hooks := &orderLog{}, &orderDeadLetters{}
		h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error { panic("boom") })
		q := orderStart(t, orderConfig(hooks, consumer.Config{}), h, orderChain(log, fastRetry)...)
		job := q.enqueue("send", nil)
		dead := q.waitDead(1)
		orderCheckDead(t, dead[0], hooks, job, consumer.ReasonPanic)
		if e := fmt.Sprint(dead[0].Values["dead_error"]); !strings.HasPrefix(e, "panic: boom") || !strings.Contains(e, "goroutine") {
			t.Errorf("dead_error = %q, want the panic value and the stack", e)
		}
		// The panic unwinds every recorder; the consumer recovers it where
		// the chain runs and dead-letters the job.
		want := []string{
			"outer> attempt=0 deadline=false",
			"retry|dlq> attempt=0 deadline=false",
			"dlq|timeout> attempt=0 deadline=false",
			"inner> attempt=0 deadline=true",
		}
		if got := log.get(); !slices.Equal(got, want) {
			t.Errorf("chain log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})

	t.Run("panic retried", func(t *testing.T) {
		t.Parallel()
		log, hooks := &orderLog{}, &orderDeadLetters{}
		var mu sync.Mutex
		var history [][]string
		h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			mu.Lock()
			history = append(history, job.ErrorHistory)
			mu.Unlock()
			if job.Attempt == 0 {
				panic("boom")
			}
			return nil
		})
		q := orderStart(t, orderConfig(hooks, consumer.Config{Panic: consumer.PanicRetry}), h, orderChain(log, fastRetry)...)
		q.enqueue("send", nil)
		q.waitFor("the job acknowledged", func() bool { return q.c.Stats().Acked == 1 })
		if s := q.c.Stats(); s.DeadLettered != 0 || s.Retried != 1 {
			t.Errorf("stats %+v, want 1 retry and no dead letter", s)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(history) != 2 || len(history[1]) != 1 || !strings.HasPrefix(history[1][0], "panic: boom") {
			t.Errorf("handler saw error histories %q, want the panic on the second attempt", history)
		}
	})
}
