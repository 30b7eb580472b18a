package pelicantest_test

// Attack 35 (pelicantest.Run): an outside tester's tests, written from
// README.md ("Testing handlers: package pelicantest") and the pelicantest
// godoc only. Promise attacked: Run's consumer reads with a Block of RunBlock
// (20 ms) unless WithConfig sets another, so that a Run of a job whose handler
// returns at once takes milliseconds instead of a second, and yet every
// outcome (Done, Retried, Snoozed, Dead) is still read back correctly, on the
// embedded Redis and on a real one; only the one delivery runs. Time bounds
// here are generous (a fraction of the old one second per Run), never tight.

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/pelicantest"
	"github.com/pelicanqueue/pelican/stream"
)

func a35Job(t *testing.T, typ string) *stream.Job {
	t.Helper()
	j, err := stream.NewJSONJob(typ, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// a35Calls counts handler calls by job type.
type a35Calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *a35Calls) add(typ string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[typ]++
}

func (c *a35Calls) get(typ string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[typ]
}

// a35Outcomes runs one job per outcome through Run and checks what Run read
// back, on the Redis that PELICAN_TEST_REDIS names (a11Backends sets it).
func a35Outcomes(t *testing.T) {
	embedded := os.Getenv(pelicantest.EnvRedis) == ""
	errBoom := errors.New("boom-a35")
	cases := []struct {
		name  string
		cfg   *consumer.Config
		ret   func() error
		check func(t *testing.T, r *pelicantest.Redis, res pelicantest.Result)
	}{
		{"done", nil, func() error { return nil }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Done || res.Err != nil || res.Next != nil {
				t.Errorf("got %s, %v, next %v; want done", res.Outcome, res.Err, res.Next)
			}
		}},
		{"slowerThanBlock", nil, func() error { time.Sleep(150 * time.Millisecond); return nil }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Done {
				t.Errorf("got %s, %v; want done", res.Outcome, res.Err)
			}
		}},
		{"retryMinute", nil, func() error { return consumer.Retry(time.Minute, errBoom) }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Retried || res.Delay != time.Minute || res.Next == nil || res.Next.Attempt != 1 ||
				!strings.Contains(res.Next.LastError, "boom-a35") || res.Due.IsZero() || !errors.Is(res.Err, errBoom) {
				t.Errorf("got %s delay %v due %v next %+v err %v; want retried after 1m, attempt 1", res.Outcome, res.Delay, res.Due, res.Next, res.Err)
			}
		}},
		{"retryNoDelay", nil, func() error { return consumer.Retry(0, errBoom) }, func(t *testing.T, r *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Retried || res.Next == nil || res.Next.Attempt != 1 || !res.Due.IsZero() || len(res.Enqueued) != 0 {
				t.Errorf("got %s delay %v due %v next %+v enqueued %d; want retried at once, attempt 1, nothing enqueued", res.Outcome, res.Delay, res.Due, res.Next, len(res.Enqueued))
			}
			// The retry stays in the stream (read but held until shutdown).
			j := pelicantest.RequireEnqueued(t, r.Client, r.Name("jobs"), pelicantest.Type("a35.retryNoDelay"))
			if j.Attempt != 1 {
				t.Errorf("retry in the stream has attempt %d, want 1", j.Attempt)
			}
		}},
		{"plainError", nil, func() error { return errBoom }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			// Default backoff: 1 s with equal jitter, so 0.5 s to 1 s (the
			// bound leaves room for a slow settlement).
			if res.Outcome != pelicantest.Retried || res.Delay <= 0 || res.Delay > 5*time.Second || res.Next == nil || res.Next.Attempt != 1 {
				t.Errorf("got %s delay %v next %+v; want retried after the default backoff", res.Outcome, res.Delay, res.Next)
			}
		}},
		{"snooze", nil, func() error { return consumer.Snooze(2 * time.Minute) }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Snoozed || res.Delay != 2*time.Minute || res.Next == nil || res.Next.Attempt != 0 {
				t.Errorf("got %s delay %v next %+v; want snoozed 2m, attempt 0", res.Outcome, res.Delay, res.Next)
			}
		}},
		{"snoozeNoDelay", nil, func() error { return consumer.Snooze(0) }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Snoozed || res.Next == nil || res.Next.Attempt != 0 || !res.Due.IsZero() {
				t.Errorf("got %s delay %v due %v next %+v; want snoozed at once, attempt 0", res.Outcome, res.Delay, res.Due, res.Next)
			}
		}},
		{"dead", nil, func() error { return consumer.Dead("bad_input", errBoom) }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Dead || res.Reason != "bad_input" || !strings.Contains(res.DeadError, "boom-a35") || res.Next != nil {
				t.Errorf("got %s reason %q error %q next %v; want dead bad_input", res.Outcome, res.Reason, res.DeadError, res.Next)
			}
		}},
		{"permanent", nil, func() error { return consumer.Permanent(errBoom) }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Dead || res.Reason != consumer.ReasonPermanent {
				t.Errorf("got %s reason %q; want dead permanent", res.Outcome, res.Reason)
			}
		}},
		{"exhausted", &consumer.Config{MaxAttempts: 1}, func() error { return errBoom }, func(t *testing.T, _ *pelicantest.Redis, res pelicantest.Result) {
			if res.Outcome != pelicantest.Dead || res.Reason != consumer.ReasonExhausted {
				t.Errorf("got %s reason %q; want dead exhausted", res.Outcome, res.Reason)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := pelicantest.NewRedis(t)
			if embedded != r.Embedded() {
				t.Fatalf("NewRedis at %s, embedded %v; want embedded %v", r.Where, r.Embedded(), embedded)
			}
			var calls a35Calls
			typ := "a35." + tc.name
			h := consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
				calls.add(j.Type)
				return tc.ret()
			})
			opts := []pelicantest.Option{pelicantest.WithRedis(r)}
			if tc.cfg != nil {
				opts = append(opts, pelicantest.WithConfig(*tc.cfg))
			}
			start := time.Now()
			res := pelicantest.Run(t, h, a35Job(t, typ), opts...)
			t.Logf("Run on %s: %s in %v", r.Where, res.Outcome, time.Since(start))
			if n := calls.get(typ); n != 1 {
				t.Errorf("handler ran %d times, want once", n)
			}
			if res.Job == nil || res.Job.Type != typ {
				t.Errorf("Result.Job = %+v, want the job of type %s", res.Job, typ)
			}
			tc.check(t, r, res)
		})
	}
}

