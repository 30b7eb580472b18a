package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/leakcheck"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// TestMain fails the package when goroutines of the consumer or the claimer
// are still running after every test has returned.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 5*time.Second, "pelican/consumer.(*Consumer)", "pelican/consumer.(*Pool)", "pelican/claim.")
}

var discard = slog.New(slog.DiscardHandler)

// atOnce is a Backoff whose delay is under a millisecond: a retry runs at
// once.
var atOnce = consumer.Backoff{Base: time.Nanosecond, Cap: time.Nanosecond}

// bundle is what a consumer test inspects besides the consumer.
type bundle struct {
	m    *miniredis.Miniredis
	rdb  *redis.Client
	keys stream.Keys
	prod *stream.Producer
	// cfg is a fast configuration for this test's own stream: short reads,
	// frequent promotion, no logs. Tests adjust it before calling newConsumer.
	cfg consumer.Config
}

// setup starts a miniredis for t and returns a bundle with a stream named
// after the test.
func setup(t *testing.T) *bundle {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	name := "{" + strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + "}:jobs"
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatalf("KeysFor(%q): %v", name, err)
	}
	return &bundle{
		m:    m,
		rdb:  rdb,
		keys: keys,
		prod: stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}),
		cfg: consumer.Config{
			Stream:          name,
			Group:           "workers",
			Consumer:        "c1",
			Block:           20 * time.Millisecond,
			PromoteInterval: 10 * time.Millisecond,
			Logger:          discard,
		},
	}
}

// running is a consumer whose Run runs in a goroutine.
type running struct {
	c    *consumer.Consumer
	done chan struct{}
	err  error // Run's result, set when done is closed
}

// start runs c until the test ends (or until stop).
func start(t *testing.T, c *consumer.Consumer) *running {
	t.Helper()
	r := &running{c: c, done: make(chan struct{})}
	go func() {
		r.err = c.Run(context.Background())
		close(r.done)
	}()
	t.Cleanup(func() { _ = r.stop(t) })
	return r
}

// stop shuts the consumer down and waits for Run to return; it returns
// Shutdown's error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.c.Shutdown(ctx)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Errorf("Run did not return after Shutdown")
	}
	return err
}

// waitFor polls cond until it holds, and fails the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, timeout, poll.True(what, cond))
}

// stallWatch starts a [redistest.StallWatch] on rdb that stops when the
// test ends. Any client does: a PING to an in-process miniredis measures
// this process's stalls.
func stallWatch(t *testing.T, rdb redis.UniversalClient) *redistest.StallWatch {
	t.Helper()
	w := redistest.WatchStalls(rdb, 2*redistest.StallInterval)
	t.Cleanup(w.Stop)
	return w
}

// tookOver returns the time since t0 and the stalls w measured in it, and
// reports whether that time exceeds bound plus those stalls: whether the
// code under test, not a busy machine, took longer than bound.
func tookOver(w *redistest.StallWatch, t0 time.Time, bound time.Duration) (took, stalled time.Duration, over bool) {
	now := time.Now()
	took, stalled = now.Sub(t0), w.Within(t0, now)
	return took, stalled, took > bound+stalled
}

// recv waits for a value from ch, failing the test after timeout.
func recv[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
		var zero T
		return zero
	}
}

// enqueue adds a job of type typ with a JSON payload and returns its entry
// ID and the job as enqueued.
func (b *bundle) enqueue(t *testing.T, typ string, payload any) (string, *stream.Job) {
	t.Helper()
	job, err := stream.NewJSONJob(typ, payload)
	if err != nil {
		t.Fatalf("NewJSONJob: %v", err)
	}
	id, err := b.prod.Enqueue(context.Background(), job)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return id, job
}

// entries returns every entry of key.
func (b *bundle) entries(t *testing.T, key string) []redis.XMessage {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), key, "-", "+").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("XRANGE %s: %v", key, err)
	}
	return msgs
}

// dead returns the dead-letter stream's entries.
func (b *bundle) dead(t *testing.T) []redis.XMessage { return b.entries(t, b.keys.Dead) }

// pending returns the group's pending entries, up to 1000.
func (b *bundle) pending(t *testing.T) []redis.XPendingExt {
	t.Helper()
	p, err := b.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: b.cfg.Stream, Group: b.cfg.Group, Start: "-", End: "+", Count: 1000,
	}).Result()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	return p
}

// delayed returns the number of jobs in the delayed set.
func (b *bundle) delayed(t *testing.T) int64 {
	t.Helper()
	n, err := b.rdb.ZCard(context.Background(), b.keys.Delayed).Result()
	if err != nil {
		t.Fatalf("ZCARD: %v", err)
	}
	return n
}

// field returns a field of a stream entry as a string.
func field(m redis.XMessage, name string) string {
	s, _ := m.Values[name].(string)
	return s
}

// jobLog records the jobs a handler saw, in order.
type jobLog struct {
	mu   sync.Mutex
	jobs []stream.Job
}

func (l *jobLog) add(j *stream.Job) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs = append(l.jobs, *j)
	return len(l.jobs)
}

func (l *jobLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.jobs)
}

func (l *jobLog) get(i int) stream.Job {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.jobs[i]
}

