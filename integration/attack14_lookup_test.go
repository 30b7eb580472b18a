package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// a14HangMain is a consumer process whose handler marks the job started in
// Redis and then hangs (until SIGKILL).
func a14HangMain() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("A14_ADDR")})
	defer rdb.Close()
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		rdb.Set(context.Background(), os.Getenv("A14_MARK"), j.ID, time.Minute)
		select {}
	})
	c := consumer.New(rdb, consumer.Config{Stream: os.Getenv("A14_STREAM"), Group: "g", Consumer: "victim",
		VisibilityTimeout: time.Second, Block: 100 * time.Millisecond}).Handle(h)
	if err := c.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func init() { subprocessModes["a14hang"] = a14HangMain }

func a14WaitState(t *testing.T, rdb redis.UniversalClient, name, id string, d time.Duration, ok func(control.JobInfo) bool) control.JobInfo {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		info, err := control.Lookup(context.Background(), rdb, name, id)
		if err == nil && ok(info) {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lookup(%s) = %+v, %v; condition not met within %v", id, info, err, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A consumer process is SIGKILLed mid-job: Lookup says running, held by the
// dead consumer; once another consumer takes the job over and finishes it,
// Lookup says done with its result, the record lives TrackTTL and nothing is
// pending.
func TestAttack14Lookup_sigkillTakeover(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	mark := name + ":mark"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job := &stream.Job{Type: "w", Payload: []byte(`{}`)}
	t.Cleanup(func() {
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, mark, stream.JobKey(keys, job.ID))
	})
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true}).Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}
	w := startSubprocess(t, "a14hang", "A14_ADDR="+redistest.Addr(), "A14_STREAM="+name, "A14_MARK="+mark)
	eventually(t, 60*time.Second, func() (bool, string) {
		return rdb.Get(ctx, mark).Val() == job.ID, "victim never started the job"
	})
	run := a14WaitState(t, rdb, name, job.ID, 10*time.Second, func(i control.JobInfo) bool { return i.State == control.StateRunning })
	if run.Consumer != "victim" || run.Group != "g" || run.Deliveries < 1 {
		t.Errorf("running = %+v; want victim of g", run)
	}
	w.kill()
	// Still running (held by the dead consumer) until taken over.
	if info, err := control.Lookup(ctx, rdb, name, job.ID); err != nil || info.State != control.StateRunning {
		t.Errorf("after SIGKILL Lookup = %+v, %v; want running (held by the dead consumer)", info, err)
	}
	var runs atomic.Int32
	release := make(chan struct{})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "rescuer", VisibilityTimeout: time.Second,
		SweepInterval: 100 * time.Millisecond, Block: 100 * time.Millisecond, TrackTTL: time.Hour}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			return consumer.SetResult(ctx, []byte("rescued"))
		}))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	taken := a14WaitState(t, rdb, name, job.ID, 60*time.Second, func(i control.JobInfo) bool {
		return i.State == control.StateRunning && i.Consumer == "rescuer"
	})
	if taken.Deliveries < 2 || taken.EntryID != run.EntryID || taken.Idle > 30*time.Second {
		t.Errorf("taken over = %+v; want rescuer, 2+ deliveries, entry %s, small idle", taken, run.EntryID)
	}
	close(release)
	fin := a14WaitState(t, rdb, name, job.ID, 60*time.Second, func(i control.JobInfo) bool { return i.State == stream.StateDone })
	if string(fin.Result) != "rescued" || fin.At.IsZero() || fin.Consumer != "" || fin.EntryID != "" && fin.Deliveries != 0 {
		t.Errorf("done = %+v; want result rescued, a time, no consumer", fin)
	}
	if ttl := rdb.PTTL(ctx, stream.JobKey(keys, job.ID)).Val(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("done record lives %v; want TrackTTL 1h", ttl)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		n := rdb.XPending(ctx, name, "g").Val().Count
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	if n := runs.Load(); n != 1 {
		t.Errorf("rescuer ran the job %d times; want 1", n)
	}
}

