package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// jobKeys are the attributes every log record about a job carries.
var jobKeys = []string{"stream", "group", "consumer", "entry_id", "job_id", "job_type", "idempotency_key",
	"attempt", "lock_key", "trace_id", "duration_ms", "error_kind"}

// secret is in the payload of every job of these tests, and must be in no
// log record.
const secret = "payload-secret-5c1e9"

// logRecord is one captured record, its attributes (those of the logger's
// With included) by key, in order.
type logRecord struct {
	level slog.Level
	msg   string
	keys  []string
	attrs map[string]slog.Value
}

func (r logRecord) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", r.level, r.msg)
	for _, k := range r.keys {
		fmt.Fprintf(&b, " %s=%q", k, r.attrs[k].String())
	}
	return b.String()
}

// capture is a slog.Handler that keeps every record at or above its level.
type capture struct {
	level slog.Level
	with  []slog.Attr
	mu    *sync.Mutex
	recs  *[]logRecord
}

func newCapture(level slog.Level) (*slog.Logger, *capture) {
	h := &capture{level: level, mu: new(sync.Mutex), recs: new([]logRecord)}
	return slog.New(h), h
}

func (h *capture) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *capture) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]slog.Value{}}
	add := func(a slog.Attr) bool {
		rec.keys = append(rec.keys, a.Key)
		rec.attrs[a.Key] = a.Value.Resolve()
		return true
	}
	for _, a := range h.with {
		add(a)
	}
	r.Attrs(add)
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, rec)
	return nil
}

func (h *capture) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.with = append(append([]slog.Attr(nil), h.with...), attrs...)
	return &c
}

func (h *capture) WithGroup(string) slog.Handler { return h } // the consumer uses no groups

func (h *capture) records() []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]logRecord(nil), *h.recs...)
}

