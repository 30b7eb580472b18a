package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

func setup(t *testing.T, cfg metrics.Config) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	return metrics.New(reg, cfg), reg
}

// testJob returns a job of type typ on stream "s" whose entry was added
// ago.
func testJob(typ string, ago time.Duration) *stream.Job {
	now := time.Now()
	return &stream.Job{ID: "j", Type: typ, Stream: "s", EntryID: fmt.Sprintf("%d-0", now.Add(-ago).UnixMilli()),
		CreatedAt: now.Add(-2 * ago)}
}

func TestMetrics_Middleware(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	shutdown, cancelShutdown := context.WithCancelCause(context.Background())
	cancelShutdown(consumer.ErrShutdown)
	leaseLost, cancelLease := context.WithCancelCause(context.Background())
	cancelLease(consumer.ErrLeaseLost)
	cancelled, cancelOp := context.WithCancelCause(context.Background())
	cancelOp(consumer.ErrCancelled)
	tests := []struct {
		name            string
		ctx             context.Context
		attempt         int
		err             error
		outcome, reason string
	}{
		{name: "nil", err: nil, outcome: "ack"},
		{name: "retry", err: consumer.Retry(time.Second, errBoom), outcome: "retry"},
		{name: "retry last attempt", attempt: 2, err: consumer.Retry(time.Second, errBoom), outcome: "dead_letter", reason: "exhausted"},
		{name: "snooze", err: consumer.Snooze(time.Second), outcome: "snooze"},
		{name: "snooze last attempt", attempt: 2, err: consumer.Snooze(time.Second), outcome: "snooze"},
		{name: "dead", err: consumer.Dead("expired", errBoom), outcome: "dead_letter", reason: "expired"},
		{name: "permanent", err: consumer.Permanent(errBoom), outcome: "dead_letter", reason: "permanent"},
		{name: "payload", err: fmt.Errorf("decode: %w", stream.ErrPayload), outcome: "dead_letter", reason: "permanent"},
		{name: "panic error", err: &consumer.PanicError{Value: 1}, outcome: "dead_letter", reason: "panic"},
		{name: "plain", err: errBoom, outcome: "retry"},
		{name: "plain last attempt", attempt: 2, err: errBoom, outcome: "dead_letter", reason: "exhausted"},
		{name: "retry after", err: consumer.RetryAfter(time.Second, errBoom), outcome: "retry"},
		{name: "shutdown error", ctx: shutdown, err: errBoom, outcome: "abandoned"},
		{name: "shutdown nil", ctx: shutdown, err: nil, outcome: "ack"},
		{name: "lease lost nil", ctx: leaseLost, err: nil, outcome: "abandoned"},
		{name: "lease lost error", ctx: leaseLost, err: errBoom, outcome: "abandoned"},
		{name: "cancelled error", ctx: cancelled, err: errBoom, outcome: "cancelled"},
		{name: "cancelled nil", ctx: cancelled, err: nil, outcome: "ack"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, reg := setup(t, metrics.Config{})
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			job := testJob("email", time.Minute)
			job.Attempt, job.AttemptLimit = tt.attempt, 3 // the consumer fills the limit in
			h := m.Middleware()(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return tt.err }))
			if err := h.Process(ctx, job); err != tt.err {
				t.Fatalf("Process returned %v, want the handler's error %v", err, tt.err)
			}
			var want strings.Builder
			want.WriteString("# HELP pelican_jobs_processed_total Jobs that went through the handler chain, by the chain's outcome (ack, retry, snooze, dead_letter, abandoned, cancelled).\n# TYPE pelican_jobs_processed_total counter\n")
			for _, o := range []string{"abandoned", "ack", "cancelled", "dead_letter", "retry", "snooze"} {
				v := 0
				if o == tt.outcome {
					v = 1
				}
				fmt.Fprintf(&want, "pelican_jobs_processed_total{outcome=%q,stream=\"s\",type=\"email\"} %d\n", o, v)
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "pelican_jobs_processed_total"); err != nil {
				t.Error(err)
			}
			dead := 0
			if tt.reason != "" {
				dead = 1
				if got := testutil.ToFloat64(deadLetters(t, reg, tt.reason)); got != 1 {
					t.Errorf("dead letters{reason=%q} = %v, want 1", tt.reason, got)
				}
			}
			if n := seriesCount(t, reg, "pelican_dead_letters_total"); n != dead {
				t.Errorf("%d dead-letter series, want %d", n, dead)
			}
			retries := 0.0
			if tt.outcome == "retry" {
				retries = 1
			}
			if got := gathered(t, reg, "pelican_retries_total"); got != retries {
				t.Errorf("retries = %v, want %v", got, retries)
			}
			latency := 0.0
			if tt.outcome == "ack" {
				latency = 1
			}
			if got := gathered(t, reg, "pelican_job_latency_seconds"); got != latency {
				t.Errorf("latency observations = %v, want %v", got, latency)
			}
			if got := gathered(t, reg, "pelican_job_duration_seconds"); got != 1 {
				t.Errorf("duration observations = %v, want 1", got)
			}
		})
	}
}

// gathered returns the value of the single series of name in reg: a
// counter's or gauge's value, a histogram's sample count.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		if len(mf.Metric) != 1 {
			t.Fatalf("%s has %d series, want 1", name, len(mf.Metric))
		}
		m := mf.Metric[0]
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// seriesCount returns the number of series of name in reg.
func seriesCount(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.Metric)
		}
	}
	return 0
}

