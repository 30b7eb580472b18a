package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/internal/poll"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

// decisionSeen is what one observer reported about a job.
type decisionSeen struct {
	kind   string
	reason string
}

func (d decisionSeen) String() string {
	if d.reason == "" {
		return d.kind
	}
	return d.kind + "/" + d.reason
}

// TestDecision_observersAgree runs one job per kind of handler result
// through a real consumer whose chain holds every observer of the outcome
// (tracing, metrics, idempotency, the circuit breaker), and checks that the
// consumer settled the job as the table says (acknowledged, rescheduled
// with the delay, dead-lettered with the reason, left pending) and that
// every observer reported that same outcome: none derives it on its own.
func TestDecision_observersAgree(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	const hour = time.Hour
	for _, tc := range []struct {
		name        string
		run         func(ctx context.Context, job *stream.Job) error
		maxAttempts int
		want        decisionSeen
		delay       time.Duration // of a retry or snooze; -1: the consumer's backoff for the job
		idem        idem.Status   // the record left: completed, failed, or released (StatusStarted for a probe)
	}{
		{name: "nil", run: func(context.Context, *stream.Job) error { return nil },
			want: decisionSeen{"ack", ""}, idem: idem.StatusCompleted},
		{name: "Retry", run: func(context.Context, *stream.Job) error { return consumer.Retry(hour, boom) },
			want: decisionSeen{"retry", ""}, delay: hour, idem: idem.StatusStarted},
		{name: "Snooze", run: func(context.Context, *stream.Job) error { return consumer.Snooze(2 * hour) },
			want: decisionSeen{"snooze", ""}, delay: 2 * hour, idem: idem.StatusStarted},
		{name: "Dead", run: func(context.Context, *stream.Job) error { return consumer.Dead("mine", boom) },
			want: decisionSeen{"dead_letter", "mine"}, idem: idem.StatusStarted},
		{name: "Permanent", run: func(context.Context, *stream.Job) error { return consumer.Permanent(boom) },
			want: decisionSeen{"dead_letter", consumer.ReasonPermanent}, idem: idem.StatusFailed},
		{name: "Retryable", run: func(context.Context, *stream.Job) error { return consumer.Retryable(boom) },
			want: decisionSeen{"retry", ""}, delay: -1, idem: idem.StatusStarted},
		{name: "plain error", run: func(context.Context, *stream.Job) error { return boom },
			want: decisionSeen{"retry", ""}, delay: -1, idem: idem.StatusStarted},
		{name: "RetryAfter", run: func(context.Context, *stream.Job) error { return consumer.RetryAfter(3*hour, boom) },
			want: decisionSeen{"retry", ""}, delay: 3 * hour, idem: idem.StatusStarted},
		{name: "ErrPayload", run: func(_ context.Context, job *stream.Job) error {
			var n int
			return job.Decode(&n) // the payload is a JSON object
		}, want: decisionSeen{"dead_letter", consumer.ReasonPermanent}, idem: idem.StatusFailed},
		{name: "panic", run: func(context.Context, *stream.Job) error { panic("oops") },
			want: decisionSeen{"dead_letter", consumer.ReasonPanic}, idem: idem.StatusStarted},
		{name: "last attempt", run: func(context.Context, *stream.Job) error { return boom }, maxAttempts: 1,
			want: decisionSeen{"dead_letter", consumer.ReasonExhausted}, idem: idem.StatusStarted},
		{name: "shutdown", run: func(ctx context.Context, _ *stream.Job) error {
			<-ctx.Done()
			return context.Cause(ctx)
		}, want: decisionSeen{"abandoned", ""}, idem: idem.StatusStarted},
		{name: "lease lost", run: func(ctx context.Context, _ *stream.Job) error {
			<-ctx.Done()
			return context.Cause(ctx)
		}, want: decisionSeen{"abandoned", ""}, idem: idem.StatusStarted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			name := redistest.Name(t)
			keys, err := stream.KeysFor(name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}*") })

			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			reg := prometheus.NewRegistry()
			m := metrics.New(reg, metrics.Config{})
			var (
				mu      sync.Mutex
				breaker []consumer.Decision
			)
			store := idem.NewRedisStore(rdb, idem.RedisConfig{Retention: time.Hour})
			started := make(chan struct{}, 1)
			cfg := consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 20 * time.Millisecond,
				PromoteInterval: 10 * time.Millisecond, MaxAttempts: tc.maxAttempts, KeepSettled: true,
				Logger: slog.New(slog.DiscardHandler)}
			if tc.name == "lease lost" {
				// No heartbeat: the lease ends, and the handler's context is
				// cancelled with ErrLeaseLost, a tenth of this before.
				cfg.HeartbeatInterval, cfg.VisibilityTimeout, cfg.SweepInterval = -1, 300*time.Millisecond, time.Hour
			}
			c := consumer.New(rdb, cfg).Use(
				tracing.Middleware(tracing.Config{TracerProvider: tp}),
				m.Middleware(),
				middleware.Idempotency(store, middleware.IdempotencyConfig{Missing: middleware.MissingUseJobID, Logger: slog.New(slog.DiscardHandler)}),
				middleware.CircuitBreaker(middleware.CircuitBreakerConfig{Threshold: 1000, IsFailure: func(d consumer.Decision) bool {
					mu.Lock()
					breaker = append(breaker, d)
					mu.Unlock()
					return false
				}}),
			).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				select {
				case started <- struct{}{}:
				default:
				}
				return tc.run(ctx, job)
			}))
			before, err := rdb.Time(context.Background()).Result()
			if err != nil {
				t.Fatal(err)
			}
			job := &stream.Job{Type: "t", Payload: []byte(`{"a":1}`)}
			entryID, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.Run(context.Background()) }()
			stop := func(grace time.Duration) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), grace)
				defer cancel()
				_ = c.Shutdown(ctx)
				if err := <-done; err != nil {
					t.Fatalf("Run: %v", err)
				}
			}

			// How the core settled the job.
			var settled decisionSeen
			switch tc.want.kind {
			case "abandoned":
				<-started
				if tc.name == "lease lost" {
					waitUntil(t, "the lease lost", func() bool { return c.Stats().LeaseLost == 1 })
					stop(5 * time.Second)
				} else {
					stop(time.Millisecond) // the drain deadline passes: ErrShutdown
				}
				if n := rdb.XPending(context.Background(), name, "g").Val().Count; n == 1 {
					settled = decisionSeen{"abandoned", ""}
				}
			default:
				waitUntil(t, "the job settled", func() bool {
					s := c.Stats()
					return s.Acked+s.Retried+s.Snoozed+s.DeadLettered > 0
				})
				stop(5 * time.Second)
				s := c.Stats()
				switch {
				case s.Acked == 1:
					settled = decisionSeen{"ack", ""}
				case s.Retried == 1:
					settled = decisionSeen{"retry", ""}
				case s.Snoozed == 1:
					settled = decisionSeen{"snooze", ""}
				case s.DeadLettered == 1:
					dead := rdb.XRange(context.Background(), keys.Dead, "-", "+").Val()
					if len(dead) == 1 {
						settled = decisionSeen{"dead_letter", fmt.Sprint(dead[0].Values["dead_reason"])}
					}
				}
			}
			if settled != tc.want {
				t.Fatalf("the consumer settled the job as %v, want %v", settled, tc.want)
			}
			// The delay the core scheduled: the delayed entry's due time,
			// by the Redis clock, lies between the enqueue and the end.
			want := tc.delay
			decoded := *job
			decoded.EntryID, decoded.Stream, decoded.Group, decoded.AttemptLimit = entryID, name, "g", max(tc.maxAttempts, consumer.DefaultMaxAttempts)
			if want == -1 {
				want = consumer.Backoff{}.Delay(&decoded)
			}
			if tc.want.kind == "retry" || tc.want.kind == "snooze" {
				after, err := rdb.Time(context.Background()).Result()
				if err != nil {
					t.Fatal(err)
				}
				z := rdb.ZRangeWithScores(context.Background(), keys.Delayed, 0, -1).Val()
				if len(z) != 1 {
					t.Fatalf("delayed set %v, want the job", z)
				}
				due := time.UnixMilli(int64(z[0].Score))
				if lo, hi := before.Truncate(time.Millisecond).Add(want), after.Add(want); due.Before(lo) || due.After(hi) {
					t.Errorf("due at %v, want within [%v, %v]: a delay of %v", due, lo, hi, want)
				}
			}

			// What each observer reported.
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			a := attrs(spans[0])
			if got := (decisionSeen{a["pelican.outcome"].AsString(), a["pelican.dead_reason"].AsString()}); got != tc.want {
				t.Errorf("tracing reported %v, want %v", got, tc.want)
			}
			if d, ok := a["pelican.delay_ms"]; (tc.want.kind == "retry" || tc.want.kind == "snooze") && (!ok || d.AsInt64() != want.Milliseconds()) {
				t.Errorf("tracing reported delay_ms %v (set %v), want %d", d.AsInt64(), ok, want.Milliseconds())
			}
			for _, k := range []string{"ack", "retry", "snooze", "dead_letter", "abandoned"} {
				wantN := 0.0
				if k == tc.want.kind {
					wantN = 1
				}
				if got := testutil.ToFloat64(m.Processed(name, "t", k)); got != wantN {
					t.Errorf("metrics counted %v jobs as %s, want %v", got, k, wantN)
				}
			}
			if tc.want.reason != "" {
				if got := testutil.ToFloat64(deadLetterCounter(t, reg, tc.want.reason)); got != 1 {
					t.Errorf("metrics counted %v dead letters with reason %s, want 1", got, tc.want.reason)
				}
			}
			mu.Lock()
			seen := breaker
			mu.Unlock()
			switch {
			case tc.name == "nil":
				// A success is not asked about (a panic is, as it unwinds
				// through the breaker, so that a probe frees its place).
				if len(seen) != 0 {
					t.Errorf("breaker was asked about %v, want nothing", seen)
				}
			case len(seen) != 1:
				t.Errorf("breaker was asked %d times (%v), want once", len(seen), seen)
			default:
				if got := (decisionSeen{string(seen[0].Kind), seen[0].Reason}); got != tc.want {
					t.Errorf("breaker was given %v, want %v", got, tc.want)
				}
				if (tc.want.kind == "retry" || tc.want.kind == "snooze") && seen[0].Delay != want {
					t.Errorf("breaker was given delay %v, want %v", seen[0].Delay, want)
				}
			}
			out, err := store.Begin(context.Background(), keys.Idem+job.ID, "probe", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if out.Status != tc.idem {
				t.Errorf("idempotency record %v, want %v", out.Status, tc.idem)
			}
		})
	}
}

