package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// The rate-limit subprocess: many goroutines push jobs through the
// RateLimit middleware as fast as it lets them, for PW_RL_WINDOW from the
// start time the test writes to the key PW_RL_START once every process has
// INCRed PW_RL_READY. A job the middleware admits INCRs PW_RL_COUNTER in Redis; a
// job it snoozes is retried after the snooze delay, as a consumer would.
const rateModeName = "ratelimit"

func init() { subprocessModes[rateModeName] = rateMode }

func rateMode() int {
	env := os.Getenv
	num := func(k string) int64 { n, _ := strconv.ParseInt(env(k), 10, 64); return n }
	window, err := time.ParseDuration(env("PW_RL_WINDOW"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad PW_RL_WINDOW:", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: env("PW_ADDR"), PoolSize: 32})
	defer rdb.Close()
	counter := env("PW_RL_COUNTER")
	ctx := context.Background()
	var admitted atomic.Int64
	cfg := middleware.RateLimitConfig{
		Burst:  int(num("PW_RL_BURST")),
		Key:    func(job *stream.Job) string { return "api" },
		Per:    time.Second,
		Prefix: env("PW_RL_PREFIX"),
		Rate:   int(num("PW_RL_RATE")),
	}
	h := middleware.RateLimit(rdb, cfg)(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		admitted.Add(1)
		return rdb.Incr(ctx, counter).Err()
	}))
	// Load the script before the start, so both processes begin at once.
	l, err := middleware.NewRateLimiter(rdb, cfg)
	if err == nil {
		_, _, err = l.Allow(ctx, cfg.Prefix+"warm-up")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "PW_RL warm-up:", err)
		return 2
	}
	// Report ready, then wait for the test to set the start time, so both
	// processes run the same window however long they took to start.
	if err := rdb.Incr(ctx, env("PW_RL_READY")).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "PW_RL ready:", err)
		return 2
	}
	var start time.Time
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if ns, err := rdb.Get(ctx, env("PW_RL_START")).Int64(); err == nil {
			start = time.Unix(0, ns)
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "PW_RL: no start time")
			return 4
		}
	}
	if time.Now().After(start) {
		fmt.Fprintln(os.Stderr, "PW_RL started late")
		return 4
	}
	end := start.Add(window)
	time.Sleep(time.Until(start))
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				err := h.Process(ctx, &stream.Job{Type: "call"})
				var o *consumer.Outcome
				switch {
				case err == nil:
				case errors.As(err, &o) && !o.CountsAttempt():
					time.Sleep(min(o.Delay(), time.Until(end)))
				default:
					fmt.Fprintln(os.Stderr, "PW_RL error:", err)
					failed.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("PW_RL admitted=%d\n", admitted.Load())
	if failed.Load() > 0 {
		return 3
	}
	return 0
}

// TestRateLimit_twoProcesses: two processes sharing one rate limit key admit
// rate*window + burst jobs in all, within 10%.
func TestRateLimit_twoProcesses(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	prefix, counter, ready, startKey := name+":rate:", name+":admitted", name+":ready", name+":start"
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), prefix+"api", prefix+"warm-up", counter, ready, startKey) })
	const (
		rate   = 200
		burst  = 20
		window = 3 * time.Second
	)
	env := []string{
		"PW_ADDR=" + redistest.Addr(), "PW_RL_PREFIX=" + prefix, "PW_RL_COUNTER=" + counter,
		"PW_RL_RATE=" + strconv.Itoa(rate), "PW_RL_BURST=" + strconv.Itoa(burst),
		"PW_RL_WINDOW=" + window.String(), "PW_RL_READY=" + ready, "PW_RL_START=" + startKey,
	}
	procs := []*worker{startSubprocess(t, rateModeName, env...), startSubprocess(t, rateModeName, env...)}
	eventually(t, 20*time.Second, func() (bool, string) {
		n, _ := rdb.Get(ctx, ready).Int()
		return n == len(procs), fmt.Sprintf("%d of %d processes ready", n, len(procs))
	})
	start := time.Now().Add(300 * time.Millisecond)
	if err := rdb.Set(ctx, startKey, start.UnixNano(), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	shares := make([]int, len(procs))
	for i, p := range procs {
		if err := p.wait(window + 15*time.Second); err != nil {
			t.Fatalf("process %d: %v\n%s", i, err, p.stderr.String())
		}
		if _, err := fmt.Sscanf(p.stderr.String(), "PW_RL admitted=%d", &shares[i]); err != nil {
			t.Fatalf("process %d output %q: %v", i, p.stderr.String(), err)
		}
	}
	total, err := rdb.Get(ctx, counter).Int()
	if err != nil {
		t.Fatal(err)
	}
	want := float64(rate)*window.Seconds() + burst
	t.Logf("admitted %d (processes: %v) in %v at %d/s burst %d: want %.0f, off by %+.1f%%",
		total, shares, window, rate, burst, want, 100*(float64(total)-want)/want)
	if shares[0]+shares[1] != total {
		t.Errorf("the processes admitted %v, the counter says %d", shares, total)
	}
	if math.Abs(float64(total)-want) > 0.1*want {
		t.Errorf("admitted %d across two processes, want %.0f ± 10%%", total, want)
	}
	for i, n := range shares {
		if n < total/5 {
			t.Errorf("process %d admitted only %d of %d: the processes did not both run the window", i, n, total)
		}
	}
}
