package integration

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// kedaValues are what KEDA's Redis Streams scaler (pkg/scalers/
// redis_streams_scaler.go) reads for each of its three triggers, with the
// same go-redis calls it makes: pendingEntriesCount is XPENDING <stream>
// <group> (the summary form) and its Count; lag is XINFO GROUPS <stream>
// and the Lag of the group named consumerGroup; streamLength (no
// consumerGroup given) is XLEN <stream>.
type kedaValues struct{ pending, lag, length int64 }

func kedaRead(t *testing.T, rdb redis.Cmdable, streamName, group string) kedaValues {
	t.Helper()
	ctx := context.Background()
	p, err := rdb.XPending(ctx, streamName, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	groups, err := rdb.XInfoGroups(ctx, streamName).Result()
	if err != nil {
		t.Fatal(err)
	}
	lag := int64(-1)
	for _, g := range groups {
		if g.Name == group {
			lag = g.Lag
		}
	}
	n, err := rdb.XLen(ctx, streamName).Result()
	if err != nil {
		t.Fatal(err)
	}
	return kedaValues{pending: p.Count, lag: lag, length: n}
}

// The values KEDA's Redis Streams scaler would read for a queue with every
// kind of job in it (new, in flight, retried later, scheduled, dead, done)
// against Pelican's collector and its idea of waiting work: KEDA's pending
// and lag equal Pelican's pending and lag, its stream length equals
// Pelican's; Pelican's waiting work (lag + pending + delayed) exceeds KEDA's
// lag + pending by exactly the delayed set, which no KEDA trigger sees, and
// the dead letters are in none of them. Red check: the collector reporting
// XINFO GROUPS' entries-read as the lag makes the lag comparison fail.
func TestKEDA_scalerValues(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name := "{" + redistest.Name(t) + "}:jobs"
	keys, _ := stream.KeysFor(name)
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Stream, keys.Dead, keys.Delayed) })
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	enqueue := func(typ string, n int) {
		t.Helper()
		for range n {
			j, _ := stream.NewJob(typ, nil)
			if _, err := p.Enqueue(ctx, j); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Settled by a Pelican consumer: 3 done, 2 retried in an hour, 1 dead.
	enqueue("ok", 3)
	enqueue("retry", 2)
	enqueue("dead", 1)
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "workers", Consumer: "pelican", Block: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			switch job.Type {
			case "retry":
				return consumer.Retry(time.Hour, errors.New("later"))
			case "dead":
				return consumer.Dead("", errors.New("never"))
			}
			return nil
		}))
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(runCtx) }()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := c.WaitIdle(waitCtx); err != nil {
		t.Fatal(err)
	}
	cancel()
	stop()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Acked != 3 || st.Retried != 2 || st.DeadLettered != 1 {
		t.Fatalf("stats %+v, want 3 acked, 2 retried, 1 dead", st)
	}
	// Then: 5 new jobs, 2 of them delivered to a worker that has not
	// settled them, and 1 job scheduled in an hour.
	enqueue("new", 5)
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "busy", Streams: []string{name, ">"}, Count: 2, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	later, _ := stream.NewJob("later", nil)
	if err := p.EnqueueIn(ctx, later, time.Hour); err != nil {
		t.Fatal(err)
	}

	keda := kedaRead(t, rdb, name, "workers")
	col := metrics.NewCollector(rdb, metrics.CollectorConfig{Queues: []metrics.Queue{{Stream: name, Groups: []string{"workers"}}}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	got := gather(t, reg)
	pending, lag, length := got["pelican_pending_jobs"], got["pelican_group_lag"], got["pelican_stream_length"]
	delayed, dead := got["pelican_delayed_jobs"], got["pelican_dead_letter_stream_length"]
	t.Logf("KEDA: pending %d, lag %d, stream length %d; Pelican: pending %v, lag %v, length %v, delayed %v, dead letters %v",
		keda.pending, keda.lag, keda.length, pending, lag, length, delayed, dead)

	if float64(keda.pending) != pending || pending != 2 {
		t.Errorf("pending: KEDA %d, Pelican %v, want both 2", keda.pending, pending)
	}
	if float64(keda.lag) != lag || lag != 3 {
		t.Errorf("lag: KEDA %d, Pelican %v, want both 3", keda.lag, lag)
	}
	if float64(keda.length) != length {
		t.Errorf("stream length: KEDA %d, Pelican %v", keda.length, length)
	}
	// Settled entries still in the stream (deleted in batches, see
	// Config.KeepSettled) count in XLEN: at least lag + pending.
	if keda.length < keda.lag+keda.pending {
		t.Errorf("stream length %d below lag %d + pending %d", keda.length, keda.lag, keda.pending)
	}
	waiting := lag + pending + delayed // Pelican's waiting work
	if delayed != 3 || waiting-float64(keda.lag+keda.pending) != delayed {
		t.Errorf("waiting work %v, KEDA lag + pending %d, delayed %v: want the difference to be the 3 delayed jobs", waiting, keda.lag+keda.pending, delayed)
	}
	if dead != 1 {
		t.Errorf("dead letters %v, want 1 (in no KEDA trigger)", dead)
	}
}

// gather returns the value of each single-series gauge in reg.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil {
				out[mf.GetName()] += g.GetValue()
			}
		}
	}
	return out
}
