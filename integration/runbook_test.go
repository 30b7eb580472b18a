package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

// The README's runbook (fix, then replay) through the recommended chain:
// tracing, Lock, Idempotency on Redis, Retry, DeadLetter. A job that fails
// transiently until its attempts are exhausted is dead-lettered with reason
// exhausted; after the fix, its replay runs it again and it completes, and
// its reason never turns into permanent. A job that failed permanently keeps
// its failed record: replayed, it dies again without running, until its
// record is forgotten. Once with package dlq, once with the pelican command.

// runbookQueue is a consumer with the full chain on a stream of its own.
type runbookQueue struct {
	s      *scenario
	prefix string // idempotency records' key prefix: the queue's namespace
	store  *idem.RedisStore
	exp    *tracetest.InMemoryExporter
	fixed  atomic.Bool // the handler's fix is deployed

	mu   sync.Mutex
	runs map[string]int // handler runs by job ID
}

const (
	runbookAttempts  = 3
	runbookTransient = "transient" // payload: fails with a transient error until fixed
	runbookPermanent = "permanent" // payload: fails permanently until fixed
)

func startRunbookQueue(t *testing.T) *runbookQueue {
	t.Helper()
	s := newScenario(t, nil, "")
	q := &runbookQueue{s: s, prefix: s.keys.Idem, exp: tracetest.NewInMemoryExporter(),
		runs: map[string]int{}}
	q.store = idem.NewRedisStore(s.rdb, idem.RedisConfig{Retention: time.Hour})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(q.exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tcfg := tracing.Config{TracerProvider: tp}

	handler := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		q.mu.Lock()
		q.runs[job.ID]++
		q.mu.Unlock()
		var mode string
		if err := job.Decode(&mode); err != nil {
			return err
		}
		switch {
		case q.fixed.Load():
			return nil
		case mode == runbookPermanent:
			return consumer.Permanent(errors.New("no such mailbox"))
		default:
			return errors.New("smtp: connection refused")
		}
	})
	c := consumer.New(s.rdb, consumer.Config{
		Stream: s.stream, Group: "g", Consumer: "c1", Block: 50 * time.Millisecond,
		PromoteInterval: 20 * time.Millisecond, MaxAttempts: runbookAttempts,
		Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond, Jitter: consumer.JitterNone},
		Logger:  slog.New(slog.DiscardHandler),
	}).Use(
		tracing.Middleware(tcfg),
		middleware.Lock(s.rdb, middleware.LockConfig{TTL: 10 * time.Second}),
		middleware.Idempotency(q.store, middleware.IdempotencyConfig{Lease: time.Minute}),
		middleware.Retry(middleware.RetryConfig{}),
		middleware.DeadLetter(middleware.DeadLetterConfig{MaxAge: time.Hour}),
	).Handle(handler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return q
}

// enqueue adds a job with payload mode, its own idempotency and lock keys,
// and returns it.
func (q *runbookQueue) enqueue(t *testing.T, mode string) *stream.Job {
	t.Helper()
	job, err := stream.NewJSONJob("email.send", mode)
	if err != nil {
		t.Fatal(err)
	}
	job.IdempotencyKey = "op-" + mode
	job.LockKey = "customer-" + mode
	if _, err := stream.NewProducer(q.s.rdb, stream.ProducerConfig{Stream: q.s.stream}).Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	return job
}

// state returns a job's handler runs and its dead-letter reasons so far, as
// the outermost middleware (tracing) recorded them for its deliveries.
func (q *runbookQueue) state(job *stream.Job) (runs int, dead []string) {
	q.mu.Lock()
	runs = q.runs[job.ID]
	q.mu.Unlock()
	for _, sp := range q.exp.GetSpans() {
		var id, reason string
		for _, a := range sp.Attributes {
			switch a.Key {
			case tracing.AttrJobID:
				id = a.Value.AsString()
			case tracing.AttrDeadReason:
				reason = a.Value.AsString()
			}
		}
		if id == job.ID && reason != "" {
			dead = append(dead, reason)
		}
	}
	return runs, dead
}

