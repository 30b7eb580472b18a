package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

func TestDeadLetter_MaxAge(t *testing.T) {
	t.Parallel()
	own := errors.New("handler error")
	for _, tc := range []struct {
		name    string
		maxAge  time.Duration
		created time.Time
		want    string // outcome
		called  bool
	}{
		{"older than max age", time.Hour, time.Now().Add(-61 * time.Minute), "dead expired", false},
		{"younger than max age", time.Hour, time.Now().Add(-59 * time.Minute), "error: handler error", true},
		{"no max age", 0, time.Now().Add(-1000 * time.Hour), "error: handler error", true},
		{"no creation time", time.Hour, time.Time{}, "error: handler error", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			called := false
			h := middleware.DeadLetter(middleware.DeadLetterConfig{MaxAge: tc.maxAge})(consumer.HandlerFunc(
				func(context.Context, *stream.Job) error {
					called = true
					return own
				}))
			err := h.Process(context.Background(), &stream.Job{CreatedAt: tc.created})
			if d := retryDescribe(err); d != tc.want || called != tc.called {
				t.Errorf("outcome %q, handler called %v; want %q, %v", d, called, tc.want, tc.called)
			}
			if tc.called && err != own {
				t.Errorf("err = %v, want the handler's own, untouched", err)
			}
			if !tc.called && !strings.Contains(err.Error(), "older than MaxAge 1h0m0s") {
				t.Errorf("err = %v, want it to name the age limit", err)
			}
		})
	}
}

// The recorder applies whoever decides that the job dies.
func TestDeadLetter_Recorder(t *testing.T) {
	t.Parallel()
	redact := func(job *stream.Job) map[string]string {
		return map[string]string{"payload": "<redacted " + job.Type + ">", "not_a_field": "x"}
	}
	fail := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return errors.New("fail") })

	for _, tc := range []struct {
		name    string
		cfg     consumer.Config
		handler consumer.Handler
		typ     string
		reason  string
	}{
		// MaxAttempts 1: the core itself dead-letters the plain error.
		{"decided by the core", consumer.Config{MaxAttempts: 1, KeepSettled: true}, fail, "send", consumer.ReasonExhausted},
		{"decided by the handler", consumer.Config{KeepSettled: true},
			consumer.HandlerFunc(func(context.Context, *stream.Job) error { return consumer.Dead("bad", nil) }), "send", "bad"},
		{"decided by the mux", consumer.Config{KeepSettled: true}, consumer.NewMux(), "nobody", consumer.ReasonUnknownType},
		// The core cancels the job's context at MaxRuntime before it
		// settles; the hook's context is not cancelled.
		{"after MaxRuntime", consumer.Config{MaxAttempts: 1, MaxRuntime: 10 * time.Millisecond, KeepSettled: true},
			consumer.HandlerFunc(func(ctx context.Context, _ *stream.Job) error {
				<-ctx.Done()
				return ctx.Err()
			}), "send", consumer.ReasonExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hooks := &orderDeadLetters{}
			var hookErr error
			q := orderStart(t, tc.cfg, tc.handler, middleware.DeadLetter(middleware.DeadLetterConfig{
				Redact: redact,
				OnDeadLetter: func(ctx context.Context, d consumer.DeadLetter) {
					hookErr = ctx.Err()
					hooks.hook(ctx, d)
				},
			}))
			job := q.enqueue(tc.typ, nil)
			dead := q.waitDead(1)
			v := dead[0].Values
			if v["payload"] != "<redacted "+tc.typ+">" || v["dead_reason"] != tc.reason || v["type"] != tc.typ {
				t.Errorf("dead-letter entry %v: want payload redacted and reason %s", v, tc.reason)
			}
			if _, ok := v["not_a_field"]; ok {
				t.Errorf("a replacement for a field the entry lacks was added: %v", v)
			}
			src := q.rdb.XRange(context.Background(), q.stream, "-", "+").Val()
			if len(src) != 1 || src[0].Values["payload"] != `"secret"` {
				t.Errorf("source entry %v: want it left as written", src)
			}
			q.waitFor("OnDeadLetter", func() bool { return len(hooks.all()) == 1 })
			d := hooks.all()[0]
			if d.DeadEntryID != dead[0].ID || d.Reason != tc.reason || d.Job == nil || d.Job.ID != job.ID || d.EntryID != src[0].ID {
				t.Errorf("OnDeadLetter got %+v; want dead entry %s, reason %s, job %s, entry %s", d, dead[0].ID, tc.reason, job.ID, src[0].ID)
			}
			if hookErr != nil {
				t.Errorf("OnDeadLetter's context is done: %v", hookErr)
			}
		})
	}

	// The control: without the middleware, the copy holds the raw payload.
	t.Run("without DeadLetter", func(t *testing.T) {
		t.Parallel()
		q := orderStart(t, consumer.Config{MaxAttempts: 1}, fail)
		q.enqueue("send", nil)
		if v := q.waitDead(1)[0].Values; v["payload"] != `"secret"` {
			t.Errorf("dead-letter payload = %v, want the raw one", v["payload"])
		}
	})
}