// waitUntil waits for cond, failing the test after a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, time.Minute, poll.True(what, cond))
}

// deadLetterCounter returns pelican_dead_letters_total's child of reason.
func deadLetterCounter(t *testing.T, reg *prometheus.Registry, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pelican_dead_letters_total" {
			continue
		}
		for _, mt := range mf.Metric {
			for _, l := range mt.Label {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 { return mt.Counter.GetValue() })
				}
			}
		}
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 { return 0 })
}

// attrs returns a span's attributes by key.
func attrs(s tracetest.SpanStub) map[string]attrValue {
	out := map[string]attrValue{}
	for _, kv := range s.Attributes {
		out[string(kv.Key)] = attrValue{kv.Value.AsString(), kv.Value.AsInt64()}
	}
	return out
}

// attrValue is a span attribute's value as a string or an integer.
type attrValue struct {
	s string
	n int64
}

func (v attrValue) AsString() string { return v.s }
func (v attrValue) AsInt64() int64   { return v.n }

// The delay of a retry is the consumer's Config.Backoff, capped at one
// hour by default, whether middleware.Retry is in the chain or not (Retry
// without a per-type entry leaves the delay to the consumer).
func TestDecision_backoffCapSameWithRetry(t *testing.T) {
	t.Parallel()
	for _, withRetry := range []bool{false, true} {
		t.Run(fmt.Sprint("Retry ", withRetry), func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			name := redistest.Name(t)
			keys, err := stream.KeysFor(name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}*") })
			var mws []consumer.Middleware
			if withRetry {
				mws = append(mws, middleware.Retry(middleware.RetryConfig{}))
			}
			c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 20 * time.Millisecond,
				MaxAttempts: 100, Logger: slog.New(slog.DiscardHandler)}).Use(mws...).
				Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return errors.New("down") }))
			before, err := rdb.Time(context.Background()).Result()
			if err != nil {
				t.Fatal(err)
			}
			// Attempt 40: far past the doubling, at the cap.
			job := &stream.Job{Type: "t", Payload: []byte(`{}`), Attempt: 40}
			entryID, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.Run(context.Background()) }()
			waitUntil(t, "the retry scheduled", func() bool { return c.Stats().Retried == 1 })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = c.Shutdown(ctx)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			after, err := rdb.Time(context.Background()).Result()
			if err != nil {
				t.Fatal(err)
			}
			decoded := *job
			decoded.EntryID = entryID
			want := consumer.Backoff{}.Delay(&decoded)
			if want < consumer.DefaultBackoffCap/2 || want > consumer.DefaultBackoffCap {
				t.Fatalf("Backoff{}.Delay at attempt 40 = %v, want within [%v, %v]", want, consumer.DefaultBackoffCap/2, consumer.DefaultBackoffCap)
			}
			z := rdb.ZRangeWithScores(context.Background(), keys.Delayed, 0, -1).Val()
			if len(z) != 1 {
				t.Fatalf("delayed set %v, want the job", z)
			}
			due := time.UnixMilli(int64(z[0].Score))
			if lo, hi := before.Truncate(time.Millisecond).Add(want), after.Add(want); due.Before(lo) || due.After(hi) {
				t.Errorf("due at %v, want within [%v, %v]: the core's delay %v", due, lo, hi, want)
			}
		})
	}
}
