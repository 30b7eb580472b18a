package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// Replay through the idempotency middleware (README, Locks and idempotency;
// runbook step 5): after a fix, jobs that died exhausted, by a panic or
// crashed run again; one whose operation completed meanwhile is acknowledged
// without running; one that died permanent dies again without running unless
// replayed with --forget-failed-idempotency.

// a9CLI runs pelican with args against addr and returns its output and
// exit code.
func a9CLI(t *testing.T, addr string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(pelicanCLI(t), append([]string{"--redis", "redis://" + addr + "/0"}, args...)...)
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

// a9IdemJob returns a job with behaviour b and idempotency key key.
func a9IdemJob(t *testing.T, b a9Job, key string) *stream.Job {
	t.Helper()
	j, err := stream.NewJSONJob("a9", b)
	if err != nil {
		t.Fatal(err)
	}
	j.IdempotencyKey = key
	return j
}

func TestAttack9_replay_throughIdempotency(t *testing.T) {
	t.Parallel()
	s := newA9Scenario(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t, s.rdb) + "idem:"
	store := idem.NewRedisStore(s.rdb, idem.RedisConfig{})
	mws := []consumer.Middleware{
		middleware.Idempotency(store, middleware.IdempotencyConfig{Prefix: prefix, Lease: 5 * time.Second, InProgressDelay: 50 * time.Millisecond, Logger: quietA9()}),
		middleware.Retry(middleware.RetryConfig{}),
	}
	key := func(n string) string { return s.stream + ":" + n }
	jobs := map[string]*stream.Job{
		"exhausted": a9IdemJob(t, a9Job{Broken: true, Fail: "retry"}, key("exhausted")),
		"panic":     a9IdemJob(t, a9Job{Broken: true, Fail: "panic"}, key("panic")),
		"permanent": a9IdemJob(t, a9Job{Broken: true, Fail: "permanent"}, key("permanent")),
		"completed": a9IdemJob(t, a9Job{Broken: true, Fail: "retry"}, key("completed")),
	}
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	for _, j := range jobs {
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	c := s.a9Run("c1", consumer.Config{MaxAttempts: 2, Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond}}, mws...)
	eventually(t, time.Minute, func() (bool, string) {
		q := s.a9State("g")
		return q.Dead == 4 && q.Pending == 0 && q.Delayed == 0, fmt.Sprint(q)
	})
	dead := s.a9DeadByJob()
	for name, want := range map[string]string{"exhausted": "exhausted", "panic": "panic", "permanent": "permanent", "completed": "exhausted"} {
		if got := dead[jobs[name].ID]; len(got) != 1 || got[0] != want {
			t.Fatalf("job %s dead-lettered as %v, want %s", name, got, want)
		}
	}
	// Meanwhile another job of the key "completed" completes the operation.
	other := a9IdemJob(t, a9Job{N: 1}, key("completed"))
	if _, err := p.Enqueue(ctx, other); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		return countEvents(readLedger(t, s.ledger), "effect")[other.ID] == 1 && s.a9Idle("g"), "the other job of the key did not complete"
	})
	startsBefore := countEvents(readLedger(t, s.ledger), "start")

	// Deploy the fix and replay every dead job (Go API, records as they are).
	if err := os.WriteFile(s.ledger+".fix", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := dlq.New(s.rdb, s.stream, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil || res.Replayed != 4 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		led := readLedger(t, s.ledger)
		eff := countEvents(led, "effect")
		q := s.a9State("g")
		return eff[jobs["exhausted"].ID] == 1 && eff[jobs["panic"].ID] == 1 && q.Dead == 1 && q.Pending == 0 && q.Delayed == 0,
			fmt.Sprintf("effects exhausted=%d panic=%d, %v", eff[jobs["exhausted"].ID], eff[jobs["panic"].ID], q)
	})
	led := readLedger(t, s.ledger)
	starts := countEvents(led, "start")
	if n := starts[jobs["completed"].ID] - startsBefore[jobs["completed"].ID]; n != 0 {
		t.Errorf("the job whose operation completed meanwhile ran %d times after the replay, want 0 (acknowledged without running)", n)
	}
	if n := starts[jobs["permanent"].ID] - startsBefore[jobs["permanent"].ID]; n != 0 {
		t.Errorf("the permanent job ran %d times after a plain replay, want 0", n)
	}
	dl := s.a9DeadLetters()
	if len(dl) != 1 || dl[0].JobID != jobs["permanent"].ID || dl[0].Reason != "permanent" {
		t.Fatalf("dead letters after the replay: %+v, want the permanent job only, reason permanent", dl)
	}

	// Replay it with the CLI, forgetting its failed record: it runs once.
	out, code := a9CLI(t, s.addr, "dlq", "replay", s.stream, "--reason", "permanent", "--forget-failed-idempotency",
		"--idempotency-prefix", prefix, "--yes")
	if code != 0 {
		t.Fatalf("pelican dlq replay exited %d:\n%s", code, out)
	}
	eventually(t, time.Minute, func() (bool, string) {
		n := countEvents(readLedger(t, s.ledger), "effect")[jobs["permanent"].ID]
		q := s.a9State("g")
		return n == 1 && q.Dead == 0 && q.Pending == 0, fmt.Sprintf("permanent job effects %d, %v\n%s", n, q, out)
	})
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	eff := countEvents(readLedger(t, s.ledger), "effect")
	for name, j := range jobs {
		want := 1
		if name == "completed" {
			want = 0
		}
		if eff[j.ID] != want {
			t.Errorf("job %s: %d effects, want %d", name, eff[j.ID], want)
		}
	}
}