// Promise: with RunBlock's 20 ms Block, every outcome is still read back
// correctly, on the embedded Redis and on a real one.
func TestAttack35_Outcomes(t *testing.T) { a11Backends(t, a35Outcomes) }

// a35EnqueueChildren is a handler that enqueues n jobs of type a35.child on
// its own stream; children that run are counted in calls.
func a35EnqueueChildren(r *pelicantest.Redis, calls *a35Calls, n int) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		calls.add(j.Type)
		if j.Type != "a35.parent" {
			return nil
		}
		p := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: j.Stream})
		for i := 0; i < n; i++ {
			c, err := stream.NewJSONJob("a35.child", map[string]int{"i": i})
			if err != nil {
				return err
			}
			if _, err := p.Enqueue(ctx, c); err != nil {
				return err
			}
		}
		return nil
	})
}

// a35SameStream checks that a job the handler enqueues on the same stream is
// reported in Enqueued, stays in the stream and never runs ("Only that one
// delivery runs"), also with Concurrency 4 and a Block set by WithConfig.
func a35SameStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  *consumer.Config
	}{
		{"default", nil},
		{"concurrency4", &consumer.Config{Concurrency: 4}},
		{"block200ms", &consumer.Config{Block: 200 * time.Millisecond, Concurrency: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pelicantest.NewRedis(t)
			var calls a35Calls
			h := a35EnqueueChildren(r, &calls, 3)
			opts := []pelicantest.Option{pelicantest.WithRedis(r)}
			if tc.cfg != nil {
				opts = append(opts, pelicantest.WithConfig(*tc.cfg))
			}
			res := pelicantest.Run(t, h, a35Job(t, "a35.parent"), opts...)
			if res.Outcome != pelicantest.Done {
				t.Fatalf("outcome %s (%v), want done", res.Outcome, res.Err)
			}
			if len(res.Enqueued) != 3 {
				t.Fatalf("Result.Enqueued has %d jobs, want the 3 children", len(res.Enqueued))
			}
			for _, j := range res.Enqueued {
				if j.Type != "a35.child" || j.Stream != r.Name("jobs") {
					t.Errorf("enqueued %s on %q, want a35.child on %q", j.Type, j.Stream, r.Name("jobs"))
				}
			}
			if n := calls.get("a35.child"); n != 0 {
				t.Errorf("%d children ran, want none (only the one delivery runs)", n)
			}
			if n := calls.get("a35.parent"); n != 1 {
				t.Errorf("parent ran %d times, want once", n)
			}
			jobs, err := pelicantest.Jobs(context.Background(), r.Client, r.Name("jobs"))
			if err != nil {
				t.Fatal(err)
			}
			children := 0
			for _, j := range jobs {
				if j.Type == "a35.child" {
					children++
				}
			}
			if children != 3 {
				t.Errorf("%d children left in the stream, want 3: %v", children, jobs)
			}
		})
	}
}

