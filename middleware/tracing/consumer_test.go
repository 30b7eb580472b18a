package tracing_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
)

// runQueue starts a consumer of stream "{t}:jobs" traced with cfg, with
// handlers by job type, until the test ends, and returns a producer traced
// with cfg.
func runQueue(t *testing.T, cfg tracing.Config, maxAttempts int, mux *consumer.Mux) *stream.Producer {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	const name = "{t}:jobs"
	c := consumer.New(rdb, consumer.Config{
		Stream: name, Group: "workers", Consumer: "w1",
		Block: 20 * time.Millisecond, PromoteInterval: 10 * time.Millisecond,
		MaxAttempts: maxAttempts, Backoff: consumer.Backoff{Base: time.Millisecond, Cap: time.Millisecond},
		Logger: slog.New(slog.DiscardHandler),
	}).Use(tracing.Middleware(cfg), tracing.Handler(cfg)).Handle(mux)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Prepare: tracing.Producer(name, cfg)})
}

// TestProducerToConsumer enqueues jobs with a traced producer under an
// application span and checks, on a real consumer, that every consumer span
// is the child of its job's send span, in the application's trace, with the
// outcome the consumer applied.
func TestProducerToConsumer(t *testing.T) {
	t.Parallel()
	for _, link := range []bool{false, true} {
		t.Run(map[bool]string{false: "parent", true: "link"}[link], func(t *testing.T) {
			t.Parallel()
			cfg, exp := setup(t)
			cfg.Link = link
			boom := errors.New("boom")
			var snoozed atomic.Bool
			prod := runQueue(t, cfg, 2, consumer.NewMux().
				HandleFunc("ok", func(context.Context, *stream.Job) error { return nil }).
				HandleFunc("fail", func(context.Context, *stream.Job) error { return boom }). // retry, then dead (exhausted)
				HandleFunc("dead", func(context.Context, *stream.Job) error { return consumer.Permanent(boom) }).
				HandleFunc("snooze", func(ctx context.Context, job *stream.Job) error {
					if snoozed.CompareAndSwap(false, true) {
						return consumer.Snooze(time.Millisecond)
					}
					return nil
				}))

			ctx, app := cfg.TracerProvider.Tracer("app").Start(context.Background(), "app")
			jobs := []*stream.Job{{Type: "ok"}, {Type: "fail"}, {Type: "dead"}}
			if _, err := prod.EnqueueBatch(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			snooze := &stream.Job{Type: "snooze"}
			if _, err := prod.Enqueue(ctx, snooze); err != nil {
				t.Fatal(err)
			}
			app.End()
			jobs = append(jobs, snooze)

			// ok: ack; fail: retry then dead_letter; dead: dead_letter; snooze: snooze then ack.
			const wantProcess = 6
			deadline := time.Now().Add(10 * time.Second)
			for len(byName(exp, "process {t}:jobs")) < wantProcess {
				if time.Now().After(deadline) {
					t.Fatalf("%d process spans, want %d", len(byName(exp, "process {t}:jobs")), wantProcess)
				}
				time.Sleep(5 * time.Millisecond)
			}

			sends := byName(exp, "send {t}:jobs")
			if len(sends) != len(jobs) {
				t.Fatalf("%d send spans, want one per job (%d)", len(sends), len(jobs))
			}
			sendOf := make(map[string]trace.SpanContext) // job ID → send span
			for _, s := range sends {
				if s.Parent.SpanID() != app.SpanContext().SpanID() || s.SpanKind != trace.SpanKindProducer {
					t.Errorf("send span parent %s kind %v, want the app span %s, producer", s.Parent.SpanID(), s.SpanKind, app.SpanContext().SpanID())
				}
				sendOf[attrs(s)["pelican.job.id"].AsString()] = s.SpanContext
			}
			outcomes := make(map[string][]string) // job type → outcomes in order
			for _, s := range byName(exp, "process {t}:jobs") {
				a := attrs(s)
				send, ok := sendOf[a["pelican.job.id"].AsString()]
				if !ok {
					t.Fatalf("process span of unknown job %v", a["pelican.job.id"].Emit())
				}
				if link {
					if s.Parent.IsValid() || len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != send.SpanID() ||
						s.Links[0].SpanContext.TraceID() != send.TraceID() {
						t.Errorf("%s: parent %v, links %v; want a root linked to its send span %s", a["pelican.job.type"].Emit(), s.Parent, s.Links, send.SpanID())
					}
				} else if s.Parent.SpanID() != send.SpanID() || s.SpanContext.TraceID() != app.SpanContext().TraceID() {
					t.Errorf("%s: parent %s in trace %s, want its send span %s in the app's trace %s", a["pelican.job.type"].Emit(),
						s.Parent.SpanID(), s.SpanContext.TraceID(), send.SpanID(), app.SpanContext().TraceID())
				}
				typ := a["pelican.job.type"].AsString()
				outcome := a["pelican.outcome"].AsString()
				outcomes[typ] = append(outcomes[typ], outcome)
				if failed := s.Status.Code == codes.Error; failed != (typ == "fail" || typ == "dead") {
					t.Errorf("%s (%s): status %v", typ, outcome, s.Status)
				}
			}
			want := map[string][]string{"ok": {"ack"}, "fail": {"retry", "dead_letter"}, "dead": {"dead_letter"}, "snooze": {"snooze", "ack"}}
			for typ, w := range want {
				if !slicesEqual(outcomes[typ], w) {
					t.Errorf("%s: outcomes %v, want %v", typ, outcomes[typ], w)
				}
			}
		})
	}
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
