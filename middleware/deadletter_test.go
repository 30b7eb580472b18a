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
	"github.com/redis/go-redis/v9"
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

// Config.RedactDeadLetter and Config.OnDeadLetter apply whoever decides
// that the job dies: the core, the handler, the mux, the Retry middleware
// on the last attempt, the DeadLetter middleware's MaxAge, and the core for
// an entry that does not decode (not redacted: there is no job to redact,
// but the hook runs).
func TestDeadLetter_whoeverDecides(t *testing.T) {
	t.Parallel()
	redact := func(job *stream.Job) map[string]string {
		return map[string]string{"payload": "<redacted " + job.Type + ">", "not_a_field": "x"}
	}
	fail := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return errors.New("fail") })
	for _, tc := range []struct {
		name    string
		cfg     consumer.Config
		handler consumer.Handler
		mws     []consumer.Middleware
		typ     string
		reason  string
		raw     bool // enqueue an entry without a type: malformed
	}{
		// MaxAttempts 1: the core itself dead-letters the plain error.
		{name: "decided by the core", cfg: consumer.Config{MaxAttempts: 1}, handler: fail, typ: "send", reason: consumer.ReasonExhausted},
		{name: "decided by the handler", handler: consumer.HandlerFunc(func(context.Context, *stream.Job) error { return consumer.Dead("bad", nil) }),
			typ: "send", reason: "bad"},
		{name: "decided by the mux", handler: consumer.NewMux(), typ: "nobody", reason: consumer.ReasonUnknownType},
		{name: "decided by Retry on the last attempt", cfg: consumer.Config{MaxAttempts: 1}, handler: fail,
			mws: []consumer.Middleware{middleware.Retry(middleware.RetryConfig{})}, typ: "send", reason: consumer.ReasonExhausted},
		{name: "decided by Retry as permanent", handler: fail,
			mws: []consumer.Middleware{middleware.Retry(middleware.RetryConfig{Unknown: middleware.ClassPermanent})}, typ: "send", reason: consumer.ReasonPermanent},
		{name: "decided by DeadLetter's MaxAge", handler: fail,
			mws: []consumer.Middleware{middleware.DeadLetter(middleware.DeadLetterConfig{MaxAge: time.Nanosecond})}, typ: "send", reason: middleware.ReasonExpired},
		// The core cancels the job's context at MaxRuntime before it
		// settles; the hook's context is not cancelled.
		{name: "after MaxRuntime", cfg: consumer.Config{MaxAttempts: 1, MaxRuntime: 10 * time.Millisecond},
			handler: consumer.HandlerFunc(func(ctx context.Context, _ *stream.Job) error {
				<-ctx.Done()
				return ctx.Err()
			}), typ: "send", reason: consumer.ReasonExhausted},
		{name: "malformed, decided by the core", handler: fail, reason: consumer.ReasonMalformed, raw: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hooks := &orderDeadLetters{}
			var hookErr error
			cfg := tc.cfg
			cfg.KeepSettled = true
			cfg.RedactDeadLetter = redact
			cfg.OnDeadLetter = func(ctx context.Context, d consumer.DeadLetter) {
				hookErr = ctx.Err()
				hooks.hook(ctx, d)
			}
			q := orderStart(t, cfg, tc.handler, tc.mws...)
			var job *stream.Job
			if tc.raw {
				if err := q.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: q.stream,
					Values: []any{"v", "1", "payload", `"secret"`}}).Err(); err != nil {
					t.Fatal(err)
				}
			} else {
				job = q.enqueue(tc.typ, nil)
			}
			dead := q.waitDead(1)
			v := dead[0].Values
			wantPayload := "<redacted " + tc.typ + ">"
			if tc.raw {
				wantPayload = `"secret"`
			}
			if v["payload"] != wantPayload || v["dead_reason"] != tc.reason {
				t.Errorf("dead-letter entry %v: want payload %s and reason %s", v, wantPayload, tc.reason)
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
			if d.DeadEntryID != dead[0].ID || d.Reason != tc.reason || d.EntryID != src[0].ID ||
				(job == nil) != (d.Job == nil) || (job != nil && d.Job.ID != job.ID) {
				t.Errorf("OnDeadLetter got %+v; want dead entry %s, reason %s, job %v, entry %s", d, dead[0].ID, tc.reason, job, src[0].ID)
			}
			if hookErr != nil {
				t.Errorf("OnDeadLetter's context is done: %v", hookErr)
			}
		})
	}

	// The control: without RedactDeadLetter, the copy holds the raw payload.
	t.Run("without RedactDeadLetter", func(t *testing.T) {
		t.Parallel()
		q := orderStart(t, consumer.Config{MaxAttempts: 1}, fail)
		q.enqueue("send", nil)
		if v := q.waitDead(1)[0].Values; v["payload"] != `"secret"` {
			t.Errorf("dead-letter payload = %v, want the raw one", v["payload"])
		}
	})
}