// withMsg returns the records whose message is msg.
func (h *capture) withMsg(msg string) []logRecord {
	var out []logRecord
	for _, r := range h.records() {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// wait waits for a record with message msg and returns the first.
func (h *capture) wait(t *testing.T, msg string) logRecord {
	t.Helper()
	waitFor(t, 30*time.Second, "a log record "+msg, func() bool { return len(h.withMsg(msg)) > 0 })
	return h.withMsg(msg)[0]
}

// checkNoPayload fails t if a record holds the payload secret.
func (h *capture) checkNoPayload(t *testing.T) {
	t.Helper()
	for _, r := range h.records() {
		if strings.Contains(r.String(), secret) {
			t.Errorf("log record holds the payload: %v", r)
		}
	}
}

// checkJobRecord checks that r has every job key once, no payload, and the
// wanted values (a string, an int for attempt, a func(slog.Value) error, or
// nil for an attribute that must be absent).
func checkJobRecord(t *testing.T, r logRecord, want map[string]any) {
	t.Helper()
	for _, k := range jobKeys {
		if _, ok := r.attrs[k]; !ok {
			t.Errorf("record %v: no %s attribute", r, k)
		}
	}
	if len(r.keys) != len(r.attrs) {
		t.Errorf("record %v: repeated keys", r)
	}
	for k, w := range want {
		v, ok := r.attrs[k]
		if w == nil {
			if ok {
				t.Errorf("record %v: has %s, want none", r, k)
			}
			continue
		}
		if !ok {
			t.Errorf("record %v: no %s attribute, want %v", r, k, w)
			continue
		}
		switch w := w.(type) {
		case string:
			if v.Kind() != slog.KindString || v.String() != w {
				t.Errorf("record %q: %s = %v (%v), want %q", r.msg, k, v, v.Kind(), w)
			}
		case int:
			if v.Kind() != slog.KindInt64 || v.Int64() != int64(w) {
				t.Errorf("record %q: %s = %v (%v), want %d", r.msg, k, v, v.Kind(), w)
			}
		case func(slog.Value) error:
			if err := w(v); err != nil {
				t.Errorf("record %q: %s = %v: %v", r.msg, k, v, err)
			}
		default:
			t.Fatalf("bad want %T", w)
		}
	}
}

// atLeastMs checks an int64 attribute of at least d in milliseconds.
func atLeastMs(d time.Duration) func(slog.Value) error {
	return func(v slog.Value) error {
		if v.Kind() != slog.KindInt64 || v.Int64() < d.Milliseconds() {
			return fmt.Errorf("want an int64 of at least %d", d.Milliseconds())
		}
		return nil
	}
}

func contains(s string) func(slog.Value) error {
	return func(v slog.Value) error {
		if v.Kind() != slog.KindString || !strings.Contains(v.String(), s) {
			return fmt.Errorf("want a string containing %q", s)
		}
		return nil
	}
}

const (
	testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
)

// enqueueTraced enqueues a job of type typ with the payload secret, a
// traceparent, an idempotency key and a lock key, after edit.
func (b *bundle) enqueueTraced(t *testing.T, typ string, edit func(*stream.Job)) (string, *stream.Job) {
	t.Helper()
	job, err := stream.NewJSONJob(typ, map[string]string{"secret": secret})
	if err != nil {
		t.Fatal(err)
	}
	job.ID = "job-" + typ
	job.TraceParent = testTraceParent
	job.IdempotencyKey = "idem-" + typ
	job.LockKey = "lock:" + typ
	if edit != nil {
		edit(job)
	}
	id, err := b.prod.Enqueue(context.Background(), job)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return id, job
}

// wantJob returns the attributes expected of a record about job, from entry id.
func (b *bundle) wantJob(id string, job *stream.Job) map[string]any {
	return map[string]any{
		"stream": b.cfg.Stream, "group": b.cfg.Group, "consumer": b.cfg.Consumer, "entry_id": id,
		"job_id": job.ID, "job_type": job.Type, "idempotency_key": job.IdempotencyKey, "attempt": job.Attempt,
		"lock_key": job.LockKey, "trace_id": testTraceID,
	}
}

// handlerRun is how long the test handlers run.
const handlerRun = 30 * time.Millisecond

func TestConsumer_Logs_Success(t *testing.T) {
	t.Parallel()

	t.Run("DebugJobDone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		logger, logs := newCapture(slog.LevelDebug)
		b.cfg.Logger = logger
		id, job := b.enqueueTraced(t, "ok", func(j *stream.Job) { j.Attempt = 1 })
		r := start(t, consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			time.Sleep(handlerRun) // the run time the record must show
			return nil
		})))
		logs.wait(t, "job done")
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		done := logs.withMsg("job done")
		if len(done) != 1 {
			t.Fatalf("%d job done records, want 1: %v", len(done), logs.records())
		}
		if done[0].level != slog.LevelDebug {
			t.Errorf("job done at %v, want Debug", done[0].level)
		}
		want := b.wantJob(id, job)
		want["error_kind"] = ""
		want["error"] = nil
		want["duration_ms"] = atLeastMs(handlerRun)
		checkJobRecord(t, done[0], want)
		for _, rec := range logs.records() {
			if rec.level >= slog.LevelInfo {
				t.Errorf("record at %v for a successful job: %v", rec.level, rec)
			}
		}
		logs.checkNoPayload(t)
	})

	t.Run("InfoNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		logger, logs := newCapture(slog.LevelInfo)
		b.cfg.Logger = logger
		b.enqueueTraced(t, "ok", nil)
		c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error { return nil }))
		r := start(t, c)
		waitFor(t, 5*time.Second, "the job acknowledged", func() bool { return c.Stats().Acked == 1 })
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if recs := logs.records(); len(recs) != 0 {
			t.Errorf("a successful job logged at Info: %v", recs)
		}
	})
}

