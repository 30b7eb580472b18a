package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// TestMetrics_ReclaimedAndLost: a consumer that vanished left three
// entries pending, one of which was then deleted. A live consumer reclaims
// the two others and reports the deleted one lost; the collector exports
// both counts, and the queue state (lag and pending from XINFO GROUPS, which
// only a real Redis reports right) once everything is done.
func TestMetrics_ReclaimedAndLost(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		id, err := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream}).
			Enqueue(ctx, &stream.Job{Type: "t", Payload: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := s.rdb.XGroupCreate(ctx, s.stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "gone",
		Streams: []string{s.stream, ">"}, Count: 3}).Err(); err != nil {
		t.Fatal(err)
	}
	// The three entries look abandoned long ago (idle an hour), so the
	// live consumer reclaims them at its first sweep while its visibility
	// timeout stays far longer than any run of its own: the counts do not
	// depend on how fast this machine is (with a short visibility timeout a
	// stalled run of the live consumer was reclaimed from itself as well).
	if err := s.rdb.Do(ctx, "XCLAIM", s.stream, "g", "gone", 0, ids[0], ids[1], ids[2],
		"IDLE", time.Hour.Milliseconds(), "JUSTID").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.rdb.XDel(ctx, s.stream, ids[0]).Err(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg, metrics.Config{})
	c := consumer.New(s.rdb, consumer.Config{Stream: s.stream, Group: "g", Consumer: "live",
		Block: 50 * time.Millisecond, VisibilityTimeout: time.Minute, SweepInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Use(m.Middleware()).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	reg.MustRegister(metrics.NewCollector(s.rdb, metrics.CollectorConfig{
		CacheFor:  time.Nanosecond,
		Queues:    []metrics.Queue{{Stream: s.stream, Groups: []string{"g"}}},
		Consumers: []metrics.ConsumerStats{{Stream: s.stream, Group: "g", Stats: c.Stats}},
	}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	eventually(t, 10*time.Second, func() (bool, string) {
		st := c.Stats()
		n := s.rdb.XLen(ctx, s.stream).Val() // acked entries are deleted after the ack
		return st.Acked == 4 && st.Lost == 1 && st.Reclaimed == 2 && s.pending("g") == 0 && n == 0, fmt.Sprintf("stats %+v, stream length %d", st, n)
	})

	labels := fmt.Sprintf(`group="g",stream=%q`, s.stream)
	want := fmt.Sprintf(`
# HELP pelican_group_lag Entries of the stream not yet delivered to the group (XINFO GROUPS lag).
# TYPE pelican_group_lag gauge
pelican_group_lag{%[1]s} 0
# HELP pelican_lost_total Pending entries the consumers found deleted or trimmed from the stream.
# TYPE pelican_lost_total counter
pelican_lost_total{%[1]s} 1
# HELP pelican_pending_jobs Entries delivered to the group and not acknowledged (its pending entries list).
# TYPE pelican_pending_jobs gauge
pelican_pending_jobs{%[1]s} 0
# HELP pelican_reclaimed_total Entries the consumers took over after the visibility timeout.
# TYPE pelican_reclaimed_total counter
pelican_reclaimed_total{%[1]s} 2
# HELP pelican_stream_length Entries in the job stream (XLEN).
# TYPE pelican_stream_length gauge
pelican_stream_length{stream=%[2]q} 0
# HELP pelican_jobs_processed_total Jobs that went through the handler chain, by the chain's outcome (ack, retry, snooze, dead_letter, abandoned, cancelled).
# TYPE pelican_jobs_processed_total counter
pelican_jobs_processed_total{outcome="abandoned",stream=%[2]q,type="t"} 0
pelican_jobs_processed_total{outcome="ack",stream=%[2]q,type="t"} 4
pelican_jobs_processed_total{outcome="cancelled",stream=%[2]q,type="t"} 0
pelican_jobs_processed_total{outcome="dead_letter",stream=%[2]q,type="t"} 0
pelican_jobs_processed_total{outcome="retry",stream=%[2]q,type="t"} 0
pelican_jobs_processed_total{outcome="snooze",stream=%[2]q,type="t"} 0
`, labels, s.stream)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pelican_group_lag", "pelican_lost_total",
		"pelican_pending_jobs", "pelican_reclaimed_total", "pelican_stream_length", "pelican_jobs_processed_total"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: problems %v, error %v", problems, err)
	}
}