func TestConsumer_Run(t *testing.T) {
	t.Parallel()

	t.Run("AcksEveryJob", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 50
		jobs := make([]*stream.Job, n)
		for i := range jobs {
			j, err := stream.NewJSONJob("count", i)
			if err != nil {
				t.Fatal(err)
			}
			jobs[i] = j
		}
		if _, err := b.prod.EnqueueBatch(context.Background(), jobs); err != nil {
			t.Fatalf("EnqueueBatch: %v", err)
		}
		var mu sync.Mutex
		seen := map[string]int{}
		b.cfg.Concurrency = 8
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			mu.Lock()
			seen[job.ID]++
			mu.Unlock()
			return nil
		}))
		r := start(t, c)
		waitFor(t, 5*time.Second, "every job acknowledged", func() bool { return c.Stats().Acked >= n })
		if err := r.stop(t); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		if got := c.Stats(); got != (consumer.Stats{Acked: n}) {
			t.Errorf("Stats() = %+v, want only Acked = %d", got, n)
		}
		if p := b.pending(t); len(p) != 0 {
			t.Errorf("XPENDING lists %d entries after every job was acknowledged: %v", len(p), p)
		}
		for _, j := range jobs {
			if seen[j.ID] != 1 {
				t.Errorf("job %s ran %d times, want 1", j.ID, seen[j.ID])
			}
		}
		if len(seen) != n {
			t.Errorf("handler saw %d distinct jobs, want %d", len(seen), n)
		}
	})

	t.Run("DeliversJobFields", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		job := &stream.Job{Type: "t", Payload: []byte(`{"a":1}`), IdempotencyKey: "ik-1",
			Headers: map[string]string{"tenant": "acme"}}
		id, err := b.prod.Enqueue(context.Background(), job)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan stream.Job, 1)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			got <- *j
			return nil
		}))
		start(t, c)
		j := recv(t, got, 5*time.Second, "the job")
		if j.ID != job.ID || j.EntryID != id || j.Stream != b.cfg.Stream || j.Deliveries != 1 || j.Attempt != 0 ||
			string(j.Payload) != `{"a":1}` || j.IdempotencyKey != "ik-1" || j.Headers["tenant"] != "acme" {
			t.Errorf("handler got %+v; want ID %s, EntryID %s, Stream %s, Deliveries 1, the payload, key and header",
				j, job.ID, id, b.cfg.Stream)
		}
	})
}

func TestConsumer_Retry(t *testing.T) {
	t.Parallel()

	t.Run("RetryOutcomeSchedulesNextAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Redis time is frozen, so the retry stays in the delayed set until
		// the test moves the clock past its due time.
		t0 := time.Now().Truncate(time.Millisecond)
		b.m.SetTime(t0)
		firstID, _ := b.enqueue(t, "flaky", map[string]int{"n": 1})
		var seen jobLog
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if seen.add(job) == 1 {
				return consumer.Retry(time.Hour, errors.New("upstream 503"))
			}
			return nil
		}))
		start(t, c)

		waitFor(t, 5*time.Second, "the retry in the delayed set", func() bool {
			return b.delayed(t) == 1 && len(b.pending(t)) == 0
		})
		// The settled entry is deleted by the next ack batch.
		waitFor(t, 5*time.Second, "the settled entry deleted before promotion", func() bool {
			return len(b.entries(t, b.cfg.Stream)) == 0
		})
		waitFor(t, 5*time.Second, "Stats().Retried = 1", func() bool { return c.Stats().Retried == 1 })

		b.m.SetTime(t0.Add(time.Hour))
		waitFor(t, 5*time.Second, "the second attempt", func() bool { return seen.len() == 2 })
		waitFor(t, 5*time.Second, "the second attempt acknowledged", func() bool { return c.Stats().Acked == 1 })

		first, second := seen.get(0), seen.get(1)
		if second.EntryID == firstID || second.EntryID == "" {
			t.Errorf("second attempt came from entry %q; want a new entry, not %s", second.EntryID, firstID)
		}
		if second.Attempt != first.Attempt+1 {
			t.Errorf("second attempt has Attempt %d, want %d", second.Attempt, first.Attempt+1)
		}
		if second.ID != first.ID {
			t.Errorf("second attempt has job ID %q, want the first's %q", second.ID, first.ID)
		}
		if second.LastError != "upstream 503" {
			t.Errorf("second attempt has LastError %q, want the inner error text %q", second.LastError, "upstream 503")
		}
		if !second.CreatedAt.Equal(first.CreatedAt) || first.CreatedAt.IsZero() {
			t.Errorf("second attempt has CreatedAt %v, want the first's %v", second.CreatedAt, first.CreatedAt)
		}
		if string(second.Payload) != string(first.Payload) || second.Type != first.Type {
			t.Errorf("second attempt is %s %q, want %s %q", second.Type, second.Payload, first.Type, first.Payload)
		}
		if n := b.delayed(t); n != 0 {
			t.Errorf("delayed set holds %d jobs after promotion, want 0", n)
		}
	})

	t.Run("PlainErrorUsesBackoffUntilExhausted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		entryID, job := b.enqueue(t, "always-fails", "x")
		b.cfg.MaxAttempts = 3
		b.cfg.Backoff = consumer.Backoff{Base: 2 * time.Millisecond, Cap: 2 * time.Millisecond, Jitter: consumer.JitterNone}
		var seen jobLog
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			n := seen.add(j)
			return fmt.Errorf("boom %d", n)
		}))
		r := start(t, c)
		waitFor(t, 5*time.Second, "the job dead-lettered", func() bool { return len(b.dead(t)) == 1 })

		if n := seen.len(); n != 3 {
			t.Fatalf("handler ran %d times, want MaxAttempts = 3", n)
		}
		for i := range 3 {
			j := seen.get(i)
			if j.Attempt != i || j.ID != job.ID {
				t.Errorf("run %d: Attempt %d, job %s; want Attempt %d, job %s", i, j.Attempt, j.ID, i, job.ID)
			}
			if want := map[bool]string{true: "", false: fmt.Sprintf("boom %d", i)}[i == 0]; j.LastError != want {
				t.Errorf("run %d: LastError %q, want %q", i, j.LastError, want)
			}
		}
		d := b.dead(t)[0]
		if field(d, "dead_reason") != consumer.ReasonExhausted || field(d, "dead_attempts") != "3" ||
			field(d, "dead_error") != "attempt 3 of 3: boom 3" || field(d, "job_id") != job.ID || field(d, "attempt") != "2" ||
			field(d, "last_error") != "boom 3" || field(d, "error_history") != `["boom 1","boom 2","boom 3"]` {
			t.Errorf("dead-letter entry = %v; want reason exhausted, dead_attempts 3, dead_error \"attempt 3 of 3: boom 3\", last_error \"boom 3\", the three errors in error_history, job_id %s, attempt 2",
				d.Values, job.ID)
		}
		if field(d, "dead_entry_id") == entryID {
			t.Errorf("dead_entry_id is the first entry; want the last attempt's entry")
		}
		if err := r.stop(t); err != nil { // settles everything: Stats are final
			t.Fatalf("Shutdown: %v", err)
		}
		if p := b.pending(t); len(p) != 0 {
			t.Errorf("pending: %v, want nothing", p)
		}
		if s := c.Stats(); s.Retried != 2 || s.DeadLettered != 1 || s.Acked != 0 {
			t.Errorf("Stats() = %+v; want Retried 2, DeadLettered 1", s)
		}
	})

	t.Run("JobMaxAttemptsOverridesConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		job := &stream.Job{Type: "t", Payload: []byte(`1`), MaxAttempts: 2}
		if _, err := b.prod.Enqueue(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		b.cfg.MaxAttempts = 10
		b.cfg.Backoff = consumer.Backoff{Base: time.Millisecond, Cap: time.Millisecond}
		var runs atomic.Int32
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.Add(1)
			return errors.New("no")
		}))
		start(t, c)
		waitFor(t, 5*time.Second, "the job dead-lettered", func() bool { return len(b.dead(t)) == 1 })
		if n := runs.Load(); n != 2 {
			t.Errorf("handler ran %d times, want the job's max_attempts 2", n)
		}
	})

	t.Run("SubMillisecondDelayRetriesAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.enqueue(t, "t", 1)
		b.cfg.Backoff = consumer.Backoff{Base: 300 * time.Microsecond, Cap: 300 * time.Microsecond, Jitter: consumer.JitterNone}
		var seen jobLog
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			if seen.add(j) == 1 {
				return errors.New("once")
			}
			return nil
		}))
		start(t, c)
		waitFor(t, 5*time.Second, "the second attempt acknowledged", func() bool { return c.Stats().Acked == 1 })
		if j := seen.get(1); j.Attempt != 1 || j.LastError != "once" {
			t.Errorf("second attempt has Attempt %d, LastError %q; want 1, \"once\"", j.Attempt, j.LastError)
		}
	})
}

