package metrics_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// roundTrips counts the commands and pipelines a client sends, leaving out
// the handshake of new connections.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" { // a new connection's handshake
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() != "client" { // CLIENT SETINFO of a new connection's handshake
			r.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// setupQueue makes, on the shared Redis, a stream of 10 entries added a
// minute ago, a group "g" that read 4 of them and acknowledged 1 (3
// pending, the lowest idle for 30 s; lag 6), a group "late" created at an
// arbitrary ID (lag unknown to Redis), 3 delayed jobs and 2 dead letters.
func setupQueue(t *testing.T) (rdb *redis.Client, name string) {
	t.Helper()
	rdb = redistest.Shared(t)
	name = redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Stream, keys.Dead, keys.Delayed) })
	base := time.Now().Add(-time.Minute).UnixMilli()
	var ids []string
	for i := range 10 {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: name, ID: fmt.Sprintf("%d-%d", base, i), Values: []any{"type", "t"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rdb.XGroupCreate(ctx, name, "g", "0").Err())
	must(rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{name, ">"}, Count: 4}).Err())
	must(rdb.XAck(ctx, name, "g", ids[3]).Err())
	must(rdb.Do(ctx, "XCLAIM", name, "g", "c", 0, ids[0], "IDLE", 30000).Err())
	must(rdb.XGroupCreate(ctx, name, "late", ids[5]).Err())
	for i := range 3 {
		must(rdb.ZAdd(ctx, keys.Delayed, redis.Z{Score: float64(i), Member: fmt.Sprint(i)}).Err())
	}
	for range 2 {
		must(rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"dead_reason", "x"}}).Err())
	}
	return rdb, name
}

func TestCollector_Values(t *testing.T) {
	t.Parallel()
	rdb, name := setupQueue(t)
	ctx := context.Background()
	keys, _ := stream.KeysFor(name)
	col := metrics.NewCollector(rdb, metrics.CollectorConfig{
		Queues: []metrics.Queue{{Stream: name, Groups: []string{"g", "late", "missing"}}}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)

	xlen := rdb.XLen(ctx, name).Val()
	pend := rdb.XPending(ctx, name, "g").Val().Count
	pendLate := rdb.XPending(ctx, name, "late").Val().Count
	delayed := rdb.ZCard(ctx, keys.Delayed).Val()
	dead := rdb.XLen(ctx, keys.Dead).Val()
	if xlen != 10 || pend != 3 || pendLate != 0 || delayed != 3 || dead != 2 {
		t.Fatalf("setup: XLEN %d, XPENDING %d/%d, ZCARD %d, dead XLEN %d", xlen, pend, pendLate, delayed, dead)
	}
	want := fmt.Sprintf(`
# HELP pelican_collector_up 1 if the collector's last read of the queue state from Redis succeeded, else 0.
# TYPE pelican_collector_up gauge
pelican_collector_up 1
# HELP pelican_dead_letter_stream_length Entries in the dead-letter stream (XLEN).
# TYPE pelican_dead_letter_stream_length gauge
pelican_dead_letter_stream_length{stream=%[1]q} %[5]d
# HELP pelican_delayed_jobs Jobs waiting in the delayed set for a later attempt.
# TYPE pelican_delayed_jobs gauge
pelican_delayed_jobs{stream=%[1]q} %[4]d
# HELP pelican_group_lag Entries of the stream not yet delivered to the group (XINFO GROUPS lag).
# TYPE pelican_group_lag gauge
pelican_group_lag{group="g",stream=%[1]q} 6
# HELP pelican_pending_jobs Entries delivered to the group and not acknowledged (its pending entries list).
# TYPE pelican_pending_jobs gauge
pelican_pending_jobs{group="g",stream=%[1]q} %[3]d
pelican_pending_jobs{group="late",stream=%[1]q} 0
# HELP pelican_stream_length Entries in the job stream (XLEN).
# TYPE pelican_stream_length gauge
pelican_stream_length{stream=%[1]q} %[2]d
`, name, xlen, pend, delayed, dead)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pelican_collector_up",
		"pelican_dead_letter_stream_length", "pelican_delayed_jobs", "pelican_group_lag",
		"pelican_pending_jobs", "pelican_stream_length"); err != nil {
		t.Error(err)
	}
	// The lowest pending entry was added a minute ago and claimed with
	// IDLE 30 s; "late" has nothing pending, so no series.
	age := counterValue(t, reg, "pelican_oldest_pending_seconds", map[string]string{"group": "g"})
	if age < 60 || age > 70 {
		t.Errorf("oldest pending age = %vs, want 60 to 70", age)
	}
	idle := counterValue(t, reg, "pelican_oldest_pending_idle_seconds", map[string]string{"group": "g"})
	if idle < 30 || idle > 40 {
		t.Errorf("oldest pending idle = %vs, want 30 to 40", idle)
	}
	if n := testutil.CollectAndCount(col, "pelican_oldest_pending_seconds"); n != 1 {
		t.Errorf("%d oldest-pending series, want 1 (groups with pending entries only)", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: problems %v, error %v", problems, err)
	}
}

func TestCollector_Cache(t *testing.T) {
	t.Parallel()
	rdb, name := setupQueue(t)
	trips := &roundTrips{}
	rdb.AddHook(trips)
	col := metrics.NewCollector(rdb, metrics.CollectorConfig{CacheFor: time.Minute,
		Queues: []metrics.Queue{{Stream: name, Groups: []string{"g"}}}})
	var mu sync.Mutex
	now := time.Now()
	col.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)

	// Concurrent scrapes share one refresh.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if n := trips.n.Load(); n != 1 {
		t.Fatalf("9 scrapes within CacheFor made %d round trips, want 1", n)
	}
	// The cache serves the old value until CacheFor passes.
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: name, Values: []any{"type", "t"}}).Err(); err != nil {
		t.Fatal(err)
	}
	trips.n.Store(0)
	if got := counterValue(t, reg, "pelican_stream_length", nil); got != 10 {
		t.Errorf("cached stream length = %v, want 10", got)
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if got := counterValue(t, reg, "pelican_stream_length", nil); got != 11 {
		t.Errorf("stream length after CacheFor = %v, want 11", got)
	}
	if n := trips.n.Load(); n != 1 {
		t.Errorf("refresh made %d round trips, want 1 pipeline", n)
	}
}