// Cancel races consumer processes' worth of readers, many times: every job
// ends in exactly one final state; a job whose Cancel succeeded never runs;
// a job whose Cancel was refused ran (done); none is lost.
func TestAttack14Cancel_raceMany(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 200
	var mu sync.Mutex
	ran := map[string]int{}
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			rdb.Del(context.Background(), stream.JobKey(keys, id))
		}
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead)
	})
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		ran[j.ID]++
		mu.Unlock()
		time.Sleep(time.Millisecond) // so that a backlog forms and Cancel wins some
		return nil
	})
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: fmt.Sprintf("c%d", i),
			Block: 50 * time.Millisecond, Concurrency: 1, Prefetch: -1}).Handle(h)
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	cancelled := map[string]string{}
	refused := map[string]error{}
	running := map[string]bool{}
	// Batches of 10 enqueued at once (one pipeline-free burst), then
	// cancelled newest first: the consumers get some, Cancel others.
	for b := 0; b < n/10; b++ {
		var batch []string
		for i := 0; i < 10; i++ {
			j := &stream.Job{Type: "w", Payload: []byte(`{}`)}
			if _, err := p.Enqueue(ctx, j); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, j.ID)
			batch = append(batch, j.ID)
		}
		for i := len(batch) - 1; i >= 0; i-- {
			id := batch[i]
			was, err := control.Cancel(ctx, rdb, name, id)
			switch {
			case err == nil && was == stream.StateCancelling:
				running[id] = true // done once its handler (which ignores its context) returns, or cancelled before it started
			case err == nil:
				cancelled[id] = was
			case errors.Is(err, control.ErrJobFinished):
				refused[id] = err
			default:
				t.Fatalf("Cancel(%s): %v", id, err)
			}
		}
	}
	for _, id := range ids {
		want := stream.StateDone
		if _, ok := cancelled[id]; ok {
			want = stream.StateCancelled
		}
		info := a14WaitState(t, rdb, name, id, 30*time.Second, func(i control.JobInfo) bool {
			return i.State == stream.StateDone || i.State == stream.StateCancelled
		})
		if running[id] && info.State == stream.StateCancelled {
			cancelled[id] = stream.StateCancelling // cancelled before it started: never ran
			want = info.State
		}
		if info.State != want {
			t.Errorf("job %s: Lookup %s; want %s (cancel: %q, refused: %v)", id, info.State, want, cancelled[id], refused[id])
		}
	}
	// Let the consumers read anything left, then count runs.
	eventually(t, 10*time.Second, func() (bool, string) {
		c := rdb.XPending(ctx, name, "g").Val().Count
		return c == 0, fmt.Sprintf("%d pending", c)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		_, c := cancelled[id]
		if c && ran[id] != 0 {
			t.Errorf("job %s cancelled (was %s) but ran %d times", id, cancelled[id], ran[id])
		}
		if !c && ran[id] != 1 {
			t.Errorf("job %s not cancelled but ran %d times", id, ran[id])
		}
	}
	t.Logf("%d cancelled, %d refused", len(cancelled), len(refused))
}

// The CLI's exit codes and output for pelican job and pelican cancel.
func TestAttack14Lookup_cliExitCodes(t *testing.T) {
	t.Parallel()
	cli := pelicanCLI(t)
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	url := "redis://" + redistest.Addr() + "/0"
	run := func(args ...string) (int, string) {
		cmd := exec.Command(cli, append([]string{"--redis", url}, args...)...)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	sched := &stream.Job{Type: "w", Payload: []byte(`{"secret":"payload-xyz"}`)}
	wait := &stream.Job{Type: "w", Payload: []byte(`{"secret":"payload-xyz"}`)}
	t.Cleanup(func() {
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, stream.JobKey(keys, sched.ID), stream.JobKey(keys, wait.ID), stream.JobKey(keys, "garbage"))
	})
	if err := p.EnqueueIn(ctx, sched, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Enqueue(ctx, wait); err != nil {
		t.Fatal(err)
	}
	check := func(wantCode int, wantOut string, args ...string) {
		t.Helper()
		code, out := run(args...)
		if code != wantCode || !strings.Contains(out, wantOut) {
			t.Errorf("pelican %q: exit %d, output %q; want exit %d containing %q", args, code, out, wantCode, wantOut)
		}
		if strings.Contains(out, "payload-xyz") {
			t.Errorf("pelican %q prints the payload: %q", args, out)
		}
	}
	check(0, "scheduled", "job", name, sched.ID)
	check(0, "waiting", "job", name, wait.ID)
	check(0, "scheduled", "-o", "json", "job", name, sched.ID)
	check(4, "", "job", name, "no-such-job")
	check(4, "", "cancel", name, "no-such-job")
	check(2, "", "job", name)
	check(2, "", "cancel", name)
	check(2, "", "job", name, "a", "b")
	check(0, "", "cancel", name, sched.ID)
	check(0, "cancelled", "job", name, sched.ID)
	check(1, "", "cancel", name, sched.ID) // finished
	check(0, "", "cancel", name, wait.ID)
	check(1, "", "cancel", name, wait.ID)
	rdb.Set(ctx, stream.JobKey(keys, "garbage"), "garbage", 0)
	check(1, "", "job", name, "garbage")
	check(1, "", "cancel", name, "garbage")
	if code, _ := run("job", name, strings.Repeat("x", control.MaxJobIDBytes+1)); code != 2 && code != 1 {
		t.Errorf("pelican job with a too-long ID exits %d; want 2 (usage) or 1", code)
	}
	// Redis unreachable: 1.
	cmd := exec.Command(cli, "--redis", "redis://127.0.0.1:1/0", "job", name, "x")
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("pelican job against an unreachable Redis: %v; want exit 1", err)
	}
}