func TestConsumer_Snooze(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, job := b.enqueue(t, "locked", 1)
	// One attempt only: a snooze that counted would dead-letter the job.
	b.cfg.MaxAttempts = 1
	var seen jobLog
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		if seen.add(j) <= 3 {
			return consumer.Snooze(time.Millisecond)
		}
		return nil
	}))
	r := start(t, c)
	waitFor(t, 5*time.Second, "the job done after three snoozes", func() bool { return c.Stats().Acked == 1 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n := seen.len(); n != 4 {
		t.Fatalf("handler ran %d times, want 4", n)
	}
	for i := range 4 {
		if j := seen.get(i); j.Attempt != 0 || j.ID != job.ID || j.LastError != "" {
			t.Errorf("run %d: Attempt %d, job %s, LastError %q; want Attempt 0, job %s, no error", i, j.Attempt, j.ID, j.LastError, job.ID)
		}
	}
	if d := b.dead(t); len(d) != 0 {
		t.Errorf("dead-letter stream has %v, want nothing", d)
	}
	if s := c.Stats(); s.Snoozed != 3 || s.Retried != 0 {
		t.Errorf("Stats() = %+v, want Snoozed 3, Retried 0", s)
	}
}

func TestConsumer_Dead(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name       string
		err        error
		wantReason string
		wantError  string
	}{
		{"GivenReason", consumer.Dead("bad_input", errors.New("no such customer")), "bad_input", "no such customer"},
		{"EmptyReasonIsPermanent", consumer.Dead("", errors.New("nope")), consumer.ReasonPermanent, "nope"},
		{"WrappedOutcome", fmt.Errorf("charge: %w", consumer.Dead("card_declined", errors.New("declined"))), "card_declined", "declined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			entryID, job := b.enqueue(t, "charge", map[string]int{"cents": 100})
			var runs atomic.Int32
			c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				runs.Add(1)
				return tc.err
			}))
			r := start(t, c)
			waitFor(t, 5*time.Second, "the job dead-lettered", func() bool { return len(b.dead(t)) == 1 })
			d := b.dead(t)[0]
			want := map[string]string{
				"type": "charge", "job_id": job.ID, "payload": `{"cents":100}`, "v": "1",
				"dead_reason": tc.wantReason, "dead_error": tc.wantError, "dead_attempts": "1",
				"dead_consumer": "c1", "dead_entry_id": entryID, "dead_stream": b.cfg.Stream,
			}
			for k, v := range want {
				if got := field(d, k); got != v {
					t.Errorf("dead-letter field %s = %q, want %q", k, got, v)
				}
			}
			if field(d, "dead_at") == "" {
				t.Errorf("dead-letter entry has no dead_at: %v", d.Values)
			}
			if err := r.stop(t); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			if p := b.pending(t); len(p) != 0 {
				t.Errorf("pending: %v, want nothing", p)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
			if s := c.Stats(); s.DeadLettered != 1 || s.Retried != 0 {
				t.Errorf("Stats() = %+v, want DeadLettered 1 and no retry", s)
			}
		})
	}

	t.Run("PayloadDecodeErrorIsPermanent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		id, err := b.rdb.Do(ctx, "XADD", b.cfg.Stream, "*", "type", "parse", "payload", "{not json").Text()
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.Add(1)
			var v map[string]any
			if err := j.Decode(&v); err != nil {
				return fmt.Errorf("parse job: %w", err)
			}
			return nil
		}))
		start(t, c)
		waitFor(t, 5*time.Second, "the job dead-lettered", func() bool { return len(b.dead(t)) == 1 })
		d := b.dead(t)[0]
		if field(d, "dead_reason") != consumer.ReasonPermanent || field(d, "dead_entry_id") != id ||
			!strings.Contains(field(d, "dead_error"), "parse job: stream: payload does not decode") {
			t.Errorf("dead-letter entry = %v; want reason permanent for entry %s with the decode error", d.Values, id)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("handler ran %d times, want 1 (no retry)", n)
		}
	})
}