func TestCollector_RedisDown(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	col := metrics.NewCollector(rdb, metrics.CollectorConfig{CacheFor: time.Nanosecond, Timeout: time.Second,
		Queues: []metrics.Queue{{Stream: "q", Groups: []string{"g"}}}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	// A stream that does not exist yet is empty, not an error.
	if got := counterValue(t, reg, "pelican_collector_up", nil); got != 1 {
		t.Fatalf("up = %v before the outage (error %v), want 1", got, col.Err())
	}
	if n := testutil.CollectAndCount(col, "pelican_pending_jobs"); n != 0 {
		t.Errorf("%d pending series for a missing group, want 0", n)
	}
	mr.Close()
	// The scrape does not fail (GatherAndCompare would report it).
	want := `
# HELP pelican_collector_errors_total Reads of the queue state from Redis that failed.
# TYPE pelican_collector_errors_total counter
pelican_collector_errors_total 1
# HELP pelican_collector_up 1 if the collector's last read of the queue state from Redis succeeded, else 0.
# TYPE pelican_collector_up gauge
pelican_collector_up 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pelican_collector_errors_total",
		"pelican_collector_up", "pelican_stream_length"); err != nil {
		t.Error(err)
	}
}

// TestCollector_partitioned: the Queues of a partitioned queue report each
// partition under its stream, and pelican_stream_partition_info maps the
// streams to their queue.
func TestCollector_partitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Shared(t)
	queue := strings.ReplaceAll(redistest.Name(t), ":", "-")
	qs, err := metrics.PartitionedQueue(queue, 3, "g")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range qs {
			redistest.DeleteKeys(rdb, q.Stream+"*")
		}
	})
	for i, q := range qs {
		for range i + 1 {
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Stream, Values: []any{"type", "t"}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	col := metrics.NewCollector(rdb, metrics.CollectorConfig{Queues: append(qs, metrics.Queue{Stream: queue + "-plain", Groups: []string{"g"}})})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	var want strings.Builder
	want.WriteString("# HELP pelican_stream_partition_info 1 for each stream that is a partition of a partitioned queue (stream.Partitions): its queue and partition index.\n# TYPE pelican_stream_partition_info gauge\n")
	for i, q := range qs {
		fmt.Fprintf(&want, "pelican_stream_partition_info{partition=%q,partitions=\"3\",queue=%q,stream=%q} 1\n", fmt.Sprint(i), queue, q.Stream)
	}
	want.WriteString("# HELP pelican_stream_length Entries in the job stream (XLEN).\n# TYPE pelican_stream_length gauge\n")
	fmt.Fprintf(&want, "pelican_stream_length{stream=%q} 0\n", queue+"-plain")
	for i, q := range qs {
		fmt.Fprintf(&want, "pelican_stream_length{stream=%q} %d\n", q.Stream, i+1)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "pelican_stream_partition_info", "pelican_stream_length"); err != nil {
		t.Error(err)
	}
	if _, err := metrics.PartitionedQueue("{bad}", 3, "g"); err == nil {
		t.Error("PartitionedQueue accepted a queue name with braces")
	}
}

// A bad CollectorConfig is an error naming the field, from Validate and
// from every Gather, and Redis is never touched (the client's address is
// unusable).
func TestCollector_badConfig(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, tc := range []struct {
		cfg  metrics.CollectorConfig
		want string
	}{
		{metrics.CollectorConfig{Queues: []metrics.Queue{{Stream: "s"}}}, "CollectorConfig.Queues[0] needs a Stream and Groups"},
		{metrics.CollectorConfig{Queues: []metrics.Queue{{Stream: "s", Groups: []string{"g"}}, {Stream: "a}b", Groups: []string{"g"}}}}, "CollectorConfig.Queues[1].Stream"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want an error naming %s", err, tc.want)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics.NewCollector(rdb, tc.cfg))
		if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Gather = %v, want the config error naming %s", err, tc.want)
		}
	}
}
