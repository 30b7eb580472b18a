package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Smaller promises: Stats.Snoozed vs Stats.Retried, the final error in dead
// letters, the exact DeadLetterMaxLen, and the CLI's exit code 4.

// a9Consume runs h on s's stream in two consumers until every job of ids
// settled, and returns the sum of their stats.
func a9Consume(t *testing.T, s *scenario, cfg consumer.Config, h consumer.HandlerFunc, until func() (bool, string), mws ...consumer.Middleware) consumer.Stats {
	t.Helper()
	cfg.Stream, cfg.Group = s.stream, "g"
	cfg.Block = 200 * time.Millisecond
	cfg.PromoteInterval = 20 * time.Millisecond
	cfg.Logger = quietA9()
	if cfg.Backoff == (consumer.Backoff{}) {
		cfg.Backoff = consumer.Backoff{Base: 10 * time.Millisecond, Cap: 10 * time.Millisecond}
	}
	var cs []*consumer.Consumer
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		cfg.Consumer = fmt.Sprintf("c%d", i)
		c := consumer.New(s.rdb, cfg).Use(mws...).Handle(h)
		cs = append(cs, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(context.Background()); err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}
	stop := func() {
		for _, c := range cs {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = c.Shutdown(ctx)
			cancel()
		}
		wg.Wait()
	}
	defer stop()
	eventually(t, time.Minute, until)
	stop()
	var sum consumer.Stats
	for _, c := range cs {
		st := c.Stats()
		sum.Acked += st.Acked
		sum.Retried += st.Retried
		sum.Snoozed += st.Snoozed
		sum.DeadLettered += st.DeadLettered
		sum.DeadTrimmed += st.DeadTrimmed
		sum.Suspects += st.Suspects
	}
	return sum
}

// Snoozes are counted in Stats.Snoozed, not Stats.Retried, and keep the
// job's attempt; retries are counted in Stats.Retried and increment it.
func TestAttack9_small_snoozedVsRetried(t *testing.T) {
	t.Parallel()
	for _, withRetryMW := range []bool{false, true} {
		t.Run(fmt.Sprintf("retryMiddleware=%v", withRetryMW), func(t *testing.T) {
			t.Parallel()
			s := newA9Scenario(t)
			ids := s.a9Enqueue(a9Repeat(30, a9Job{})...)
			kind := map[string]string{}
			for i, id := range ids {
				kind[id] = []string{"snooze", "retry", "ok"}[i%3]
			}
			var mu sync.Mutex
			runs := map[string][]int{} // job -> attempts seen
			done := map[string]bool{}
			h := func(ctx context.Context, j *stream.Job) error {
				mu.Lock()
				runs[j.ID] = append(runs[j.ID], j.Attempt)
				first := len(runs[j.ID]) == 1
				mu.Unlock()
				if first {
					switch kind[j.ID] {
					case "snooze":
						return consumer.Snooze(10 * time.Millisecond)
					case "retry":
						if withRetryMW {
							return consumer.Retryable(errors.New("try again"))
						}
						return consumer.Retry(10*time.Millisecond, errors.New("try again"))
					}
				}
				mu.Lock()
				done[j.ID] = true
				mu.Unlock()
				return nil
			}
			var mws []consumer.Middleware
			if withRetryMW {
				mws = append(mws, middleware.Retry(middleware.RetryConfig{}))
			}
			st := a9Consume(t, s, consumer.Config{}, h, func() (bool, string) {
				mu.Lock()
				n := len(done)
				mu.Unlock()
				return n == 30 && s.a9Idle("g"), fmt.Sprintf("%d done, %v", n, s.a9State("g"))
			}, mws...)
			if st.Snoozed != 10 || st.Retried != 10 || st.Acked != 30 || st.DeadLettered != 0 {
				t.Errorf("stats %+v, want Snoozed 10, Retried 10, Acked 30, DeadLettered 0", st)
			}
			for id, at := range runs {
				want := []int{0, 0}
				switch kind[id] {
				case "retry":
					want = []int{0, 1}
				case "ok":
					want = []int{0}
				}
				if fmt.Sprint(at) != fmt.Sprint(want) {
					t.Errorf("%s job ran with attempts %v, want %v", kind[id], at, want)
				}
			}
		})
	}
}