func TestConsumer_Logs_Failure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     func(*consumer.Config)
		edit    func(*stream.Job)
		handler func(ctx context.Context, j *stream.Job) error
		capture slog.Level // the logger's level; Info when zero
		msg     string
		level   slog.Level
		want    map[string]any
	}{{
		name:    "Retry",
		cfg:     func(c *consumer.Config) { c.Backoff = consumer.Backoff{Base: time.Hour, Jitter: consumer.JitterNone} },
		edit:    func(j *stream.Job) { j.Attempt, j.MaxAttempts = 2, 10 },
		handler: func(context.Context, *stream.Job) error { return errors.New("smtp 451") },
		msg:     "job failed; retry scheduled",
		level:   slog.LevelWarn,
		want:    map[string]any{"error_kind": "retryable", "error": "smtp 451", "delay_ms": atLeastMs(time.Hour)},
	}, {
		name: "Timeout",
		cfg: func(c *consumer.Config) {
			c.MaxRuntime = handlerRun
			c.Backoff = consumer.Backoff{Base: time.Hour, Jitter: consumer.JitterNone}
		},
		handler: func(ctx context.Context, _ *stream.Job) error { <-ctx.Done(); return ctx.Err() },
		msg:     "job failed; retry scheduled",
		level:   slog.LevelWarn,
		want:    map[string]any{"error_kind": "timeout", "error": context.DeadlineExceeded.Error()},
	}, {
		name:    "Snooze",
		handler: func(context.Context, *stream.Job) error { return consumer.Snooze(time.Hour) },
		capture: slog.LevelDebug,
		msg:     "job snoozed; rescheduled",
		level:   slog.LevelDebug,
		want:    map[string]any{"error_kind": "snooze", "error": nil, "delay_ms": atLeastMs(time.Hour)},
	}, {
		name:    "Permanent",
		handler: func(context.Context, *stream.Job) error { return consumer.Permanent(errors.New("no such mailbox")) },
		msg:     "job dead-lettered",
		level:   slog.LevelError,
		want:    map[string]any{"error_kind": "permanent", "dead_reason": "permanent", "error": "no such mailbox"},
	}, {
		name:    "DeadCustomReason",
		handler: func(context.Context, *stream.Job) error { return consumer.Dead("bounced", errors.New("hard bounce")) },
		msg:     "job dead-lettered",
		level:   slog.LevelError,
		want:    map[string]any{"error_kind": "permanent", "dead_reason": "bounced", "error": "hard bounce"},
	}, {
		name:    "Exhausted",
		edit:    func(j *stream.Job) { j.Attempt, j.MaxAttempts = 2, 3 },
		handler: func(context.Context, *stream.Job) error { return errors.New("still down") },
		msg:     "job dead-lettered",
		level:   slog.LevelError,
		want:    map[string]any{"error_kind": "exhausted", "dead_reason": "exhausted", "error": "attempt 3 of 3: still down"},
	}, {
		name:    "Panic",
		handler: func(context.Context, *stream.Job) error { panic("kaboom") },
		msg:     "job dead-lettered",
		level:   slog.LevelError,
		want:    map[string]any{"error_kind": "panic", "dead_reason": "panic", "error": contains("panic: kaboom")},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			logger, logs := newCapture(tt.capture)
			b.cfg.Logger = logger
			if tt.cfg != nil {
				tt.cfg(&b.cfg)
			}
			id, job := b.enqueueTraced(t, strings.ToLower(tt.name), tt.edit)
			start(t, consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				time.Sleep(handlerRun) // the run time the record must show
				return tt.handler(ctx, j)
			})))
			rec := logs.wait(t, tt.msg)
			if rec.level != tt.level {
				t.Errorf("%q at %v, want %v", rec.msg, rec.level, tt.level)
			}
			want := b.wantJob(id, job)
			want["duration_ms"] = atLeastMs(handlerRun)
			for k, v := range tt.want {
				want[k] = v
			}
			checkJobRecord(t, rec, want)
			if n := len(logs.records()); n != 1 {
				t.Errorf("%d records, want 1: %v", n, logs.records())
			}
			logs.checkNoPayload(t)
		})
	}
}

func TestConsumer_Logs_LeaseLost(t *testing.T) {
	t.Parallel()
	steal := func(t *testing.T, b *bundle, id string) {
		t.Helper()
		n, err := b.rdb.XClaim(context.Background(), &redis.XClaimArgs{Stream: b.cfg.Stream, Group: b.cfg.Group,
			Consumer: "thief", Messages: []string{id}}).Result()
		if err != nil || len(n) != 1 {
			t.Fatalf("XCLAIM to thief: %v, %v", n, err)
		}
	}
	tests := []struct {
		name      string
		heartbeat time.Duration
		outcome   error
		msg       string
		error     any
	}{
		{"Heartbeat", 30 * time.Millisecond, errors.New("interrupted"), "job's lease was lost to another consumer; not settling it here", "interrupted"},
		{"StaleAck", 10 * time.Second, nil, "finished job is owned by another consumer now (it was reclaimed and runs again there); not acknowledged here", nil},
		{"StaleRetry", 10 * time.Second, errors.New("again"), "failed job was no longer owned by this consumer; not rescheduled here", "again"},
		{"StaleDead", 10 * time.Second, consumer.Permanent(errors.New("never")), "job to dead-letter was no longer owned by this consumer; not dead-lettered here", "never"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			logger, logs := newCapture(slog.LevelInfo)
			b.cfg.Logger = logger
			b.cfg.VisibilityTimeout = 30 * time.Second
			b.cfg.HeartbeatInterval = tt.heartbeat
			id, job := b.enqueueTraced(t, "leased", nil)
			started := make(chan struct{}, 1)
			stolen := make(chan struct{})
			start(t, consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				started <- struct{}{}
				time.Sleep(handlerRun) // the run time the record must show
				if tt.heartbeat < time.Second {
					<-ctx.Done() // the heartbeat finds the theft
				} else {
					<-stolen
				}
				return tt.outcome
			})))
			recv(t, started, 5*time.Second, "the job to start")
			steal(t, b, id)
			close(stolen)
			rec := logs.wait(t, tt.msg)
			if rec.level != slog.LevelWarn {
				t.Errorf("%q at %v, want Warn", rec.msg, rec.level)
			}
			want := b.wantJob(id, job)
			want["duration_ms"] = atLeastMs(handlerRun)
			want["error_kind"] = "lease_lost"
			want["error"] = tt.error
			checkJobRecord(t, rec, want)
			logs.checkNoPayload(t)
		})
	}
}