func TestConsumer_Panic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One slot: if the panicking job kept its slot, nothing else would run.
	b.cfg.Concurrency = 1
	panicID, _ := b.enqueue(t, "explode", 0)
	for i := range 5 {
		b.enqueue(t, "ok", i)
	}
	var ok atomic.Int32
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		if j.Type == "explode" {
			panic("boom")
		}
		ok.Add(1)
		return nil
	}))
	start(t, c)
	waitFor(t, 5*time.Second, "the other jobs acknowledged", func() bool { return c.Stats().Acked == 5 })
	waitFor(t, 5*time.Second, "the panicking job dead-lettered", func() bool { return len(b.dead(t)) == 1 })
	d := b.dead(t)[0]
	e := field(d, "dead_error")
	if field(d, "dead_reason") != consumer.ReasonPanic || field(d, "dead_entry_id") != panicID {
		t.Errorf("dead-letter entry = %v; want reason panic for entry %s", d.Values, panicID)
	}
	if !strings.HasPrefix(e, "panic: boom\n") || !strings.Contains(e, "goroutine ") || !strings.Contains(e, "consumer_test.go") {
		t.Errorf("dead_error = %q; want the panic value and a stack through the handler", e)
	}
	if n := ok.Load(); n != 5 {
		t.Errorf("%d other jobs ran, want 5", n)
	}
}

func TestConsumer_Malformed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	raw := [][]any{
		{"payload", "{}", "job_id", "no-type"},
		{"type", "t", "attempt", "abc"},
		{"v", "2", "type", "t", "payload", "{}"},
		{"type", "t", "payload", strings.Repeat("x", 200)},
	}
	wantField := []string{`"type": is missing`, `"attempt": not a non-negative decimal integer`, `"v": unsupported format version`, "over the limit of 100"}
	ids := make([]string, len(raw))
	for i, f := range raw {
		id, err := b.rdb.Do(ctx, append([]any{"XADD", b.cfg.Stream, "*"}, f...)...).Text()
		if err != nil {
			t.Fatalf("XADD %v: %v", f, err)
		}
		ids[i] = id
	}
	b.cfg.MaxEntryBytes = 100
	var runs atomic.Int32
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		runs.Add(1)
		return nil
	}))
	start(t, c)
	waitFor(t, 5*time.Second, "every entry dead-lettered", func() bool { return len(b.dead(t)) == len(raw) })
	byEntry := map[string]redis.XMessage{}
	for _, d := range b.dead(t) {
		byEntry[field(d, "dead_entry_id")] = d
	}
	for i, id := range ids {
		d, ok := byEntry[id]
		if !ok {
			t.Errorf("entry %s (%v) was not dead-lettered", id, raw[i])
			continue
		}
		for j := 0; j < len(raw[i]); j += 2 {
			if k, v := raw[i][j].(string), raw[i][j+1].(string); field(d, k) != v {
				t.Errorf("entry %s: dead-letter field %s = %q, want the raw %q", id, k, field(d, k), v)
			}
		}
		// The oversize one (the last) is recorded cut short, with
		// dead_truncated: its values are under a KiB, so intact here.
		want := len(raw[i])/2 + 7
		if i == len(raw)-1 {
			want++
			if field(d, "dead_truncated") == "" {
				t.Errorf("entry %s: oversize, no dead_truncated: %v", id, d.Values)
			}
		}
		if len(d.Values) != want {
			t.Errorf("entry %s: dead-letter entry has fields %v; want the raw ones plus the dead_* fields", id, d.Values)
		}
		if field(d, "dead_reason") != consumer.ReasonMalformed || field(d, "dead_attempts") != "1" ||
			!strings.Contains(field(d, "dead_error"), wantField[i]) {
			t.Errorf("entry %s: reason %q, attempts %q, error %q; want malformed, 1, an error with %q", id,
				field(d, "dead_reason"), field(d, "dead_attempts"), field(d, "dead_error"), wantField[i])
		}
	}
	waitFor(t, 5*time.Second, "nothing pending", func() bool { return len(b.pending(t)) == 0 })
	if n := runs.Load(); n != 0 {
		t.Errorf("handler ran %d times on malformed entries, want 0", n)
	}
}

// crashKey returns the crash counter of job in the bundle's group.
func (b *bundle) crashKey(job *stream.Job) string {
	return b.keys.Crashes + b.cfg.Group + ":" + job.ID
}

