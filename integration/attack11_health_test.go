package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Promise (Health.Ready): "Run has started reading new entries, its reads (and
// its heartbeats) are answered"; the brief: cut off from Redis -> not ready
// within the visibility timeout. Cut off by a partition (blackhole: nothing
// answers, nothing is reset) or by resets, idle or with a job running, with a
// short Block and with a Block longer than the visibility timeout (if Validate
// accepts it). Bound: the visibility timeout, widened 2x for a loaded machine.
// Then healed: ready again, and the job that was running is done exactly once
// more (it lost its lease, so it runs again) and nothing is left pending.
type a11HealthCase struct {
	name     string
	block    time.Duration
	refuse   bool
	running  bool
	clientRT time.Duration // go-redis ReadTimeout; 0: go-redis default (3s)
	bound    time.Duration // not ready within this long of the cut-off
}

func TestAttack11_HealthCutOff(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, tc := range []a11HealthCase{
		{"blackhole-idle", 100 * time.Millisecond, false, false, 0, 6 * time.Second},
		{"blackhole-idle-rt500ms", 100 * time.Millisecond, false, false, 500 * time.Millisecond, 6 * time.Second},
		{"blackhole-running", 100 * time.Millisecond, false, true, 0, 6 * time.Second},
		{"refuse-running", 100 * time.Millisecond, true, true, 0, 6 * time.Second},
		{"blackhole-running-longblock", 2800 * time.Millisecond, false, true, 500 * time.Millisecond, 6 * time.Second},
		{"blackhole-idle-defaultblock", time.Second, false, false, 0, 6 * time.Second},
	} {
		idle.Run(tc.name, func(t *testing.T) { a11HealthRun(t, tc) })
	}
}

// Promise (docs/deploy.md): "ready when Run is reading new entries, its latest
// read was answered, no read has waited longer than Block + (VisibilityTimeout −
// Block)/2 ... A consumer cut off from Redis is therefore not ready within its
// visibility timeout, idle or busy". With a Block that Validate accepts (2.8 s <
// 3 s visibility), an idle consumer partitioned from Redis stays ready for
// 3.4-4 s (go-redis ReadTimeout 500 ms) and 7.9 s to over 12 s (go-redis default
// ReadTimeout): the clock starts at a read's send, not at the last answer.
func TestAttack11_HealthCutOffLongBlockIdle(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, tc := range []a11HealthCase{
		{"rt500ms", 2800 * time.Millisecond, false, false, 500 * time.Millisecond, 3 * time.Second},
		{"rtdefault", 2800 * time.Millisecond, false, false, 0, 3 * time.Second},
	} {
		idle.Run(tc.name, func(t *testing.T) { a11HealthRun(t, tc) })
	}
}

func a11HealthRun(t *testing.T, tc a11HealthCase) {
	shared := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(shared, name+"*") })
	px, err := faultproxy.Start(redistest.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true,
		ReadTimeout: tc.clientRT, WriteTimeout: tc.clientRT, DialTimeout: tc.clientRT})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	const vis = 3 * time.Second
	cfg := consumer.Config{Stream: name, Group: "g", Consumer: "A", Concurrency: 2,
		VisibilityTimeout: vis, Block: tc.block, IdleConsumerTimeout: -1}
	if err := cfg.Validate(); err != nil {
		t.Skipf("Validate refuses this configuration (fine): %v", err)
	}
	var runs, cancelled atomic.Int32
	c := consumer.New(rdb, cfg).Handle(consumer.HandlerFunc(func(hctx context.Context, job *stream.Job) error {
		if runs.Add(1) == 1 && job.Type == "long" {
			<-hctx.Done()
			if errors.Is(context.Cause(hctx), consumer.ErrLeaseLost) {
				cancelled.Add(1)
			}
			return context.Cause(hctx)
		}
		return nil
	}))
	run := make(chan error, 1)
	go func() { run <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Shutdown(sctx)
		<-run
	})
	select {
	case <-c.Reading():
	case err := <-run:
		t.Fatalf("Run returned: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not reading")
	}
	a11Poll(t, 30*time.Second, "ready", func() bool { return c.Health().Ready })
	if tc.running {
		p := stream.NewProducer(shared, stream.ProducerConfig{Stream: name})
		j, _ := stream.NewJSONJob("long", 1)
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		a11Poll(t, 30*time.Second, "job running", func() bool { return runs.Load() == 1 && c.Health().InFlight == 1 })
	}
	// The bound is the product's; a process or Redis that did not run for
	// a while (a loaded machine) adds that while, measured.
	watch, _ := watchStalls(shared)
	defer watch.Stop()
	cut := time.Now()
	if tc.refuse {
		px.Refuse()
	} else {
		px.Blackhole()
	}
	a11Poll(t, 8*vis, "not ready", func() bool { return !c.Health().Ready })
	took := time.Since(cut)
	h := c.Health()
	t.Logf("not ready after %v: %+v", took, h)
	if slack := watch.Longest(); took > tc.bound+slack {
		t.Errorf("not ready only %v after the cut-off, visibility timeout %v (longest stall %v)", took, vis, slack)
	}
	if h.Problem == "" || !h.Live {
		t.Errorf("health while cut off: %+v", h)
	}
	rec := httptest.NewRecorder()
	c.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/ready", nil))
	var body consumer.Health
	if rec.Code != http.StatusServiceUnavailable || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Ready {
		t.Errorf("ReadyHandler while cut off: %d %s", rec.Code, rec.Body.String())
	}
	if tc.running {
		a11Poll(t, 4*vis, "handler cancelled with ErrLeaseLost", func() bool { return cancelled.Load() == 1 })
	}
	px.Pass()
	a11Poll(t, 60*time.Second, "ready again", func() bool { return c.Health().Ready })
	if tc.running {
		a11Poll(t, 60*time.Second, "job run again and settled", func() bool {
			n, err := shared.XPending(ctx, name, "g").Result()
			return err == nil && n.Count == 0 && runs.Load() >= 2
		})
		a11Poll(t, 30*time.Second, "the ack counted", func() bool { return c.Stats().Acked >= 1 })
		if r := runs.Load(); r != 2 {
			t.Errorf("job ran %d times, want 2 (once cut off, once after)", r)
		}
		if st := c.Stats(); st.Acked != 1 {
			t.Errorf("acked %d, want 1: %+v", st.Acked, st)
		}
	}
}
