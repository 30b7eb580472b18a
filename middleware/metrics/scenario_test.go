package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/internal/poll"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/leakcheck"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, 5*time.Second, "pelican/consumer.(*Consumer)", "pelican/claim.")
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// waitFor polls cond every 10 ms until it holds, failing the test with
// what() after timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() bool, what func() string) {
	t.Helper()
	poll.Until(t, timeout, func() (bool, string) {
		if cond() {
			return true, ""
		}
		return false, what()
	})
}

// expected renders counter series of name with the given help from
// values keyed by their label pairs ("stream=\"s\",type=\"t\"").
func expected(name, help string, values map[string]float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s{%s} %v\n", name, k, values[k])
	}
	return b.String()
}

// TestMetrics_Scenario runs a real consumer with the metrics, lock,
// idempotency and retry middleware through acks, retries, dead letters, a
// lock conflict, a lost lock and an idempotency hit, and checks every count.
func TestMetrics_Scenario(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	t.Cleanup(func() {
		rdb.Del(context.Background(), keys.Stream)
		redistest.DeleteKeys(rdb, "{"+name+"}:*") // the queue's locks and records too
	})
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg, metrics.Config{})

	holderStarted, releaseHolder := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(releaseHolder) }) }
	lostStarted := make(chan struct{})
	mux := consumer.NewMux().
		HandleFunc("ok", func(context.Context, *stream.Job) error { return nil }).
		HandleFunc("flaky", func(_ context.Context, job *stream.Job) error {
			if job.Attempt == 0 {
				return errors.New("flaky")
			}
			return nil
		}).
		HandleFunc("permanent", func(context.Context, *stream.Job) error {
			return consumer.Permanent(errors.New("bad input"))
		}).
		HandleFunc("exhausting", func(context.Context, *stream.Job) error { return errors.New("down") }).
		HandleFunc("locked", func(ctx context.Context, job *stream.Job) error {
			if job.Headers["hold"] == "1" {
				close(holderStarted)
				<-releaseHolder
			}
			return nil
		}).
		HandleFunc("idem", func(context.Context, *stream.Job) error { return nil }).
		HandleFunc("lost", func(ctx context.Context, job *stream.Job) error {
			if job.Attempt > 0 {
				return nil
			}
			close(lostStarted)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Concurrency: 8,
		Block: 50 * time.Millisecond, PromoteInterval: 20 * time.Millisecond, Logger: quiet,
		Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond}}).
		Use(m.Middleware(),
			middleware.Lock(rdb, middleware.LockConfig{
				// A TTL long enough that a stalled watchdog (beside busy loops)
				// cannot let the holder's lock expire before the conflict.
				ConflictDelay: time.Second, TTL: 3 * time.Second, OnConflict: m.LockConflict}),
			middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}),
				middleware.IdempotencyConfig{OnHit: m.IdempotencyHit, Logger: quiet}),
			middleware.Retry(middleware.RetryConfig{}),
			m.LockLost(),
		).Handle(mux)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		release() // if the test failed before
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	enqueue := func(typ string, edit func(*stream.Job)) {
		t.Helper()
		j := &stream.Job{Type: typ, Payload: []byte(`{}`)}
		if edit != nil {
			edit(j)
		}
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		enqueue("ok", nil)
	}
	enqueue("flaky", nil)
	enqueue("flaky", nil)
	enqueue("permanent", nil)
	enqueue("exhausting", func(j *stream.Job) { j.MaxAttempts = 2 })
	// A lock conflict: the holder runs until the other job with its key
	// has been snoozed once.
	enqueue("locked", func(j *stream.Job) { j.LockKey = "L"; j.Headers = map[string]string{"hold": "1"} })
	<-holderStarted
	enqueue("locked", func(j *stream.Job) { j.LockKey = "L" })
	conflicts := func() float64 { return counterValue(t, reg, "pelican_lock_conflicts_total", nil) }
	waitFor(t, 10*time.Second, func() bool { return conflicts() >= 1 },
		func() string { return fmt.Sprintf("%v lock conflicts", conflicts()) })
	release()
	// An idempotency hit: the same key again once the first is done.
	enqueue("idem", func(j *stream.Job) { j.IdempotencyKey = "K" })
	idemAcks := func() float64 {
		return counterValue(t, reg, "pelican_jobs_processed_total", map[string]string{"type": "idem", "outcome": "ack"})
	}
	waitFor(t, 10*time.Second, func() bool { return idemAcks() == 1 }, func() string { return "first idem job not acked" })
	enqueue("idem", func(j *stream.Job) { j.IdempotencyKey = "K" })
	// A lost lock: its key is deleted while the job runs.
	enqueue("lost", func(j *stream.Job) { j.LockKey = "LL" })
	<-lostStarted
	if err := rdb.Del(ctx, keys.Lock+"{LL}").Err(); err != nil {
		t.Fatal(err)
	}

	const acks, dead, retried, snoozed = 5 + 2 + 2 + 2 + 1, 2, 4, 1
	waitFor(t, 20*time.Second, func() bool {
		st := c.Stats()
		return st.Acked == acks && st.DeadLettered == dead && st.Retried == retried && st.Snoozed == snoozed
	}, func() string { return fmt.Sprintf("stats %+v", c.Stats()) })

	st := func(typ string) string { return fmt.Sprintf("stream=%q,type=%q", name, typ) }
	processed := map[string]float64{}
	for _, typ := range []string{"ok", "flaky", "permanent", "exhausting", "locked", "idem", "lost"} {
		for _, o := range []string{"abandoned", "ack", "cancelled", "dead_letter", "retry", "snooze"} {
			processed[fmt.Sprintf("outcome=%q,%s", o, st(typ))] = 0
		}
	}
	for k, v := range map[string]float64{
		`outcome="ack",` + st("ok"):                 5,
		`outcome="retry",` + st("flaky"):            2,
		`outcome="ack",` + st("flaky"):              2,
		`outcome="dead_letter",` + st("permanent"):  1,
		`outcome="retry",` + st("exhausting"):       1,
		`outcome="dead_letter",` + st("exhausting"): 1,
		`outcome="ack",` + st("locked"):             2,
		`outcome="snooze",` + st("locked"):          1,
		`outcome="ack",` + st("idem"):               2,
		`outcome="retry",` + st("lost"):             1,
		`outcome="ack",` + st("lost"):               1,
	} {
		processed[k] = v
	}
	perType := func(nonzero map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for _, typ := range []string{"ok", "flaky", "permanent", "exhausting", "locked", "idem", "lost"} {
			out[st(typ)] = nonzero[typ]
		}
		return out
	}
	want := expected("pelican_jobs_processed_total",
		"Jobs that went through the handler chain, by the chain's outcome (ack, retry, snooze, dead_letter, abandoned, cancelled).", processed) +
		expected("pelican_retries_total", "Jobs scheduled for another attempt.",
			perType(map[string]float64{"flaky": 2, "exhausting": 1, "lost": 1})) +
		expected("pelican_dead_letters_total", "Jobs dead-lettered by the handler chain, by reason.", map[string]float64{
			`reason="permanent",` + st("permanent"):  1,
			`reason="exhausted",` + st("exhausting"): 1,
		}) +
		expected("pelican_lock_conflicts_total", "Jobs snoozed because their lock was held elsewhere.", map[string]float64{"": 1}) +
		expected("pelican_idempotency_hits_total", "Jobs acknowledged without running because their operation had completed.",
			perType(map[string]float64{"idem": 1})) +
		expected("pelican_locks_lost_total", "Jobs whose lock was lost while they ran.", perType(map[string]float64{"lost": 1}))
	want = strings.ReplaceAll(want, "pelican_lock_conflicts_total{} ", "pelican_lock_conflicts_total ")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pelican_jobs_processed_total",
		"pelican_retries_total", "pelican_dead_letters_total", "pelican_lock_conflicts_total",
		"pelican_idempotency_hits_total", "pelican_locks_lost_total"); err != nil {
		t.Error(err)
	}
	// Every run was timed, and every ack has a latency.
	runs := map[string]uint64{"ok": 5, "flaky": 4, "permanent": 1, "exhausting": 2, "locked": 3, "idem": 2, "lost": 2}
	ackd := map[string]uint64{"ok": 5, "flaky": 2, "locked": 2, "idem": 2, "lost": 1}
	for typ, n := range runs {
		labels := map[string]string{"type": typ}
		if got := histCount(t, reg, "pelican_job_duration_seconds", labels); got != n {
			t.Errorf("duration observations of %s = %d, want %d", typ, got, n)
		}
		if got := histCount(t, reg, "pelican_job_wait_seconds", labels); got != n {
			t.Errorf("wait observations of %s = %d, want %d", typ, got, n)
		}
		if got := histCount(t, reg, "pelican_job_latency_seconds", labels); got != ackd[typ] {
			t.Errorf("latency observations of %s = %d, want %d", typ, got, ackd[typ])
		}
		if got := counterValue(t, reg, "pelican_jobs_in_flight", labels); got != 0 {
			t.Errorf("in flight of %s = %v, want 0", typ, got)
		}
	}

	// The collector agrees with Redis, and the exposition lints clean.
	col := metrics.NewCollector(rdb, metrics.CollectorConfig{
		Queues:    []metrics.Queue{{Stream: name, Groups: []string{"g"}}},
		Consumers: []metrics.ConsumerStats{{Stream: name, Group: "g", Stats: c.Stats}},
	})
	reg.MustRegister(col)
	xlen := rdb.XLen(ctx, name).Val()
	sg := fmt.Sprintf("group=\"g\",stream=%q", name)
	wantQueue := fmt.Sprintf(`
# HELP pelican_dead_letter_stream_length Entries in the dead-letter stream (XLEN).
# TYPE pelican_dead_letter_stream_length gauge
pelican_dead_letter_stream_length{stream=%[1]q} 2
# HELP pelican_delayed_jobs Jobs waiting in the delayed set for a later attempt.
# TYPE pelican_delayed_jobs gauge
pelican_delayed_jobs{stream=%[1]q} 0
# HELP pelican_pending_jobs Entries delivered to the group and not acknowledged (its pending entries list).
# TYPE pelican_pending_jobs gauge
pelican_pending_jobs{%[2]s} 0
# HELP pelican_stream_length Entries in the job stream (XLEN).
# TYPE pelican_stream_length gauge
pelican_stream_length{stream=%[1]q} %[3]d
# HELP pelican_settled_total Settlements the consumers applied, by outcome (ack, retry, dead_letter).
# TYPE pelican_settled_total counter
pelican_settled_total{group="g",outcome="ack",stream=%[1]q} %[4]d
pelican_settled_total{group="g",outcome="dead_letter",stream=%[1]q} %[5]d
pelican_settled_total{group="g",outcome="retry",stream=%[1]q} %[6]d
`, name, sg, xlen, acks, dead, retried)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantQueue), "pelican_dead_letter_stream_length",
		"pelican_delayed_jobs", "pelican_pending_jobs", "pelican_stream_length", "pelican_settled_total"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: problems %v, error %v", problems, err)
	}
}

// counterValue returns the value of the counter or gauge series of name
// whose labels include labels (all must match exactly one series).
func counterValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	var found []float64
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.Metric {
			have := map[string]string{}
			for _, l := range s.Label {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case s.Counter != nil:
				found = append(found, s.Counter.GetValue())
			case s.Gauge != nil:
				found = append(found, s.Gauge.GetValue())
			}
		}
	}
	if len(found) > 1 {
		t.Fatalf("%s%v matches %d series", name, labels, len(found))
	}
	if len(found) == 0 {
		return 0
	}
	return found[0]
}

// histCount returns the sample count of the histogram series of name whose
// labels include labels.
func histCount(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.Metric {
			for _, l := range s.Label {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			n += s.Histogram.GetSampleCount()
		}
	}
	return n
}
