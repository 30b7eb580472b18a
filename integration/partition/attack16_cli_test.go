package partition

// Outside tests (attack16): the CLI's --partitions (stats, dlq ls, replay,
// purge) and metrics.PartitionedQueue treat a partitioned queue as one.
// Partitions are plain streams, so a private single redis-server serves.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

var (
	a16CLIOnce sync.Once
	a16CLIPath string
	a16CLIErr  error
)

func a16CLI(t *testing.T) string {
	t.Helper()
	a16CLIOnce.Do(func() {
		dir, err := os.MkdirTemp("", "a16cli")
		if err != nil {
			a16CLIErr = err
			return
		}
		a16CLIPath = filepath.Join(dir, "pelican")
		out, err := exec.Command("go", "build", "-o", a16CLIPath, "github.com/pelicanqueue/pelican/cmd/pelican").CombinedOutput()
		if err != nil {
			a16CLIErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if a16CLIErr != nil {
		t.Fatal(a16CLIErr)
	}
	return a16CLIPath
}

func a16Run(t *testing.T, addr string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(a16CLI(t), append([]string{"--redis", "redis://" + addr + "/0"}, args...)...)
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// a16Consume runs a pool over the partitions until every job has settled:
// type "bad" fails permanently (dead letter), others succeed.
func a16Consume(t *testing.T, rdb redis.UniversalClient, streams []string, wantDead int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, s := range streams {
		pool.Add(consumer.Config{Stream: s, Group: group, Consumer: "c", Block: 100 * time.Millisecond}, consumer.QueueOptions{}).
			Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				if j.Type == "bad" {
					return consumer.Permanent(errors.New("nope"))
				}
				return nil
			}))
	}
	done := make(chan error, 1)
	go func() { done <- pool.Run(ctx) }()
	poll.Until(t, 30*time.Second, func() (bool, string) {
		var dead, left int64
		for _, s := range streams {
			k, _ := stream.KeysFor(s)
			d, _ := rdb.XLen(ctx, k.Dead).Result()
			dead += d
			p, _ := rdb.XPending(ctx, s, group).Result()
			n, _ := rdb.XLen(ctx, s).Result()
			if p != nil {
				left += p.Count
			}
			left += n
		}
		return dead == wantDead && left == 0, fmt.Sprintf("%d dead (want %d), %d left", dead, wantDead, left)
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("pool: %v", err)
	}
}

func a16DeadByPartition(t *testing.T, rdb redis.UniversalClient, streams []string) map[string][]redis.XMessage {
	t.Helper()
	out := map[string][]redis.XMessage{}
	for _, s := range streams {
		k, _ := stream.KeysFor(s)
		msgs, err := rdb.XRange(context.Background(), k.Dead, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		out[s] = msgs
	}
	return out
}

// a16Setup starts a server with a 6-partition queue holding 30 dead letters
// (jobs j-0, j-2, ... j-58, routed by job ID).
func a16Setup(t *testing.T) (*redistest.Server, *redis.Client, string, []string) {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	ctx := context.Background()
	const n = 6
	queue := "a16q.x:" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10) // a "." and a ":" in the name
	p, err := stream.NewPartitionedProducer(rdb, stream.PartitionedProducerConfig{Queue: queue, Partitions: n, Key: byID})
	if err != nil {
		t.Fatal(err)
	}
	streams := p.Streams()
	var jobs []*stream.Job
	for i := range 60 {
		typ := "good"
		if i%2 == 0 {
			typ = "bad"
		}
		jobs = append(jobs, &stream.Job{ID: "j-" + strconv.Itoa(i), Type: typ, Payload: []byte(`{}`)})
	}
	if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	a16Consume(t, rdb, streams, 30)
	return srv, rdb, queue, streams
}

// TestAttack16_replayLimitAcrossPartitions: "--limit: replay at most this
// many jobs (0: all); the next run continues after them".
func TestAttack16_replayLimitAcrossPartitions(t *testing.T) {
	t.Parallel()
	srv, rdb, queue, streams := a16Setup(t)
	// ls --limit 4: "list at most this many entries".
	out, code := a16Run(t, srv.Addr(), "dlq", "ls", queue, "--partitions", strconv.Itoa(len(streams)), "--limit", "4", "-o", "json")
	if code != 0 {
		t.Fatalf("dlq ls --limit 4: exit %d: %s", code, out)
	}
	shown := 0
	for i := range 60 {
		if strings.Contains(out, `"j-`+strconv.Itoa(i)+`"`) {
			shown++
		}
	}
	if shown > 4 {
		t.Errorf("dlq ls --partitions %d --limit 4 lists %d entries, want at most 4", len(streams), shown)
	}
	out, code = a16Run(t, srv.Addr(), "dlq", "replay", queue, "--partitions", strconv.Itoa(len(streams)), "--yes", "--rate", "0", "--limit", "7")
	if code != 0 {
		t.Fatalf("dlq replay --limit 7: exit %d: %s", code, out)
	}
	left := 0
	for _, m := range a16DeadByPartition(t, rdb, streams) {
		left += len(m)
	}
	if 30-left > 7 {
		t.Errorf("dlq replay --partitions %d --limit 7 replayed %d jobs, want at most 7", len(streams), 30-left)
	}
}

// TestAttack16_cliAndMetric: stats, dlq ls, replay (limited, then the rest)
// and purge over a 6-partition queue, and the collector's series.
func TestAttack16_cliAndMetric(t *testing.T) {
	t.Parallel()
	srv, rdb, queue, streams := a16Setup(t)
	ctx := context.Background()
	const n = 6

	// stats --partitions: the dead letters summed.
	out, code := a16Run(t, srv.Addr(), "stats", queue, "--partitions", strconv.Itoa(n), "-o", "json")
	if code != 0 {
		t.Fatalf("stats: exit %d: %s", code, out)
	}
	var st any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stats json: %v: %s", err, out)
	}
	if !strings.Contains(out, "30") {
		t.Errorf("stats of the queue does not show its 30 dead letters: %s", out)
	}
	// stats without arguments groups the partitions by queue.
	out, code = a16Run(t, srv.Addr(), "stats")
	if code != 0 || !strings.Contains(out, queue) {
		t.Errorf("stats (no args): exit %d, queue %q not shown: %s", code, queue, out)
	}

	// dlq ls --partitions: every dead letter, once.
	out, code = a16Run(t, srv.Addr(), "dlq", "ls", queue, "--partitions", strconv.Itoa(n), "--limit", "1000", "-o", "json")
	if code != 0 {
		t.Fatalf("dlq ls: exit %d: %s", code, out)
	}
	seen := 0
	for i := range 60 {
		if i%2 == 0 && strings.Contains(out, `"j-`+strconv.Itoa(i)+`"`) {
			seen++
		}
	}
	if seen != 30 {
		t.Errorf("dlq ls --partitions shows %d of the 30 dead jobs: %.1500s", seen, out)
	}

	// The metric: 6 info series, dead letters summing to 30.
	qs, err := metrics.PartitionedQueue(queue, n, group)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(rdb, metrics.CollectorConfig{Queues: qs}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var info int
	var dead float64
	for _, mf := range mfs {
		switch mf.GetName() {
		case "pelican_stream_partition_info":
			for _, m := range mf.GetMetric() {
				lab := map[string]string{}
				for _, l := range m.GetLabel() {
					lab[l.GetName()] = l.GetValue()
				}
				i, _ := strconv.Atoi(lab["partition"])
				if lab["queue"] != queue || lab["partitions"] != strconv.Itoa(n) || lab["stream"] != streams[i] || m.GetGauge().GetValue() != 1 {
					t.Errorf("partition info %v", lab)
				}
				info++
			}
		case "pelican_dead_letter_stream_length":
			for _, m := range mf.GetMetric() {
				dead += m.GetGauge().GetValue()
			}
		}
	}
	if info != n || dead != 30 {
		t.Errorf("metrics: %d partition info series (want %d), dead letters sum %v (want 30)", info, n, dead)
	}

	// replay --limit 7: at most 7 jobs in all ("replay at most this many jobs").
	out, code = a16Run(t, srv.Addr(), "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "0", "--limit", "7")
	if code != 0 {
		t.Fatalf("dlq replay --limit 7: exit %d: %s", code, out)
	}
	left := 0
	for _, m := range a16DeadByPartition(t, rdb, streams) {
		left += len(m)
	}
	limitReplayed := 30 - left
	// Then all of it.
	out, code = a16Run(t, srv.Addr(), "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "0")
	if code != 0 {
		t.Fatalf("dlq replay: exit %d: %s", code, out)
	}
	for s, m := range a16DeadByPartition(t, rdb, streams) {
		if len(m) != 0 {
			t.Errorf("%s still has %d dead letters after replay", s, len(m))
		}
	}
	// Each replayed job is back in its own partition, once.
	where := map[string][]string{}
	for _, s := range streams {
		msgs, err := rdb.XRange(ctx, s, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			id, _ := m.Values[stream.FieldJobID].(string)
			where[id] = append(where[id], s)
		}
	}
	for i := 0; i < 60; i += 2 {
		id := "j-" + strconv.Itoa(i)
		if w := where[id]; len(w) != 1 || w[0] != streams[stream.PartitionOf(id, n)] {
			t.Errorf("replayed job %s is in %v, want once in %s", id, w, streams[stream.PartitionOf(id, n)])
		}
	}
	if len(where) != 30 {
		t.Errorf("%d jobs in the streams after replay, want 30", len(where))
	}

	// They die again; purge --dry-run counts them all, purge removes them all.
	a16Consume(t, rdb, streams, 30)
	out, code = a16Run(t, srv.Addr(), "dlq", "purge", queue, "--partitions", strconv.Itoa(n), "--dry-run")
	if code != 0 {
		t.Fatalf("purge --dry-run: exit %d: %s", code, out)
	}
	if !strings.Contains(out, "would delete") {
		t.Errorf("purge --dry-run: %s", out)
	}
	out, code = a16Run(t, srv.Addr(), "dlq", "purge", queue, "--partitions", strconv.Itoa(n), "--yes", "--type", "bad")
	if code != 0 {
		t.Fatalf("purge: exit %d: %s", code, out)
	}
	for s, m := range a16DeadByPartition(t, rdb, streams) {
		if len(m) != 0 {
			t.Errorf("%s still has %d dead letters after purge", s, len(m))
		}
	}
	t.Logf("replay --limit 7 replayed %d", limitReplayed)
}

// TestAttack16_cliBadPartitions: --partitions out of range or with a bad
// queue name is a usage error (exit 2) naming the flag.
func TestAttack16_cliBadPartitions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	for _, args := range [][]string{
		{"stats", "q", "--partitions", "-3"}, {"stats", "q", "--partitions", "1025"},
		{"stats", "a{b", "--partitions", "3"},
		{"dlq", "ls", "q", "--partitions", "1025"}, {"dlq", "replay", "q", "--partitions", "-1", "--yes"},
		{"dlq", "purge", "q", "--partitions", "100000", "--yes"}, {"dlq", "purge", "a}b", "--partitions", "3", "--yes"},
	} {
		out, code := a16Run(t, srv.Addr(), args...)
		if code != 2 || !strings.Contains(strings.ToLower(out), "partition") && !strings.Contains(out, "queue") {
			t.Errorf("pelican %v: exit %d, want 2 with an error naming --partitions or the queue: %s", args, code, out)
		}
	}
}