// A job that crashed its workers (dead-lettered crashed, with the
// idempotency middleware in the chain, so its processing record was left to
// its lease) runs again after a fix and a replay, once.
func TestAttack9_replay_crashedThroughIdempotency(t *testing.T) {
	t.Parallel()
	s := newA9Scenario(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t, s.rdb) + "idem:"
	// The lease (300ms) passes before a crashed worker is back (1s): a
	// shorter restart meets the crashed run's record in progress (see
	// TestAttack9_poison_idempotencyLeaseLoops).
	cfg := a9Config{Idem: true, IdemPrefix: prefix, IdemLease: 300 * time.Millisecond, MaxCrashes: 2, MaxAttempts: 3}
	// The bug crashes the workers named "old"; the fixed deployment has
	// other names.
	ids := s.a9Enqueue(a9Job{SleepMS: 100, Crash: "before", CrashOn: "old"}, a9Job{N: 1})
	sv := s.a9Supervise([]string{"old"}, cfg, false)
	sv.delay = time.Second
	sv.until(2*time.Minute, func() (bool, string) {
		dead := s.a9DeadByJob()
		return len(dead[ids[0]]) == 1, fmt.Sprintf("not dead yet: %v", s.a9State("g"))
	})
	sv.stopAll()
	if got := s.a9DeadByJob()[ids[0]]; got[0] != consumer.ReasonCrashed {
		t.Fatalf("dead-lettered as %v, want crashed", got)
	}
	before := countEvents(readLedger(t, s.ledger), "start")[ids[0]]
	// The fix: a worker that does not crash on it.
	w := s.a9Worker("fixed", cfg)
	d, err := dlq.New(s.rdb, s.stream, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := d.Replay(ctx, dlq.Filter{Reasons: []string{consumer.ReasonCrashed}}, dlq.ReplayOptions{}); err != nil || res.Replayed != 1 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		n := countEvents(readLedger(t, s.ledger), "effect")[ids[0]]
		return n == 1 && s.a9Idle("g"), fmt.Sprintf("effects %d, %v", n, s.a9State("g"))
	})
	w.term()
	w.wait(30 * time.Second)
	led := readLedger(t, s.ledger)
	if n := countEvents(led, "effect")[ids[0]]; n != 1 {
		t.Errorf("effects %d, want 1", n)
	}
	t.Logf("starts before the replay %d, after %d", before, countEvents(led, "start")[ids[0]])
	if d := s.dead(); len(d) != 0 {
		t.Errorf("dead letters left: %d", len(d))
	}
}

// --forget-failed-idempotency forgets failed records only: a job that died
// exhausted and whose operation another job of its key then completed is
// replayed with the flag, and is acknowledged without running.
func TestAttack9_replay_forgetKeepsCompleted(t *testing.T) {
	t.Parallel()
	s := newA9Scenario(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t, s.rdb) + "idem:"
	store := idem.NewRedisStore(s.rdb, idem.RedisConfig{})
	mws := []consumer.Middleware{
		middleware.Idempotency(store, middleware.IdempotencyConfig{Prefix: prefix, Lease: 5 * time.Second, InProgressDelay: 50 * time.Millisecond, Logger: quietA9()}),
		middleware.Retry(middleware.RetryConfig{}),
	}
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	key := s.stream + ":op"
	dying := a9IdemJob(t, a9Job{Fail: "retry"}, key)
	if _, err := p.Enqueue(ctx, dying); err != nil {
		t.Fatal(err)
	}
	s.a9Run("c1", consumer.Config{MaxAttempts: 2, Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond}}, mws...)
	eventually(t, time.Minute, func() (bool, string) {
		return len(s.a9DeadByJob()[dying.ID]) == 1 && s.a9Idle("g"), fmt.Sprint(s.a9State("g"))
	})
	other := a9IdemJob(t, a9Job{N: 1}, key)
	if _, err := p.Enqueue(ctx, other); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		return countEvents(readLedger(t, s.ledger), "effect")[other.ID] == 1 && s.a9Idle("g"), "other job not done"
	})
	before := countEvents(readLedger(t, s.ledger), "start")[dying.ID]
	out, code := a9CLI(t, s.addr, "dlq", "replay", s.stream, "--forget-failed-idempotency", "--idempotency-prefix", prefix, "--yes")
	if code != 0 {
		t.Fatalf("replay exited %d:\n%s", code, out)
	}
	eventually(t, time.Minute, func() (bool, string) {
		q := s.a9State("g")
		return q.Dead == 0 && q.Len == 0 && s.a9Idle("g"), fmt.Sprint(q)
	})
	if n := countEvents(readLedger(t, s.ledger), "start")[dying.ID] - before; n != 0 {
		t.Errorf("the replayed job ran %d times although its operation had completed", n)
	}
	o, err := store.Begin(ctx, prefix+key, "probe", time.Second)
	if err != nil || o.Status != idem.StatusCompleted {
		t.Errorf("record after the replay: %+v %v, want completed", o, err)
	}
}