// record returns the status of job's idempotency record (StatusStarted:
// none).
func (q *runbookQueue) record(t *testing.T, job *stream.Job) idem.Status {
	t.Helper()
	ctx := context.Background()
	o, err := q.store.Begin(ctx, q.prefix+job.IdempotencyKey, "probe", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if o.Status == idem.StatusStarted {
		if err := q.store.Release(ctx, q.prefix+job.IdempotencyKey, "probe"); err != nil {
			t.Fatal(err)
		}
	}
	return o.Status
}

// settled reports whether the queue has nothing left to do: no pending,
// unread or delayed job.
func (q *runbookQueue) settled(t *testing.T) (bool, string) {
	t.Helper()
	ctx := context.Background()
	groups, err := q.s.rdb.XInfoGroups(ctx, q.s.stream).Result()
	if err != nil || len(groups) != 1 {
		return false, fmt.Sprintf("XINFO GROUPS: %v %v", groups, err)
	}
	// Settled entries are deleted: compare with the last ID ever added.
	info, err := q.s.rdb.XInfoStream(ctx, q.s.stream).Result()
	if err != nil {
		return false, fmt.Sprintf("XINFO STREAM: %v", err)
	}
	delayed := q.s.rdb.ZCard(ctx, q.s.keys.Delayed).Val()
	g := groups[0]
	return g.Pending == 0 && g.LastDeliveredID == info.LastGeneratedID && delayed == 0,
		fmt.Sprintf("pending %d, last delivered %s of %s, delayed %d", g.Pending, g.LastDeliveredID, info.LastGeneratedID, delayed)
}

// runbook runs the scenario; replay replays the jobs matching reasons
// (all when empty), forgetting their failed idempotency records if forget.
func runbook(t *testing.T, q *runbookQueue, replay func(t *testing.T, reasons []string, forget bool)) {
	ctx := context.Background()
	flaky := q.enqueue(t, runbookTransient)
	bad := q.enqueue(t, runbookPermanent)

	// 1. Both die: the flaky one exhausted after its attempts, the bad one
	// permanent after one.
	eventually(t, 30*time.Second, func() (bool, string) {
		_, d1 := q.state(flaky)
		_, d2 := q.state(bad)
		return len(d1) == 1 && len(d2) == 1, fmt.Sprintf("dead reasons so far: flaky %v, bad %v", d1, d2)
	})
	if runs, dead := q.state(flaky); runs != runbookAttempts || !slices.Equal(dead, []string{consumer.ReasonExhausted}) {
		t.Fatalf("flaky job: %d runs, dead %v; want %d runs, dead exhausted", runs, dead, runbookAttempts)
	}
	if runs, dead := q.state(bad); runs != 1 || !slices.Equal(dead, []string{consumer.ReasonPermanent}) {
		t.Fatalf("bad job: %d runs, dead %v; want 1 run, dead permanent", runs, dead)
	}
	eventually(t, 10*time.Second, func() (bool, string) { return q.settled(t) })
	if st := q.record(t, bad); st != idem.StatusFailed {
		t.Fatalf("bad job's record: %v, want failed", st)
	}
	d, err := dlq.New(q.s.rdb, q.s.stream, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lease, cursor := d.Keys()
	t.Cleanup(func() { q.s.rdb.Del(context.Background(), lease, cursor) })
	for _, e := range mustList(t, d) {
		if want := map[string]string{flaky.ID: consumer.ReasonExhausted, bad.ID: consumer.ReasonPermanent}[e.Job.ID]; e.Reason != want {
			t.Fatalf("dead-letter entry of %s: reason %q, want %q", e.Job.ID, e.Reason, want)
		}
	}

	// 2. Fix, then replay everything.
	q.fixed.Store(true)
	replay(t, nil, false)

	// 3. The flaky job runs again and completes; the bad one, whose failed
	// record is a verdict, dies again at once without running.
	eventually(t, 30*time.Second, func() (bool, string) {
		r1, d1 := q.state(flaky)
		_, d2 := q.state(bad)
		if len(d1) > 1 {
			return true, "" // checked below
		}
		return r1 == runbookAttempts+1 && len(d2) == 2, fmt.Sprintf("flaky %d runs, dead %v; bad dead %v", r1, d1, d2)
	})
	eventually(t, 10*time.Second, func() (bool, string) { return q.settled(t) })
	if runs, dead := q.state(flaky); runs != runbookAttempts+1 || !slices.Equal(dead, []string{consumer.ReasonExhausted}) {
		t.Fatalf("replayed flaky job: %d runs, dead %v; want one more run and no new death (it died exhausted, never permanent)", runs, dead)
	}
	if st := q.record(t, flaky); st != idem.StatusCompleted {
		t.Fatalf("replayed flaky job's record: %v, want completed", st)
	}
	if runs, dead := q.state(bad); runs != 1 || !slices.Equal(dead, []string{consumer.ReasonPermanent, consumer.ReasonPermanent}) {
		t.Fatalf("replayed bad job: %d runs, dead %v; want no run and dead permanent again", runs, dead)
	}
	if st := q.record(t, bad); st != idem.StatusFailed {
		t.Fatalf("bad job's record after its replay: %v, want still failed", st)
	}
	if es := mustList(t, d); len(es) != 1 || es[0].Job.ID != bad.ID || es[0].Reason != consumer.ReasonPermanent ||
		!strings.Contains(es[0].Error, idem.ErrFailed.Error()) {
		t.Fatalf("dead-letter stream after the replay: %+v, want only the bad job, permanent, for its failed record", es)
	}

	// 4. Replay the permanent failure, forgetting its failed record: it runs
	// and completes.
	replay(t, []string{consumer.ReasonPermanent}, true)
	eventually(t, 30*time.Second, func() (bool, string) {
		runs, dead := q.state(bad)
		return runs == 2 || len(dead) > 2, fmt.Sprintf("bad job: %d runs, dead %v", runs, dead)
	})
	eventually(t, 10*time.Second, func() (bool, string) { return q.settled(t) })
	if runs, dead := q.state(bad); runs != 2 || len(dead) != 2 {
		t.Fatalf("bad job replayed with its record forgotten: %d runs, dead %v; want a second run and no new death", runs, dead)
	}
	if st := q.record(t, bad); st != idem.StatusCompleted {
		t.Fatalf("bad job's record: %v, want completed", st)
	}
	if n, err := d.Count(ctx, dlq.Filter{}); err != nil || n != 0 {
		t.Fatalf("dead-letter stream: %d entries (%v), want none", n, err)
	}
}

func mustList(t *testing.T, d *dlq.DLQ) []dlq.Entry {
	t.Helper()
	es, _, err := d.List(context.Background(), dlq.Filter{}, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func TestRunbook_replayWithPackageDLQ(t *testing.T) {
	t.Parallel()
	q := startRunbookQueue(t)
	d, err := dlq.New(q.s.rdb, q.s.stream, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	runbook(t, q, func(t *testing.T, reasons []string, forget bool) {
		o := dlq.ReplayOptions{}
		if forget {
			o.BeforeMove = func(ctx context.Context, e dlq.Entry) error {
				_, err := q.store.Forget(ctx, q.prefix+middleware.IdempotencyKey(e.Job, middleware.MissingUseJobID), idem.StatusFailed)
				return err
			}
		}
		if _, err := d.Replay(context.Background(), dlq.Filter{Reasons: reasons}, o); err != nil {
			t.Fatalf("Replay: %v", err)
		}
	})
}

func TestRunbook_replayWithCLI(t *testing.T) {
	t.Parallel()
	cli := pelicanCLI(t)
	q := startRunbookQueue(t)
	runbook(t, q, func(t *testing.T, reasons []string, forget bool) {
		args := []string{"--redis", "redis://" + q.s.addr + "/0", "dlq", "replay", q.s.stream, "--yes", "--rate", "0"}
		for _, r := range reasons {
			args = append(args, "--reason", r)
		}
		if forget {
			args = append(args, "--forget-failed-idempotency") // the default: the queue's namespace
		}
		out, err := exec.Command(cli, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("pelican %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		want := "idempotency records left as they were"
		if forget {
			want = fmt.Sprintf("forgot 1 failed idempotency records under %q", q.prefix)
		}
		if !strings.Contains(string(out), want) {
			t.Fatalf("pelican dlq replay output does not say %q:\n%s", want, out)
		}
	})
}