// deliverTimes makes c1 the owner of entry id, delivered n times, as if
// it had been running there when c1's process stopped n-1 times.
func (b *bundle) deliverTimes(t *testing.T, id string, n int) {
	t.Helper()
	ctx := context.Background()
	if err := b.rdb.XGroupCreateMkStream(ctx, b.cfg.Stream, b.cfg.Group, "0").Err(); err != nil &&
		!strings.HasPrefix(err.Error(), "BUSYGROUP") {
		t.Fatal(err)
	}
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.cfg.Group, Consumer: "c1",
		Streams: []string{b.cfg.Stream, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	for range n - 1 {
		if err := b.rdb.XClaim(ctx, &redis.XClaimArgs{Stream: b.cfg.Stream, Group: b.cfg.Group,
			Consumer: "c1", Messages: []string{id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// A job delivered many times is not blamed for it: only its runs as a
// suspect count, and one that settles clears its count.
func TestConsumer_redeliveredJobRunsAsSuspect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, job := b.enqueue(t, "innocent", 1)
	b.deliverTimes(t, id, 11)
	b.cfg.Consumer = "c1"
	b.cfg.MaxCrashes = 2
	var runs atomic.Int32
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		runs.Add(1)
		return nil
	}))
	start(t, c)
	waitFor(t, 5*time.Second, "the job acknowledged and its crash counter cleared", func() bool {
		return len(b.pending(t)) == 0 && c.Stats().Acked == 1 && !b.m.Exists(b.crashKey(job))
	})
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if d := b.dead(t); len(d) != 0 {
		t.Errorf("dead letters: %v; want none", d)
	}
	if s := c.Stats(); s.Suspects != 1 || s.Acked != 1 {
		t.Errorf("stats = %+v; want 1 suspect, 1 acked", s)
	}
	if b.m.Exists(b.crashKey(job)) {
		t.Errorf("crash counter %s kept after the job settled", b.crashKey(job))
	}
}

// A suspect that was already running in MaxCrashes stops is dead-lettered
// with reason crashed, without running.
func TestConsumer_MaxCrashes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, job := b.enqueue(t, "crasher", 1)
	b.deliverTimes(t, id, 4)
	if err := b.rdb.Set(context.Background(), b.crashKey(job), 3, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	b.cfg.Consumer = "c1"
	b.cfg.MaxCrashes = 3
	var runs atomic.Int32
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		runs.Add(1)
		return nil
	}))
	start(t, c)
	waitFor(t, 5*time.Second, "the entry dead-lettered", func() bool { return len(b.dead(t)) == 1 })
	d := b.dead(t)[0]
	if field(d, "dead_reason") != consumer.ReasonCrashed || field(d, "dead_entry_id") != id ||
		!strings.Contains(field(d, "dead_error"), "worker stopped") || !strings.Contains(field(d, "dead_error"), "3 times") {
		t.Errorf("dead-letter entry = %v; want reason crashed for %s, an error saying it stopped its worker 3 times", d.Values, id)
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
}

// Suspects with a counted run run alone: while one runs, no other job runs
// on the consumer.
func TestConsumer_suspectsRunAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var suspects []string
	var suspectJobs []*stream.Job
	for i := range 3 {
		id, job := b.enqueue(t, "suspect", i)
		suspects = append(suspects, id)
		suspectJobs = append(suspectJobs, job)
	}
	for i, id := range suspects {
		b.deliverTimes(t, id, 2)
		// A counted run already: the next one is alone.
		if err := b.rdb.Set(context.Background(), b.crashKey(suspectJobs[i]), 1, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		b.enqueue(t, "fresh", i)
	}
	b.cfg.Consumer = "c1"
	b.cfg.Concurrency = 8
	var running, done atomic.Int32
	var overlap atomic.Bool
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		n := running.Add(1)
		defer running.Add(-1)
		if j.Deliveries > 1 && n != 1 {
			overlap.Store(true)
		}
		time.Sleep(20 * time.Millisecond)
		if j.Deliveries > 1 && running.Load() != 1 {
			overlap.Store(true)
		}
		done.Add(1)
		return nil
	}))
	start(t, c)
	waitFor(t, 10*time.Second, "all 23 jobs done", func() bool { return done.Load() == 23 && len(b.pending(t)) == 0 && c.Stats().Suspects == 3 })
	if overlap.Load() {
		t.Error("a suspect ran beside another job")
	}
	if s := c.Stats(); s.Suspects != 3 {
		t.Errorf("stats = %+v; want 3 suspects", s)
	}
}

// A suspect's first counted run may be shared: the jobs of a restarted
// worker run again at once, side by side.
func TestConsumer_firstSuspectRunShared(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 5
	for i := range n {
		id, _ := b.enqueue(t, "suspect", i)
		b.deliverTimes(t, id, 2)
	}
	b.cfg.Consumer = "c1"
	b.cfg.Concurrency = n
	var running atomic.Int32
	all := make(chan struct{})
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		if running.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
			return nil
		case <-time.After(10 * time.Second):
			return consumer.Permanent(errors.New("the suspects did not run side by side"))
		}
	}))
	start(t, c)
	waitFor(t, 15*time.Second, "all suspects settled", func() bool { return len(b.pending(t)) == 0 && c.Stats().Acked == n })
	if d := b.dead(t); len(d) != 0 {
		t.Errorf("dead letters: %v", d)
	}
	if s := c.Stats(); s.Suspects != n || s.Acked != n {
		t.Errorf("stats = %+v; want %d suspects acknowledged", s, n)
	}
}

