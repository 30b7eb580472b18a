package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Error texts that quote the payload (an error formatted with it, a panic
// with it as its value) are rewritten by Config.RedactError wherever
// Pelican stores or logs them: last_error, error_history, dead_error, the
// dead-letter hook's Error, and every log record.
func TestConsumer_RedactError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		handler func(j *stream.Job) error
	}{
		{"error then exhausted", func(j *stream.Job) error { return fmt.Errorf("bad card %s", j.Payload) }},
		{"panic", func(j *stream.Job) error { panic("bad card " + string(j.Payload)) }},
		{"permanent", func(j *stream.Job) error { return consumer.Permanent(fmt.Errorf("bad card %s", j.Payload)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			logger, logs := newCapture(slog.LevelDebug)
			b.cfg.Logger = logger
			b.cfg.MaxAttempts = 2
			b.cfg.Backoff = atOnce
			var sawJob atomic.Bool
			b.cfg.RedactError = func(j *stream.Job, text string) string {
				if j != nil && j.Type == "card" {
					sawJob.Store(true)
				}
				return strings.ReplaceAll(text, secret, "[redacted]")
			}
			job := &stream.Job{Type: "card", Payload: []byte(secret)}
			if _, err := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: b.cfg.Stream}).Enqueue(context.Background(), job); err != nil {
				t.Fatal(err)
			}
			var retried atomic.Bool
			start(t, consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				if j.Attempt > 0 {
					retried.Store(true)
					for _, e := range append([]string{j.LastError}, j.ErrorHistory...) {
						if strings.Contains(e, secret) {
							t.Errorf("retried job's error fields hold the payload: %q", e)
						}
					}
				}
				return tc.handler(j)
			})))
			waitFor(t, 5*time.Second, "the job dead-lettered", func() bool { return len(b.dead(t)) == 1 })
			d := b.dead(t)[0]
			for _, f := range []string{"dead_error", "last_error", "error_history"} {
				if v := field(d, f); strings.Contains(v, secret) || !strings.Contains(v, "[redacted]") {
					t.Errorf("dead letter %s = %q; want it redacted", f, v)
				}
			}
			if field(d, "payload") != secret {
				t.Errorf("dead letter payload = %q; the payload field itself is not an error text", field(d, "payload"))
			}
			logs.wait(t, "job dead-lettered")
			logs.checkNoPayload(t)
			if !sawJob.Load() {
				t.Error("RedactError never got the job")
			}
		})
	}
}

// Values a producer chose are bounded in log records: a 64 KB type makes no
// 64 KB log line. (64 KB, eight times the bound checked: a megabyte a field
// made the miniredis scripts take over 30 s under -race on a loaded machine.)
func TestConsumer_LogsBoundProducerValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logger, logs := newCapture(slog.LevelDebug)
	b.cfg.Logger = logger
	huge := strings.Repeat("x", 64<<10)
	job := &stream.Job{Type: huge, IdempotencyKey: huge, LockKey: huge, ID: huge}
	if _, err := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: b.cfg.Stream}).Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	start(t, consumer.New(b.rdb, b.cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		return consumer.Permanent(errors.New("no"))
	})))
	logs.wait(t, "job dead-lettered")
	for _, r := range logs.records() {
		if n := len(r.String()); n > 8<<10 {
			t.Errorf("log record %q is %d bytes; want producer values bounded", r.msg, n)
		}
	}
}