// Promise: a handler that enqueues on its own stream gets its jobs reported
// and held (short Block and WithConfig's Block), on both Redis kinds.
func TestAttack35_HandlerEnqueuesSameStream(t *testing.T) { a11Backends(t, a35SameStream) }

// Promise: WithConfig with an explicit Block is honoured and the outcome is
// read back; WithConfig without a Block keeps RunBlock (not the consumer's
// 1 s default), so 20 such Runs take well under 20 s.
func TestAttack35_WithConfigBlock(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	for _, block := range []time.Duration{5 * time.Millisecond, 100 * time.Millisecond, 700 * time.Millisecond} {
		start := time.Now()
		res := pelicantest.Run(t, h, a35Job(t, "a35.block"), pelicantest.WithConfig(consumer.Config{Block: block}))
		if res.Outcome != pelicantest.Done {
			t.Errorf("Block %v: outcome %s (%v), want done", block, res.Outcome, res.Err)
		}
		t.Logf("Run with WithConfig Block %v took %v", block, time.Since(start))
	}
	r := pelicantest.NewRedis(t)
	start := time.Now()
	for i := 0; i < 20; i++ {
		res := pelicantest.Run(t, h, a35Job(t, "a35.cfg"), pelicantest.WithRedis(r),
			pelicantest.WithConfig(consumer.Config{MaxAttempts: 3, Group: "other"}))
		if res.Outcome != pelicantest.Done {
			t.Fatalf("run %d: outcome %s (%v), want done", i, res.Outcome, res.Err)
		}
	}
	took := time.Since(start)
	t.Logf("20 Runs with WithConfig and no Block: %v (%v each)", took, took/20)
	if took > 10*time.Second {
		t.Errorf("20 Runs with WithConfig (no Block) took %v: the 1 s consumer default Block instead of RunBlock?", took)
	}
}

// a35Many runs 50 Runs in a row on one Redis and fails only when they take
// more than half of the old one-second-per-Run behaviour.
func a35Many(t *testing.T) {
	r := pelicantest.NewRedis(t)
	var calls a35Calls
	h := consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error { calls.add(j.Type); return nil })
	const n = 50
	start := time.Now()
	for i := 0; i < n; i++ {
		res := pelicantest.Run(t, h, a35Job(t, "a35.many"), pelicantest.WithRedis(r))
		if res.Outcome != pelicantest.Done {
			t.Fatalf("run %d: outcome %s (%v), want done", i, res.Outcome, res.Err)
		}
	}
	took := time.Since(start)
	t.Logf("%d Runs on %s: %v (%v each)", n, r.Where, took, took/n)
	if calls.get("a35.many") != n {
		t.Errorf("handler ran %d times, want %d", calls.get("a35.many"), n)
	}
	if took > 25*time.Second {
		t.Errorf("%d Runs took %v, want well under %v (one second each)", n, took, n*time.Second)
	}
}

// Promise: 50 Runs in a row take far less than the old one second each
// (README: about 25 ms each embedded, 7 ms on a real Redis).
func TestAttack35_ManyRuns(t *testing.T) { a11Backends(t, a35Many) }