func TestConsumer_Concurrency(t *testing.T) {
	t.Parallel()
	// With every slot busy, no fourth job starts, and the consumer holds
	// (pending, read but not started) no more than Prefetch entries beyond
	// those it runs.
	for _, tc := range []struct {
		name     string
		prefetch int
		held     int64
	}{{"Prefetch", 4, 3 + 4}, {"NoPrefetch", -1, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const jobs = 12
			for i := range jobs {
				b.enqueue(t, "t", i)
			}
			b.cfg.Concurrency = 3
			b.cfg.Prefetch = tc.prefetch
			var running, most atomic.Int32
			started := make(chan struct{}, jobs)
			release := make(chan struct{})
			releaseAll := sync.OnceFunc(func() { close(release) })
			c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				n := running.Add(1)
				defer running.Add(-1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				started <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}))
			start(t, c)
			t.Cleanup(releaseAll)
			for range 3 {
				recv(t, started, 5*time.Second, "three jobs to start")
			}
			waitFor(t, 5*time.Second, "the prefetch to fill", func() bool {
				p, err := b.rdb.XPending(context.Background(), b.cfg.Stream, b.cfg.Group).Result()
				return err == nil && p.Count >= tc.held
			})
			for end := time.Now().Add(150 * time.Millisecond); time.Now().Before(end); {
				p, err := b.rdb.XPending(context.Background(), b.cfg.Stream, b.cfg.Group).Result()
				if err != nil {
					t.Fatal(err)
				}
				if p.Count != tc.held || p.Consumers["c1"] != tc.held {
					t.Fatalf("XPENDING with three blocked handlers: %d pending, c1 has %d; want %d and %d", p.Count, p.Consumers["c1"], tc.held, tc.held)
				}
				select {
				case <-started:
					t.Fatalf("a fourth job started while three were running")
				case <-time.After(10 * time.Millisecond):
				}
			}
			releaseAll()
			waitFor(t, 5*time.Second, "every job acknowledged", func() bool { return c.Stats().Acked == jobs })
			if m := most.Load(); m != 3 {
				t.Errorf("at most %d handlers ran at once, want 3", m)
			}
		})
	}
}

func TestConsumer_MaxRuntime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "slow", 1)
	b.cfg.MaxRuntime = 50 * time.Millisecond
	type result struct {
		cause       error
		left        time.Duration // from the handler's start to its deadline
		hasDeadline bool
	}
	got := make(chan result, 1)
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		t0 := time.Now()
		dl, ok := ctx.Deadline()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
		got <- result{context.Cause(ctx), dl.Sub(t0), ok}
		return consumer.Dead("too_slow", ctx.Err())
	}))
	start(t, c)
	r := recv(t, got, 10*time.Second, "the handler to return")
	// The deadline is set before the handler starts, so at most MaxRuntime
	// is left when it does, however slowly the machine runs.
	if !r.hasDeadline || !errors.Is(r.cause, context.DeadlineExceeded) || r.left > b.cfg.MaxRuntime {
		t.Errorf("handler ctx: deadline %v (%v left at the start), cause %v; want a deadline at most %v away, DeadlineExceeded",
			r.hasDeadline, r.left, r.cause, b.cfg.MaxRuntime)
	}
	waitFor(t, 5*time.Second, "the job dead-lettered", func() bool { return len(b.dead(t)) == 1 })
	if d := b.dead(t)[0]; field(d, "dead_error") != context.DeadlineExceeded.Error() {
		t.Errorf("dead_error = %q, want %q", field(d, "dead_error"), context.DeadlineExceeded.Error())
	}
}

// settleDelay is a go-redis hook that slows the dead-letter script down and
// reports when it starts, standing in for a slow Redis.
type settleDelay struct {
	dead    string // dead-letter stream: the dead script's second key
	delay   time.Duration
	started chan struct{}
	once    sync.Once
}

func (h *settleDelay) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *settleDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(a) > 4 && fmt.Sprint(a[2]) == "2" && a[4] == h.dead {
			h.once.Do(func() { close(h.started) })
			time.Sleep(h.delay)
		}
		return next(ctx, cmd)
	}
}

