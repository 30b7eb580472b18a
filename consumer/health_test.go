package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// A consumer cut off from Redis (a partition: its connections stall,
// nothing is reset) must stop reporting itself ready before another
// consumer may take its jobs over: within its visibility timeout, whether
// it was idle (a read is blocked) or busy (every slot runs a job, so only
// its heartbeats talk to Redis). Once the network heals it is ready again.
// The bound is measured from the partition; a run in which this process
// stalled longer than the margin left is repeated with a longer visibility
// timeout. Red check: with Health ignoring a read in flight (only failed
// reads counted), the idle case stays ready for the whole partition; with
// it ignoring heartbeats, the busy case does.
func TestHealth_cutOff(t *testing.T) {
	// Not parallel with the package's other tests: it runs before them, so
	// its partitions and waits neither slow them nor are slowed by them.
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			t.Parallel()
			redistest.Widen(t, "visibility", 3*time.Second, func(t *testing.T, vis time.Duration) time.Duration {
				return healthCutOff(t, vis, busy)
			})
		})
	}
}

func healthCutOff(t *testing.T, vis time.Duration, busy bool) (wider time.Duration) {
	shared := redistest.Shared(t)
	proxy, err := faultproxy.Start(redistest.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	name := "{" + redistest.Name(t) + "}:jobs"
	keys, _ := stream.KeysFor(name)
	t.Cleanup(func() { shared.Del(context.Background(), keys.Stream, keys.Dead, keys.Delayed) })

	var started atomic.Int64
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		started.Add(1)
		if job.Type == "long" {
			<-ctx.Done() // until its lease ends, or shutdown
			return ctx.Err()
		}
		return nil
	})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "a", Concurrency: 1,
		Block: 100 * time.Millisecond, VisibilityTimeout: vis, ShutdownTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handle(h)
	if got := c.Health(); got.Ready || !got.Live {
		t.Fatalf("before Run: %+v, want live and not ready", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	defer func() {
		proxy.Pass()
		cancel()
		if err := recv(t, runErr, 10*time.Second, "Run to return"); err != nil {
			t.Error(err)
		}
		if got := c.Health(); got.Ready || got.Live {
			t.Errorf("after Run returned: %+v, want neither ready nor live", got)
		}
	}()
	recv(t, c.Reading(), 10*time.Second, "the consumer to start reading")
	p := stream.NewProducer(shared, stream.ProducerConfig{Stream: name})
	quick, _ := stream.NewJob("quick", nil)
	if _, err := p.Enqueue(ctx, quick); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the quick job to settle", func() bool { return !c.Health().LastSettled.IsZero() })
	if busy {
		long, _ := stream.NewJob("long", nil)
		if _, err := p.Enqueue(ctx, long); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the long job to start", func() bool { return started.Load() == 2 })
	}
	if got := c.Health(); !got.Ready {
		t.Fatalf("before the partition: %+v, want ready", got)
	}
	srv := httptest.NewServer(c.ReadyHandler())
	defer srv.Close()
	if code, _ := get(t, srv.URL); code != http.StatusOK {
		t.Fatalf("ReadyHandler before the partition: %d, want 200", code)
	}

	watch := redistest.WatchStalls(shared, 100*time.Millisecond)
	defer watch.Stop()
	cut := time.Now()
	proxy.Blackhole()
	var unready time.Time
	waitFor(t, 4*vis, "the cut-off consumer to report not ready", func() bool {
		if !c.Health().Ready {
			unready = time.Now()
			return true
		}
		return false
	})
	if took := unready.Sub(cut); took >= vis {
		if stall := watch.Within(cut, unready); stall > 0 {
			t.Logf("not ready %v after the partition, but this process stalled %v meanwhile; widening", took, stall)
			return 2 * vis
		}
		t.Fatalf("not ready only %v after the partition, not within the visibility timeout %v", took, vis)
	}
	code, body := get(t, srv.URL)
	var got consumer.Health
	if err := json.Unmarshal(body, &got); err != nil || code != http.StatusServiceUnavailable || got.Ready || got.Problem == "" || !got.Live {
		t.Fatalf("ReadyHandler during the partition: %d %s (%v), want 503, not ready, live, a problem", code, body, err)
	}
	t.Logf("not ready %v after the partition (visibility timeout %v): %s", unready.Sub(cut), vis, got.Problem)

	proxy.Pass()
	waitFor(t, 30*time.Second, "the consumer to be ready again after the partition", func() bool { return c.Health().Ready })
	return 0
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// WaitIdle returns only once every job has settled: not while handlers
// still run after the stream was read empty, nor on an empty read from
// before jobs enqueued later. Red checks: idle() without the in-flight
// count returns while the handlers are blocked. (Without the read's time
// compared with the call's, ExampleConsumer_WaitIdle failed in a package
// run: an empty read from before the enqueue; this test's second part
// does not hit that race reliably.)
func TestWaitIdle(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := "{" + redistest.Name(t) + "}:jobs"
	keys, _ := stream.KeysFor(name)
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Stream, keys.Dead, keys.Delayed) })
	const n = 20
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	for range n {
		j, _ := stream.NewJob("t", nil)
		if _, err := p.Enqueue(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	var started atomic.Int64
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Concurrency: 2 * n, Block: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			started.Add(1)
			<-release
			return nil
		}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	idle := make(chan error, 1)
	go func() { idle <- c.WaitIdle(ctx) }()
	waitFor(t, 10*time.Second, "every handler to start", func() bool { return started.Load() == n })
	// Reads go on, and find nothing, while the handlers are blocked.
	select {
	case err := <-idle:
		t.Fatalf("WaitIdle returned (%v) with %d handlers running", err, n)
	case <-time.After(20 * 50 * time.Millisecond):
	}
	close(release)
	if err := recv(t, idle, 10*time.Second, "WaitIdle"); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().Acked; got != n {
		t.Fatalf("WaitIdle returned with %d of %d jobs acknowledged", got, n)
	}
	pending, err := rdb.XPending(context.Background(), name, "g").Result()
	if err != nil || pending.Count != 0 {
		t.Fatalf("pending after WaitIdle: %+v, %v", pending, err)
	}
	// Jobs enqueued while the consumer idles: the empty read before them
	// does not count.
	for range n {
		j, _ := stream.NewJob("t", nil)
		if _, err := p.Enqueue(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().Acked; got != 2*n {
		t.Fatalf("second WaitIdle returned with %d of %d jobs acknowledged", got, 2*n)
	}
	cancel()
	if err := recv(t, runErr, 10*time.Second, "Run to return"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitIdle(context.Background()); err == nil {
		t.Fatal("WaitIdle after Run returned: nil, want an error")
	}
}

// Reading is closed at the answer to the consumer's first read, which does
// not block: on an empty stream a program waiting for Reading to enqueue
// does not wait a Block. Block and the sweep (which bounds a read's block)
// are ten minutes here, so a first read that blocked would hold Reading
// back far past the bound. A job enqueued once Reading is closed runs.
// Red check: with the first read blocking as the others do, Reading is not
// closed within the minute.
func TestHealth_readingDoesNotWaitABlock(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	ran := make(chan string, 1)
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Block: 10 * time.Minute,
		VisibilityTimeout: time.Hour, SweepInterval: 10 * time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			ran <- j.ID
			return nil
		}))
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(context.Background()) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Shutdown(ctx)
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	recv(t, c.Reading(), time.Minute, "Reading with Block 10m on an empty stream")
	job, err := stream.NewJSONJob("t", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-ran:
		if id != job.ID {
			t.Fatalf("ran job %s, want %s", id, job.ID)
		}
	case <-time.After(time.Minute):
		t.Fatal("the job enqueued after Reading did not run within a minute")
	}
}