// Cancel races promotion and retries: jobs scheduled a few ms ahead, whose
// first attempt fails with a short RetryAfter, are cancelled at spread-out
// moments while two consumers promote and run them. Every job ends in
// exactly one final state; a successfully cancelled job never runs after the
// Cancel returned (and never completes); a refused one is done.
func TestAttack14Cancel_racePromoteRetry(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 150
	var mu sync.Mutex
	runs := map[string][]time.Time{}
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			rdb.Del(context.Background(), stream.JobKey(keys, id))
		}
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead)
	})
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		runs[j.ID] = append(runs[j.ID], time.Now())
		first := len(runs[j.ID]) == 1
		mu.Unlock()
		if first {
			return consumer.RetryAfter(5*time.Millisecond, errors.New("first attempt fails"))
		}
		return nil
	})
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: fmt.Sprintf("c%d", i),
			Block: 50 * time.Millisecond, Concurrency: 4, PromoteInterval: 5 * time.Millisecond, MaxAttempts: 10, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handle(h)
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	type res struct {
		was string
		at  time.Time
		err error
	}
	results := map[string]res{}
	var rmu sync.Mutex
	var cw sync.WaitGroup
	for i := 0; i < n; i++ {
		j := &stream.Job{Type: "w", Payload: []byte(`{}`)}
		if err := p.EnqueueIn(ctx, j, time.Duration(i%4)*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
		cw.Add(1)
		go func(id string, delay time.Duration) {
			defer cw.Done()
			time.Sleep(delay)
			was, err := control.Cancel(ctx, rdb, name, id)
			rmu.Lock()
			results[id] = res{was, time.Now(), err}
			rmu.Unlock()
		}(j.ID, time.Duration(i%25)*time.Millisecond)
	}
	cw.Wait()
	stats := map[string]int{}
	for _, id := range ids {
		r := results[id]
		want := stream.StateDone
		switch {
		case r.err == nil && r.was == stream.StateCancelling:
			// Running: cancelled if its run fails (the first), done if it
			// completes (the second); checked against the runs below.
			want = ""
			stats["cancelling"]++
		case r.err == nil:
			want = stream.StateCancelled
			stats["cancelled "+r.was]++
		case errors.Is(r.err, control.ErrJobFinished):
			stats["refused"]++
		default:
			t.Errorf("Cancel(%s): %v", id, r.err)
			continue
		}
		info := a14WaitState(t, rdb, name, id, 30*time.Second, func(i control.JobInfo) bool {
			return i.State == stream.StateDone || i.State == stream.StateCancelled || i.State == stream.StateDead
		})
		if want == "" {
			mu.Lock()
			want = map[bool]string{true: stream.StateDone, false: stream.StateCancelled}[len(runs[id]) == 2] // cancelled unless its second run completed
			mu.Unlock()
		}
		if info.State != want {
			t.Errorf("job %s: Lookup %+v; want %s (cancel %+v)", id, info, want, r)
		}
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		c := rdb.XPending(ctx, name, "g").Val().Count
		return c == 0, fmt.Sprintf("%d pending", c)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		r := results[id]
		if r.err == nil && r.was != stream.StateCancelling {
			for _, at := range runs[id] {
				if at.After(r.at) {
					t.Errorf("job %s cancelled (was %s) at %v but ran at %v", id, r.was, r.at, at)
				}
			}
		}
	}
	if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != 0 {
		t.Errorf("%d members left in the delayed set", n)
	}
	t.Logf("outcomes: %v", stats)
}