func deadLetters(t *testing.T, reg *prometheus.Registry, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pelican_dead_letters_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x", Help: "x"}, m.Counter.GetValue)
				}
			}
		}
	}
	t.Fatalf("no pelican_dead_letters_total{reason=%q}", reason)
	return nil
}

func TestMetrics_MiddlewareTimes(t *testing.T) {
	t.Parallel()
	m, reg := setup(t, metrics.Config{})
	job := testJob("email", 10*time.Second) // entry added 10 s ago, created 20 s ago
	started := make(chan struct{})
	release := make(chan struct{})
	h := m.Middleware()(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
		close(started)
		<-release
		return nil
	}))
	done := make(chan error)
	go func() { done <- h.Process(context.Background(), job) }()
	<-started
	if got := gathered(t, reg, "pelican_jobs_in_flight"); got != 1 {
		t.Errorf("in flight while running = %v, want 1", got)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := gathered(t, reg, "pelican_jobs_in_flight"); got != 0 {
		t.Errorf("in flight after = %v, want 0", got)
	}
	mfs, _ := reg.Gather()
	sums := map[string]float64{}
	for _, mf := range mfs {
		if h := mf.Metric[0].Histogram; h != nil {
			sums[mf.GetName()] = h.GetSampleSum()
		}
	}
	if s := sums["pelican_job_wait_seconds"]; s < 10 || s > 11 {
		t.Errorf("wait = %vs, want about 10s", s)
	}
	if s := sums["pelican_job_latency_seconds"]; s < 20 || s > 21 {
		t.Errorf("latency = %vs, want about 20s", s)
	}
	if s := sums["pelican_job_duration_seconds"]; s <= 0 || s > 1 {
		t.Errorf("duration = %vs, want under 1s", s)
	}
}

func TestMetrics_MiddlewarePanic(t *testing.T) {
	t.Parallel()
	m, reg := setup(t, metrics.Config{})
	h := m.Middleware()(consumer.HandlerFunc(func(context.Context, *stream.Job) error { panic("oops") }))
	func() {
		defer func() {
			if r := recover(); r != "oops" {
				t.Errorf("recovered %v, want the handler's panic to pass on", r)
			}
		}()
		_ = h.Process(context.Background(), testJob("email", 0))
	}()
	if got := testutil.ToFloat64(deadLetters(t, reg, "panic")); got != 1 {
		t.Errorf("dead letters{reason=panic} = %v, want 1", got)
	}
	if got := gathered(t, reg, "pelican_jobs_in_flight"); got != 0 {
		t.Errorf("in flight after a panic = %v, want 0", got)
	}
}

func TestMetrics_MaxTypes(t *testing.T) {
	t.Parallel()
	m, reg := setup(t, metrics.Config{MaxTypes: 2})
	h := m.Middleware()(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	for _, typ := range []string{"a", "b", "c", "d", "a"} {
		_ = h.Process(context.Background(), testJob(typ, 0))
	}
	want := `
# HELP pelican_retries_total Jobs scheduled for another attempt.
# TYPE pelican_retries_total counter
pelican_retries_total{stream="s",type="a"} 0
pelican_retries_total{stream="s",type="b"} 0
pelican_retries_total{stream="s",type="other"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pelican_retries_total"); err != nil {
		t.Error(err)
	}
	acks := map[string]float64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "pelican_jobs_processed_total" {
			continue
		}
		for _, s := range mf.Metric {
			var typ, outcome string
			for _, l := range s.Label {
				switch l.GetName() {
				case "type":
					typ = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			if outcome == "ack" {
				acks[typ] = s.Counter.GetValue()
			}
		}
	}
	if fmt.Sprint(acks) != "map[a:2 b:1 other:2]" {
		t.Errorf("acks by type = %v, want map[a:2 b:1 other:2]", acks)
	}
}

func TestMetrics_Hooks(t *testing.T) {
	t.Parallel()
	m, reg := setup(t, metrics.Config{})
	m.LockConflict("customer:1")
	m.LockConflict("customer:2")
	m.IdempotencyHit(context.Background(), testJob("email", 0), nil)

	lost := m.LockLost()(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		return context.Cause(ctx)
	}))
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("middleware: lock %q: %w", "k", lockx.ErrLockLost))
	_ = lost.Process(ctx, testJob("email", 0))
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	cancel2(consumer.ErrShutdown) // not a lost lock
	_ = lost.Process(ctx2, testJob("email", 0))
	_ = lost.Process(context.Background(), testJob("email", 0))

	want := `
# HELP pelican_idempotency_hits_total Jobs acknowledged without running because their operation had completed.
# TYPE pelican_idempotency_hits_total counter
pelican_idempotency_hits_total{stream="s",type="email"} 1
# HELP pelican_lock_conflicts_total Jobs snoozed because their lock was held elsewhere.
# TYPE pelican_lock_conflicts_total counter
pelican_lock_conflicts_total 2
# HELP pelican_locks_lost_total Jobs whose lock was lost while they ran.
# TYPE pelican_locks_lost_total counter
pelican_locks_lost_total{stream="s",type="email"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"pelican_idempotency_hits_total", "pelican_lock_conflicts_total", "pelican_locks_lost_total"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