// A dead letter carries the final error in last_error and error_history
// (the latest 5), as a retry would, with dead_error the exhausted text.
func TestAttack9_small_deadLetterFinalError(t *testing.T) {
	t.Parallel()
	for _, withRetryMW := range []bool{false, true} {
		t.Run(fmt.Sprintf("retryMiddleware=%v", withRetryMW), func(t *testing.T) {
			t.Parallel()
			s := newA9Scenario(t)
			ctx := context.Background()
			p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
			mk := func(kind string, max int) *stream.Job {
				j := mustJob(t, map[string]any{"kind": kind})
				j.MaxAttempts = max
				if _, err := p.Enqueue(ctx, j); err != nil {
					t.Fatal(err)
				}
				return j
			}
			jobs := map[string]*stream.Job{
				"exhausted3": mk("retry", 3),
				"exhausted8": mk("retry", 8),
				"permanent":  mk("permanent", 0),
				"panic":      mk("panic", 0),
				"custom":     mk("custom", 0),
			}
			h := func(ctx context.Context, j *stream.Job) error {
				var b struct{ Kind string }
				if err := j.Decode(&b); err != nil {
					return err
				}
				e := fmt.Errorf("failure-%s-attempt-%d", b.Kind, j.Attempt)
				switch b.Kind {
				case "retry":
					if withRetryMW {
						return consumer.Retryable(e)
					}
					return e
				case "permanent":
					return consumer.Permanent(e)
				case "panic":
					panic(e.Error())
				case "custom":
					return consumer.Dead("mine", e)
				}
				return nil
			}
			var mws []consumer.Middleware
			if withRetryMW {
				mws = append(mws, middleware.Retry(middleware.RetryConfig{}))
			}
			a9Consume(t, s, consumer.Config{}, h, func() (bool, string) {
				q := s.a9State("g")
				return q.Dead == 5 && q.Pending == 0 && q.Delayed == 0, fmt.Sprint(q)
			}, mws...)
			byJob := map[string]a9Dead{}
			for _, d := range s.a9DeadLetters() {
				byJob[d.JobID] = d
			}
			check := func(name, reason, last string, history []string, deadErr string) {
				t.Helper()
				d, ok := byJob[jobs[name].ID]
				if !ok {
					t.Errorf("%s: not dead-lettered", name)
					return
				}
				if d.Reason != reason {
					t.Errorf("%s: dead_reason %q, want %q", name, d.Reason, reason)
				}
				if !strings.Contains(d.LastError, last) {
					t.Errorf("%s: last_error %q, want it to hold %q", name, d.LastError, last)
				}
				var h []string
				if err := json.Unmarshal([]byte(d.ErrorHistory), &h); err != nil {
					t.Errorf("%s: error_history %q: %v", name, d.ErrorHistory, err)
					return
				}
				if len(h) != len(history) {
					t.Errorf("%s: error_history %q, want %d entries ending with the final error", name, h, len(history))
					return
				}
				for i := range h {
					if !strings.Contains(h[i], history[i]) {
						t.Errorf("%s: error_history[%d] = %q, want it to hold %q", name, i, h[i], history[i])
					}
				}
				if !strings.Contains(d.Error, deadErr) {
					t.Errorf("%s: dead_error %q, want it to hold %q", name, d.Error, deadErr)
				}
			}
			check("exhausted3", "exhausted", "failure-retry-attempt-2",
				[]string{"attempt-0", "attempt-1", "attempt-2"}, "attempt 3 of 3: failure-retry-attempt-2")
			check("exhausted8", "exhausted", "failure-retry-attempt-7",
				[]string{"attempt-3", "attempt-4", "attempt-5", "attempt-6", "attempt-7"}, "attempt 8 of 8: failure-retry-attempt-7")
			check("permanent", "permanent", "failure-permanent-attempt-0", []string{"failure-permanent-attempt-0"}, "failure-permanent-attempt-0")
			check("panic", "panic", "failure-panic-attempt-0", []string{"failure-panic-attempt-0"}, "failure-panic-attempt-0")
			check("custom", "mine", "failure-custom-attempt-0", []string{"failure-custom-attempt-0"}, "failure-custom-attempt-0")
		})
	}
}