// A tracked job exhausts its attempts (retryable errors, MaxAttempts 2):
// Lookup says dead with the reason and the last error; replayed, it is
// waiting; cancelled then, it is cancelled and a consumer started afterwards
// never runs it; a second dead job replayed runs to done with its result.
func TestAttack14Lookup_deadReplayCancel(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := "{" + redistest.Name(t) + "}:jobs"
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := &stream.Job{Type: "w", Payload: []byte(`{}`)}
	b := &stream.Job{Type: "w", Payload: []byte(`{}`)}
	t.Cleanup(func() {
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, stream.JobKey(keys, a.ID), stream.JobKey(keys, b.ID))
	})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	for _, j := range []*stream.Job{a, b} {
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var fail atomic.Bool
	fail.Store(true)
	var mu sync.Mutex
	ran := map[string]int{}
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		ran[j.ID]++
		mu.Unlock()
		if fail.Load() {
			return consumer.RetryAfter(time.Millisecond, errors.New("upstream 503"))
		}
		return consumer.SetResult(ctx, []byte("ok-"+j.ID[:4]))
	})
	runConsumer := func() func() {
		rctx, stop := context.WithCancel(ctx)
		c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 50 * time.Millisecond,
			MaxAttempts: 2, PromoteInterval: 10 * time.Millisecond, Logger: quiet}).Handle(h)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		return func() { stop(); <-done }
	}
	stop := runConsumer()
	for _, j := range []*stream.Job{a, b} {
		d := a14WaitState(t, rdb, name, j.ID, 30*time.Second, func(i control.JobInfo) bool { return i.State == stream.StateDead })
		if !strings.Contains(d.Error, "upstream 503") || !strings.Contains(d.Error, ": ") || d.At.IsZero() {
			t.Errorf("dead = %+v; want \"<reason>: upstream 503\" and a time", d)
		}
		if _, err := control.Cancel(ctx, rdb, name, j.ID); !errors.Is(err, control.ErrJobFinished) {
			t.Errorf("Cancel(dead) = %v; want ErrJobFinished", err)
		}
	}
	stop()
	mu.Lock()
	ranBefore := ran[a.ID]
	mu.Unlock()
	dl, err := dlq.New(rdb, name, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := dl.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); err != nil || res.Replayed != 2 {
		t.Fatalf("Replay = %+v, %v; want 2", res, err)
	}
	for _, j := range []*stream.Job{a, b} {
		if info, err := control.Lookup(ctx, rdb, name, j.ID); err != nil || info.State != stream.StateWaiting {
			t.Errorf("after replay Lookup = %+v, %v; want waiting", info, err)
		}
	}
	if was, err := control.Cancel(ctx, rdb, name, a.ID); err != nil || was != stream.StateWaiting {
		t.Fatalf("Cancel(replayed waiting) = %q, %v", was, err)
	}
	fail.Store(false)
	stop = runConsumer()
	defer stop()
	fin := a14WaitState(t, rdb, name, b.ID, 30*time.Second, func(i control.JobInfo) bool { return i.State == stream.StateDone })
	if string(fin.Result) != "ok-"+b.ID[:4] {
		t.Errorf("replayed job done = %+v; want its result", fin)
	}
	if info, err := control.Lookup(ctx, rdb, name, a.ID); err != nil || info.State != stream.StateCancelled {
		t.Errorf("cancelled replayed job: Lookup = %+v, %v; want cancelled", info, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran[a.ID] != ranBefore {
		t.Errorf("cancelled replayed job ran again (%d -> %d)", ranBefore, ran[a.ID])
	}
}

// An untracked job that is scheduled, retried and dead-lettered never gets an
// index record (untracked jobs cost nothing), and Lookup says unknown.
func TestAttack14Lookup_untrackedNoKey(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j := &stream.Job{Type: "w", Payload: []byte(`{}`)}
	t.Cleanup(func() { rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, stream.JobKey(keys, j.ID)) })
	if err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).EnqueueIn(ctx, j, 5*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 50 * time.Millisecond,
		MaxAttempts: 3, PromoteInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			_ = consumer.SetResult(ctx, []byte("x"))
			return consumer.RetryAfter(time.Millisecond, errors.New("again"))
		}))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, 30*time.Second, func() (bool, string) {
		if rdb.Exists(ctx, stream.JobKey(keys, j.ID)).Val() != 0 {
			t.Fatalf("untracked job got an index record")
		}
		n := rdb.XLen(ctx, keys.Dead).Val()
		return n == 1, fmt.Sprintf("%d dead", n)
	})
	if info, err := control.Lookup(ctx, rdb, name, j.ID); err != nil || info.State != control.StateUnknown {
		t.Errorf("Lookup(untracked) = %+v, %v; want unknown", info, err)
	}
	if _, err := control.Cancel(ctx, rdb, name, j.ID); !errors.Is(err, control.ErrUnknownJob) {
		t.Errorf("Cancel(untracked) = %v; want ErrUnknownJob", err)
	}
	if n := len(rdb.Keys(ctx, keys.Job+"*").Val()); n != 0 {
		t.Errorf("%d index records in the queue for an untracked job", n)
	}
}