func (h *settleDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestConsumer_Shutdown(t *testing.T) {
	t.Parallel()

	t.Run("DrainsInFlightJobs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cfg.Concurrency = 3
		okID, _ := b.enqueue(t, "ok", 1)
		awareID, awareJob := b.enqueue(t, "aware", 2)
		stubbornID, stubbornJob := b.enqueue(t, "stubborn", 3)
		started := make(chan string, 3)
		finishOK := make(chan struct{})
		unblock := make(chan struct{})
		causes := make(chan error, 1)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			started <- j.Type
			switch j.Type {
			case "ok":
				<-finishOK
				return nil
			case "aware":
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return ctx.Err()
			default: // ignores its context
				<-unblock
				return nil
			}
		}))
		r := start(t, c)
		t.Cleanup(func() { close(unblock) }) // runs before start's cleanup
		for range 3 {
			recv(t, started, 5*time.Second, "three jobs to start")
		}

		const deadline = 200 * time.Millisecond
		watch := stallWatch(t, b.rdb)
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		t0 := time.Now()
		errc := make(chan error, 1)
		go func() { errc <- c.Shutdown(ctx) }()
		close(finishOK)
		err := recv(t, errc, 10*time.Second, "Shutdown to return")
		elapsed, stalled, over := tookOver(watch, t0, deadline+1200*time.Millisecond)

		if err == nil {
			t.Fatalf("Shutdown = nil; want an error naming the abandoned job")
		}
		for _, want := range []string{stubbornID, stubbornJob.ID, "stubborn"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Shutdown error %q does not name %q", err, want)
			}
		}
		for _, not := range []string{okID, awareID, awareJob.ID} {
			if strings.Contains(err.Error(), not) {
				t.Errorf("Shutdown error %q names %q, which did not ignore cancellation", err, not)
			}
		}
		if elapsed < deadline || over {
			t.Errorf("Shutdown took %v (%v of it stalled); want between the deadline %v and about a second more, stalls aside",
				elapsed, stalled, deadline)
		}
		select {
		case <-r.done:
			if r.err == nil || r.err.Error() != err.Error() {
				t.Errorf("Run = %v; want Shutdown's error %v", r.err, err)
			}
		case <-time.After(time.Second):
			t.Fatalf("Run has not returned after Shutdown did")
		}
		if cause := recv(t, causes, time.Second, "the aware handler's cause"); !errors.Is(cause, consumer.ErrShutdown) {
			t.Errorf("context.Cause in the handler = %v, want ErrShutdown", cause)
		}

		if s := c.Stats(); s.Acked != 1 || s.Retried != 0 || s.DeadLettered != 0 {
			t.Errorf("Stats() = %+v; want only the finished job acknowledged", s)
		}
		pend := map[string]redis.XPendingExt{}
		for _, p := range b.pending(t) {
			pend[p.ID] = p
		}
		if _, ok := pend[okID]; ok {
			t.Errorf("the finished job %s is still pending", okID)
		}
		if p, ok := pend[awareID]; !ok || p.Consumer != "c1" {
			t.Errorf("the cancelled job %s: pending %v (%+v); want it pending for c1", awareID, ok, p)
		} else if p.Idle < consumer.DefaultVisibilityTimeout {
			t.Errorf("the cancelled job %s is idle %v; want it given back (idle >= the visibility timeout)", awareID, p.Idle)
		}
		if p, ok := pend[stubbornID]; !ok || p.Consumer != "c1" {
			t.Errorf("the abandoned job %s: pending %v (%+v); want it pending for c1", stubbornID, ok, p)
		}
		if d := b.dead(t); len(d) != 0 || b.delayed(t) != 0 {
			t.Errorf("shutdown dead-lettered %v or delayed jobs; want nothing settled but the finished job", d)
		}
	})

	t.Run("CancelledRunContextDrains", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id, _ := b.enqueue(t, "aware", 1)
		b.cfg.ShutdownTimeout = 50 * time.Millisecond
		started := make(chan struct{}, 1)
		causes := make(chan error, 1)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			started <- struct{}{}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		recv(t, started, 5*time.Second, "the job to start")
		cancel()
		if err := recv(t, done, 5*time.Second, "Run to return"); err != nil {
			t.Errorf("Run = %v; want nil, the handler honoured its cancellation", err)
		}
		if cause := recv(t, causes, time.Second, "the handler's cause"); !errors.Is(cause, consumer.ErrShutdown) {
			t.Errorf("context.Cause in the handler = %v, want ErrShutdown", cause)
		}
		if p := b.pending(t); len(p) != 1 || p[0].ID != id {
			t.Errorf("pending = %v; want the cancelled job %s", p, id)
		}
	})

	t.Run("IdleConsumerReturnsNil", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
		r := start(t, c)
		waitFor(t, 5*time.Second, "the group", func() bool {
			g, err := b.rdb.XInfoGroups(context.Background(), b.cfg.Stream).Result()
			return err == nil && len(g) == 1
		})
		watch := stallWatch(t, b.rdb)
		t0 := time.Now()
		if err := r.stop(t); err != nil || r.err != nil {
			t.Errorf("Shutdown = %v, Run = %v; want nil, nil", err, r.err)
		}
		if d, stalled, over := tookOver(watch, t0, time.Second); over {
			t.Errorf("Shutdown of an idle consumer took %v (%v of it stalled)", d, stalled)
		}
	})

	t.Run("BeforeRunStopsRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
		// go c.Run(ctx) followed at once by Shutdown: the request must not be
		// lost when it arrives before Run has started.
		if err := c.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown before Run = %v, want nil", err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Run(context.Background()) }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		case <-time.After(3 * time.Second):
			_ = c.Shutdown(context.Background()) // let the goroutine end
			<-done
			t.Errorf("Run after Shutdown kept running; the shutdown request was lost")
		}
	})

	t.Run("WaitsForSettlement", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hook := &settleDelay{dead: b.keys.Dead, delay: 300 * time.Millisecond, started: make(chan struct{})}
		b.rdb.AddHook(hook)
		b.enqueue(t, "doomed", 1)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
			return consumer.Dead("nope", nil)
		}))
		r := start(t, c)
		recv(t, hook.started, 5*time.Second, "the dead-letter script")
		if err := r.stop(t); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		// Run has returned: the job it had finished must be settled, not
		// left half-done for a client the application is about to close.
		if d := b.dead(t); len(d) != 1 {
			t.Errorf("dead-letter stream has %d entries after Run returned, want 1", len(d))
		}
		if p := b.pending(t); len(p) != 0 {
			t.Errorf("pending after Run returned: %v, want nothing", p)
		}
	})

	t.Run("WaitsForDeadLetterOfMalformedEntry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hook := &settleDelay{dead: b.keys.Dead, delay: 300 * time.Millisecond, started: make(chan struct{})}
		b.rdb.AddHook(hook)
		if err := b.rdb.Do(context.Background(), "XADD", b.cfg.Stream, "*", "no", "type").Err(); err != nil {
			t.Fatal(err)
		}
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
		r := start(t, c)
		recv(t, hook.started, 5*time.Second, "the dead-letter script")
		if err := r.stop(t); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if d := b.dead(t); len(d) != 1 {
			t.Errorf("dead-letter stream has %d entries after Run returned, want 1", len(d))
		}
	})
}