func TestConsumer_Logs_Malformed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logger, logs := newCapture(slog.LevelDebug)
	b.cfg.Logger = logger
	// No type; the other fields are not decoded, so not logged.
	id, err := b.rdb.Do(context.Background(), "XADD", b.cfg.Stream, "*", "payload", secret, "job_id", "raw-id",
		"traceparent", testTraceParent, "lock_key", "raw-lock").Text()
	if err != nil {
		t.Fatal(err)
	}
	start(t, consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })))
	rec := logs.wait(t, "job dead-lettered")
	if rec.level != slog.LevelError {
		t.Errorf("dead-lettered at %v, want Error", rec.level)
	}
	checkJobRecord(t, rec, map[string]any{
		"stream": b.cfg.Stream, "group": b.cfg.Group, "consumer": b.cfg.Consumer, "entry_id": id,
		"job_id": "", "job_type": "", "idempotency_key": "", "attempt": 0, "lock_key": "", "trace_id": "",
		"duration_ms": 0, "error_kind": "malformed", "dead_reason": "malformed", "error": contains(`"type": is missing`),
	})
	logs.checkNoPayload(t)
}

func TestConsumer_Logs_TraceID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logger, logs := newCapture(slog.LevelDebug)
	b.cfg.Logger = logger
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	tests := map[string]struct{ header, want string }{
		"valid":       {testTraceParent, testTraceID},
		"empty":       {"", ""},
		"garbage":     {"not a traceparent", ""},
		"uppercase":   {"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""},
		"short":       {"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", ""},
		"zero-trace":  {"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		"zero-parent": {"00-" + id + "-0000000000000000-01", ""},
		"version-ff":  {"ff-" + id + "-00f067aa0ba902b7-01", ""},
		"v00-longer":  {testTraceParent + "-x", ""},
		"future":      {"01-" + id + "-00f067aa0ba902b7-01-later", id},
		"bad-dash":    {"00_" + id + "-00f067aa0ba902b7-01", ""},
	}
	for name, tt := range tests {
		b.enqueueTraced(t, name, func(j *stream.Job) { j.TraceParent = tt.header })
	}
	c := consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	r := start(t, c)
	waitFor(t, 5*time.Second, "every job done", func() bool { return len(logs.withMsg("job done")) == len(tests) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, rec := range logs.withMsg("job done") {
		got[rec.attrs["job_type"].String()] = rec.attrs["trace_id"].String()
	}
	for name, tt := range tests {
		if v, ok := got[name]; !ok || v != tt.want {
			t.Errorf("traceparent %q: trace_id %q (logged: %v), want %q", tt.header, v, ok, tt.want)
		}
	}
}

// BenchmarkConsumer_Jobs runs b.N successful jobs through a consumer whose
// logger is enabled for Info (the default) or Debug. At Info nothing is
// logged per job and the job's log attributes are never built, so its
// allocs/op must be those of a consumer without the Debug record.
func BenchmarkConsumer_Jobs(b *testing.B) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		b.Run(level.String(), func(b *testing.B) {
			m := miniredis.RunT(b)
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
			defer func() { _ = rdb.Close() }()
			const name = "{bench}:jobs"
			ctx := context.Background()
			prod := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
			for n := b.N; n > 0; n -= 500 {
				batch := make([]*stream.Job, min(n, 500))
				for i := range batch {
					batch[i] = &stream.Job{Type: "t", Payload: []byte(`{}`)}
				}
				if _, err := prod.EnqueueBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			logger := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: level}))
			c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c", Block: 20 * time.Millisecond,
				Concurrency: 16, Logger: logger}).
				Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
			b.ReportAllocs()
			b.ResetTimer()
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			for c.Stats().Acked < uint64(b.N) {
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := c.Shutdown(sctx); err != nil {
				b.Fatal(err)
			}
			<-done
		})
	}
}