// DeadLetterMaxLen bounds the dead-letter stream exactly, with concurrent
// consumers, and every entry trimmed is counted in Stats.DeadTrimmed.
func TestAttack9_small_deadLetterMaxLenExact(t *testing.T) {
	t.Parallel()
	for _, max := range []int64{1, 3, 7} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			t.Parallel()
			s := newA9Scenario(t)
			const n = 40
			s.a9Enqueue(a9Repeat(n, a9Job{Fail: "permanent"})...)
			var mu sync.Mutex
			deadSeen := 0
			h := func(ctx context.Context, j *stream.Job) error {
				mu.Lock()
				deadSeen++
				mu.Unlock()
				return consumer.Permanent(errors.New("no"))
			}
			st := a9Consume(t, s, consumer.Config{DeadLetterMaxLen: max, Concurrency: 8}, h, func() (bool, string) {
				q := s.a9State("g")
				mu.Lock()
				defer mu.Unlock()
				return deadSeen == n && q.Pending == 0, fmt.Sprintf("%d run, %v", deadSeen, q)
			})
			if l := s.a9State("g").Dead; l != max {
				t.Errorf("dead-letter stream length %d, want exactly %d", l, max)
			}
			if st.DeadLettered != n || st.DeadTrimmed != uint64(n-max) {
				t.Errorf("stats %+v: want DeadLettered %d and DeadTrimmed %d", st, n, n-max)
			}
		})
	}
}

// pelican dlq ls|show|replay|purge on a stream that exists neither itself
// nor as a dead-letter stream exits 4; on a stream that exists, or whose
// dead-letter stream exists, they do not.
func TestAttack9_small_cliMissingStreamExit4(t *testing.T) {
	t.Parallel()
	s := newA9Scenario(t)
	ctx := context.Background()
	missing := s.stream + ":nosuch"
	for _, args := range [][]string{
		{"dlq", "ls", missing},
		{"dlq", "ls", missing, "--output", "json"},
		{"dlq", "show", missing, "1-0"},
		{"dlq", "replay", missing, "--yes"},
		{"dlq", "replay", missing, "--dry-run"},
		{"dlq", "replay", missing, "--reason", "panic", "--yes", "--forget-failed-idempotency"},
		{"dlq", "purge", missing, "--yes"},
		{"dlq", "purge", missing, "--dry-run"},
	} {
		out, code := a9CLI(t, s.addr, args...)
		if code != 4 {
			t.Errorf("pelican %s: exit %d, want 4\n%s", strings.Join(args, " "), code, out)
		}
	}
	// The source exists (no dead-letter stream): not "not found".
	if _, err := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream}).Enqueue(ctx, mustJob(t, map[string]any{})); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"dlq", "ls", s.stream}, {"dlq", "replay", s.stream, "--yes"}, {"dlq", "purge", s.stream, "--yes"}} {
		if out, code := a9CLI(t, s.addr, args...); code != 0 {
			t.Errorf("pelican %s (source exists): exit %d, want 0\n%s", strings.Join(args, " "), code, out)
		}
	}
	// Only the dead-letter stream exists.
	s.rdb.Del(ctx, s.stream)
	s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s.keys.Dead, Values: []any{"type", "t", "dead_reason", "panic"}})
	for _, args := range [][]string{{"dlq", "ls", s.stream}, {"dlq", "purge", s.stream, "--dry-run"}} {
		if out, code := a9CLI(t, s.addr, args...); code != 0 {
			t.Errorf("pelican %s (only the dead-letter stream exists): exit %d, want 0\n%s", strings.Join(args, " "), code, out)
		}
	}
	// A key of another type is a failure (1), not "not found".
	s.rdb.Set(ctx, missing, "x", time.Minute)
	t.Cleanup(func() { s.rdb.Del(context.Background(), missing) })
	if out, code := a9CLI(t, s.addr, "dlq", "ls", missing); code != 1 {
		t.Errorf("pelican dlq ls on a string key: exit %d, want 1\n%s", code, out)
	}
}
