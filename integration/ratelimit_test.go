package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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
// It prints the number it admitted, then every call's start and return
// ("PW_RL_CALL <unix ns> <unix ns>"), or "started late" if it saw the start
// time only after it had passed.
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
		Per:    time.Duration(num("PW_RL_PER")),
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
	var mu sync.Mutex
	var calls []redistest.Call
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				began := time.Now()
				err := h.Process(ctx, &stream.Job{Type: "call"})
				mu.Lock()
				calls = append(calls, redistest.Call{Start: began, End: time.Now()})
				mu.Unlock()
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
	for _, c := range calls {
		fmt.Printf("PW_RL_CALL %d %d\n", c.Start.UnixNano(), c.End.UnixNano())
	}
	if failed.Load() > 0 {
		return 3
	}
	return 0
}

// TestRateLimit_twoProcesses: two processes sharing one rate limit key
// (200 per second, burst 20) for 3 s admit the burst and one job per 5 ms
// interval in all: no more (over the time their calls span), and no fewer
// than 90% of what their calls gave the limiter the chance to admit (see
// redistest.Uncovered: the capacity lapses only in stretches longer than
// the burst that hold no whole call). A run in which a process saw the
// start time late, or in which such stretches took a third of the window
// (a busy machine), could not check and is repeated with a period twice as
// long (the same run, slower).
func TestRateLimit_twoProcesses(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "per", time.Second, rateLimitTwoProcesses)
}

// rateLimitTwoProcesses runs TestRateLimit_twoProcesses with the rate per
// period per (a window of three periods); it returns a longer period if the
// run could not check.
func rateLimitTwoProcesses(t *testing.T, per time.Duration) (wider time.Duration) {
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	prefix, counter, ready, startKey := name+":rate:", name+":admitted", name+":ready", name+":start"
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), prefix+"api", prefix+"warm-up", counter, ready, startKey) })
	const (
		rate  = 200
		burst = 20
	)
	window, every := 3*per, per/rate
	env := []string{
		"PW_ADDR=" + redistest.Addr(), "PW_RL_PREFIX=" + prefix, "PW_RL_COUNTER=" + counter,
		"PW_RL_RATE=" + strconv.Itoa(rate), "PW_RL_BURST=" + strconv.Itoa(burst), "PW_RL_PER=" + strconv.FormatInt(int64(per), 10),
		"PW_RL_WINDOW=" + window.String(), "PW_RL_READY=" + ready, "PW_RL_START=" + startKey,
	}
	procs := []*worker{startSubprocess(t, rateModeName, env...), startSubprocess(t, rateModeName, env...)}
	eventually(t, time.Minute, func() (bool, string) {
		n, _ := rdb.Get(ctx, ready).Int()
		return n == len(procs), fmt.Sprintf("%d of %d processes ready", n, len(procs))
	})
	start := time.Now().Add(3 * per / 10)
	if err := rdb.Set(ctx, startKey, start.UnixNano(), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	shares := make([]int, len(procs))
	var calls []redistest.Call
	late := false
	for i, p := range procs {
		err := p.wait(window + time.Minute)
		if strings.Contains(p.stderr.String(), "started late") {
			late = true
			continue
		}
		if err != nil {
			t.Fatalf("process %d: %v\n%s", i, err, p.stderr.String())
		}
		if _, err := fmt.Sscanf(p.stderr.String(), "PW_RL admitted=%d", &shares[i]); err != nil {
			t.Fatalf("process %d output %q: %v", i, tail(p.stderr.String(), 1000), err)
		}
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			var s, e int64
			if _, err := fmt.Sscanf(line, "PW_RL_CALL %d %d", &s, &e); err == nil {
				calls = append(calls, redistest.Call{Start: time.Unix(0, s), End: time.Unix(0, e)})
			}
		}
	}
	if late {
		t.Logf("the run checked nothing: a process saw the start time only after it (%v after it was set)", 3*per/10)
		return 2 * per
	}
	total, err := rdb.Get(ctx, counter).Int()
	if err != nil {
		t.Fatal(err)
	}
	first, last := redistest.CallBounds(calls)
	span, covered := last.End.Sub(first.Start), last.Start.Sub(first.End)
	lapsed := redistest.Uncovered(calls, burst*every)
	most := burst + float64(span/every) + 1
	least := burst + float64((covered-lapsed)/every) - 1
	t.Logf("admitted %d (processes: %v) of %d calls over %v at %d per %v, burst %d: want %.0f to %.0f (%v held no whole call for over the burst)",
		total, shares, len(calls), span.Round(time.Millisecond), rate, per, burst, 0.9*least, most, lapsed.Round(time.Millisecond))
	if shares[0]+shares[1] != total {
		t.Errorf("the processes admitted %v, the counter says %d", shares, total)
	}
	if float64(total) > most {
		t.Errorf("admitted %d across two processes in %v, want at most %.0f: the burst and one per %v", total, span, most, every)
	}
	for i, n := range shares {
		if n < total/5 {
			t.Errorf("process %d admitted only %d of %d: the processes did not both run the window", i, n, total)
		}
	}
	if lapsed > covered/3 {
		t.Logf("the run checked nothing of the lower bound: %v of %v held no whole call for over the burst", lapsed, covered)
		return 2 * per
	}
	if float64(total) < 0.9*least {
		t.Errorf("admitted %d across two processes, want at least 90%% of %.0f: the burst and one per %v, less the %v without calls",
			total, least, every, lapsed)
	}
	return 0
}