func TestConsumer_RecoverGroup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose func(b *bundle) error
	}{
		{"GroupDestroyed", func(b *bundle) error {
			return b.rdb.XGroupDestroy(context.Background(), b.cfg.Stream, b.cfg.Group).Err()
		}},
		{"StreamDeleted", func(b *bundle) error { return b.rdb.Del(context.Background(), b.cfg.Stream).Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.enqueue(t, "t", 1)
			var seen jobLog
			c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				seen.add(j)
				return nil
			}))
			start(t, c)
			waitFor(t, 5*time.Second, "the first job acknowledged", func() bool { return c.Stats().Acked == 1 })
			// Redis lost the group (a restart without persistence, a
			// FLUSHALL): the consumer recreates it and goes on.
			if err := tc.lose(b); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "a read error", func() bool { return c.Stats().ReadErrors > 0 })
			_, job := b.enqueue(t, "t", 2)
			waitFor(t, 5*time.Second, "the job added after the loss", func() bool {
				for i := range seen.len() {
					if seen.get(i).ID == job.ID {
						return true
					}
				}
				return false
			})
			g, err := b.rdb.XInfoGroups(context.Background(), b.cfg.Stream).Result()
			if err != nil || len(g) != 1 || g[0].Name != b.cfg.Group {
				t.Errorf("groups after recovery: %v, %v; want %s", g, err, b.cfg.Group)
			}
		})
	}
}

func TestConsumer_Reap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	busyID, _ := b.enqueue(t, "t", 1)
	if err := b.rdb.XGroupCreateMkStream(ctx, b.cfg.Stream, b.cfg.Group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	// busy holds the one entry; idle holds nothing.
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.cfg.Group, Consumer: "busy",
		Streams: []string{b.cfg.Stream, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	// miniredis reports the idle time of consumers as -1 (never seen) unless
	// they ran an XCLAIM: busy claims its own entry, idle claims nothing.
	for _, name := range []string{"busy", "idle"} {
		if err := b.rdb.XClaim(ctx, &redis.XClaimArgs{Stream: b.cfg.Stream, Group: b.cfg.Group, Consumer: name,
			Messages: []string{map[string]string{"busy": busyID, "idle": "0-1"}[name]}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b.cfg.IdleConsumerTimeout = time.Millisecond // the reaper still runs at most once a second
	c := consumer.New(b.rdb, b.cfg).Handle(noop)
	start(t, c)
	names := func() map[string]bool {
		cs, err := b.rdb.XInfoConsumers(ctx, b.cfg.Stream, b.cfg.Group).Result()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, c := range cs {
			m[c.Name] = true
		}
		return m
	}
	if n := names(); !n["busy"] || !n["idle"] {
		t.Fatalf("consumers before reaping: %v; want busy and idle", n)
	}
	waitFor(t, 5*time.Second, "the idle consumer removed", func() bool { return !names()["idle"] })
	if n := names(); !n["busy"] {
		t.Errorf("consumers after reaping: %v; want busy kept: it has a pending entry", n)
	}
}

func TestConsumer_LongErrorIsTruncated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "t", 1)
	b.cfg.Backoff = atOnce
	long := strings.Repeat("e", 10000)
	var seen jobLog
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		if seen.add(j) == 1 {
			return errors.New(long)
		}
		return nil
	}))
	start(t, c)
	waitFor(t, 5*time.Second, "the second attempt", func() bool { return seen.len() == 2 })
	if got := seen.get(1).LastError; got != long[:4096]+"...(truncated)" {
		t.Errorf("LastError has %d bytes (%.20q...); want the first 4096 bytes and a truncation mark", len(got), got)
	}
}

// With the default Prefetch the consumer reads fast jobs in large batches,
// but once its jobs stop finishing (here: every handler blocks) it holds no
// more than Concurrency plus Prefetch entries, leaving the rest to other
// consumers of the group, even right after a burst of fast jobs.
func TestConsumer_defaultPrefetchAfterFastJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cfg.Concurrency = 3
	const fast, slow = 300, 40
	release := make(chan struct{})
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll)
	started := make(chan struct{}, slow)
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		if j.Type != "slow" {
			return nil
		}
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}))
	start(t, c)
	for i := range fast {
		b.enqueue(t, "fast", i)
	}
	waitFor(t, 10*time.Second, "the fast jobs acknowledged", func() bool { return c.Stats().Acked == fast })
	// A read after the last fast job finished, so that no fast job
	// finishes between the reads of the slow ones (on a loaded machine the
	// last fast jobs' ends let the room grow by twice their number, as
	// documented, which is not what this test is about).
	idle, cancelIdle := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelIdle()
	if err := c.WaitIdle(idle); err != nil {
		t.Fatal(err)
	}
	for i := range slow {
		b.enqueue(t, "slow", i)
	}
	for range 3 {
		recv(t, started, 5*time.Second, "three slow jobs to start")
	}
	const held = 3 + 3 // Concurrency plus the default Prefetch
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		p, err := b.rdb.XPending(context.Background(), b.cfg.Stream, b.cfg.Group).Result()
		if err != nil {
			t.Fatal(err)
		}
		if p.Count > held {
			t.Fatalf("with three blocked handlers after %d fast jobs, %d entries pending; want at most %d", fast, p.Count, held)
		}
	}
	releaseAll()
	waitFor(t, 10*time.Second, "every job acknowledged", func() bool { return c.Stats().Acked == fast+slow })
}
