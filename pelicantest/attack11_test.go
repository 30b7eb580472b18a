package pelicantest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/pelicantest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// a11Backends runs f on the embedded Redis and, when 127.0.0.1:6379 answers,
// on the real one through PELICAN_TEST_REDIS.
func a11Backends(t *testing.T, f func(t *testing.T)) {
	t.Run("embedded", func(t *testing.T) { t.Setenv(pelicantest.EnvRedis, ""); f(t) })
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer c.Close()
	if c.Ping(context.Background()).Err() != nil {
		return
	}
	t.Run("real", func(t *testing.T) { t.Setenv(pelicantest.EnvRedis, "redis://127.0.0.1:6379/0"); f(t) })
}

// Promise: Run reports "the Outcome (done, retried, snoozed, dead) read back
// from Redis": check each against what is really in Redis afterwards.
func TestAttack11_RunOutcomeIsWhatRedisHolds(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name    string
		max     int
		h       func() error
		want    pelicantest.Outcome
		reason  string
		attempt int
	}{
		{"done", 0, func() error { return nil }, pelicantest.Done, "", 0},
		{"retry", 5, func() error { return consumer.Retry(time.Minute, boom) }, pelicantest.Retried, "", 1},
		{"retry-last-attempt", 1, func() error { return consumer.Retry(time.Minute, boom) }, pelicantest.Dead, "exhausted", 0},
		{"plain-error-last-attempt", 1, func() error { return boom }, pelicantest.Dead, "exhausted", 0},
		{"retry-now", 5, func() error { return consumer.Retry(0, boom) }, pelicantest.Retried, "", 1},
		{"snooze", 1, func() error { return consumer.Snooze(30 * time.Second) }, pelicantest.Snoozed, "", 0},
		{"permanent", 5, func() error { return consumer.Permanent(boom) }, pelicantest.Dead, "permanent", 0},
		{"wrapped-permanent", 5, func() error { return fmt.Errorf("outer: %w", consumer.Permanent(boom)) }, pelicantest.Dead, "permanent", 0},
		{"dead-custom", 5, func() error { return consumer.Dead("a11custom", boom) }, pelicantest.Dead, "a11custom", 0},
	}
	for _, c := range cases {
		c := c
		t.Run(c.name, func(t *testing.T) {
			a11Backends(t, func(t *testing.T) {
				r := pelicantest.NewRedis(t)
				ctx := context.Background()
				job, err := stream.NewJSONJob("a11.job", map[string]int{"n": 1})
				if err != nil {
					t.Fatal(err)
				}
				job.MaxAttempts = c.max
				res := pelicantest.Run(t, consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error { return c.h() }), job,
					pelicantest.WithRedis(r))
				if res.Outcome != c.want || res.Reason != c.reason {
					t.Errorf("Run: outcome %q reason %q, want %q %q (err %v)", res.Outcome, res.Reason, c.want, c.reason, res.Err)
				}
				keys, err := stream.KeysFor(r.Name("jobs"))
				if err != nil {
					t.Fatal(err)
				}
				dead, _ := r.Client.XRange(ctx, keys.Dead, "-", "+").Result()
				delayed, _ := r.Client.ZCard(ctx, keys.Delayed).Result()
				entries, _ := r.Client.XRange(ctx, keys.Stream, "-", "+").Result()
				pend, _ := r.Client.XPending(ctx, keys.Stream, "pelicantest").Result()
				var pending int64
				if pend != nil {
					pending = pend.Count
				}
				switch res.Outcome {
				case pelicantest.Dead:
					if len(dead) != 1 || dead[0].Values["dead_reason"] != res.Reason {
						t.Errorf("Run says dead (%q) but the dead-letter stream holds %v", res.Reason, dead)
					}
				case pelicantest.Retried, pelicantest.Snoozed:
					if len(dead) != 0 || delayed+int64(len(entries)) == 0 {
						t.Errorf("Run says %s but dead=%d delayed=%d entries=%d", res.Outcome, len(dead), delayed, len(entries))
					}
					if res.Next == nil || res.Next.Attempt != c.attempt {
						t.Errorf("Next %+v, want attempt %d", res.Next, c.attempt)
					}
					if (res.Due.IsZero()) != (delayed == 0) {
						t.Errorf("Due %v but delayed set holds %d", res.Due, delayed)
					}
				case pelicantest.Done:
					if len(dead) != 0 || delayed != 0 || pending != 0 {
						t.Errorf("Run says done but dead=%d delayed=%d pending=%d", len(dead), delayed, pending)
					}
				}
				if pending != 0 && c.name != "retry-now" { // a retry without delay is read and held (documented)
					t.Errorf("the delivery is still pending after Run: %d", pending)
				}
				if c.name == "retry" && res.Delay != time.Minute {
					t.Errorf("Delay %v, want the 1m the chain gave", res.Delay)
				}
			})
		})
	}
}

type a11TB struct {
	msgs     []string
	cleanups []func()
}

func (f *a11TB) Helper() {}
func (f *a11TB) Fatalf(format string, a ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, a...))
	panic(f)
}
func (f *a11TB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// Promise: RequireEnqueued finds a stream entry "or else a job waiting in its
// delayed set", and fails "listing the types and IDs of the jobs it found
// (never their payloads)".
func TestAttack11_RequireEnqueued(t *testing.T) {
	a11Backends(t, func(t *testing.T) {
		r := pelicantest.NewRedis(t)
		ctx := context.Background()
		name := r.Name("mail")
		p := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: name})
		secret := "SECRET-PAYLOAD-a11"
		j1, _ := stream.NewJSONJob("a11.now", map[string]string{"s": secret})
		if _, err := p.Enqueue(ctx, j1); err != nil {
			t.Fatal(err)
		}
		j2, _ := stream.NewJSONJob("a11.later", map[string]string{"s": secret})
		if err := p.EnqueueIn(ctx, j2, time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := pelicantest.RequireEnqueued(t, r.Client, name, pelicantest.Type("a11.later")); got == nil || got.ID != j2.ID {
			t.Fatalf("delayed job not found: %+v", got)
		}
		if got := pelicantest.RequireEnqueued(t, r.Client, name, pelicantest.Type("a11.now")); got == nil || got.ID != j1.ID || got.Stream != name {
			t.Fatalf("stream job not found: %+v", got)
		}
		f := &a11TB{}
		func() {
			defer func() { recover() }()
			pelicantest.RequireEnqueued(f, r.Client, name, pelicantest.Type("a11.none"))
		}()
		if len(f.msgs) != 1 {
			t.Fatalf("RequireEnqueued of a missing type did not fail: %v", f.msgs)
		}
		m := f.msgs[0]
		if strings.Contains(m, secret) || !strings.Contains(m, "a11.now") || !strings.Contains(m, "a11.later") || !strings.Contains(m, j1.ID) {
			t.Fatalf("failure message must list types and IDs, never payloads: %q", m)
		}
	})
}

// Promise: on a real server each test's keys live under a namespace of its own,
// "tests running at once never meet", Advance moves time "for every key of the
// test" (so for no other key), and the cleanup deletes every key of the namespace.
func TestAttack11_NewRedisIsolationAndAdvance(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer c.Close()
	ctx := context.Background()
	if c.Ping(ctx).Err() != nil {
		t.Skip("no real Redis")
	}
	t.Setenv(pelicantest.EnvRedis, "redis://127.0.0.1:6379/0")
	outside := fmt.Sprintf("a11-outside-%d", time.Now().UnixNano())
	outsideTagged := "{" + outside + "}:lock:x"
	c.Set(ctx, outside, "1", time.Hour)
	c.Set(ctx, outsideTagged, "1", time.Hour)
	c.ZAdd(ctx, "{"+outside+"}:delayed", redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "m"})
	defer c.Del(ctx, outside, outsideTagged, "{"+outside+"}:delayed")

	var names [2]string
	var keysOf [2][]string
	for i := 0; i < 2; i++ {
		i := i
		t.Run(fmt.Sprint("t", i), func(t *testing.T) {
			r := pelicantest.NewRedis(t)
			names[i] = r.Name("jobs")
			k, _ := stream.KeysFor(names[i])
			r.Client.Set(ctx, k.Lock+"{a}", "x", 10*time.Minute)
			r.Client.Set(ctx, r.Name("plain"), "x", 10*time.Minute)
			p := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: names[i]})
			j, _ := stream.NewJSONJob("a11", 1)
			if err := p.EnqueueIn(ctx, j, 5*time.Minute); err != nil {
				t.Fatal(err)
			}
			r.Advance(t, 6*time.Minute)
			if ttl, _ := r.Client.PTTL(ctx, k.Lock+"{a}").Result(); ttl > 4*time.Minute+time.Second {
				t.Errorf("Advance(6m) did not run the test's lock TTL down: %v", ttl)
			}
			jobs, err := pelicantest.Jobs(ctx, r.Client, names[i])
			if err != nil || len(jobs) != 1 {
				t.Fatalf("Jobs: %v %v", jobs, err)
			}
			keysOf[i], _ = r.Client.Keys(ctx, "*"+strings.TrimSuffix(names[i], "jobs")+"*").Result()
		})
	}
	if names[0] == names[1] {
		t.Fatalf("two tests got the same key for jobs: %q", names[0])
	}
	for _, k := range []string{outside, outsideTagged} {
		if ttl, _ := c.PTTL(ctx, k).Result(); ttl < 50*time.Minute {
			t.Errorf("Advance in a test moved the TTL of %q, a key outside its namespace: %v", k, ttl)
		}
	}
	if sc, _ := c.ZScore(ctx, "{"+outside+"}:delayed", "m").Result(); sc < float64(time.Now().Add(50*time.Minute).UnixMilli()) {
		t.Errorf("Advance moved a delayed set outside the namespace")
	}
	for i := range names {
		ns := strings.TrimSuffix(names[i], "jobs")
		left, _ := c.Keys(ctx, "*"+ns+"*").Result()
		if len(left) != 0 {
			t.Errorf("cleanup left keys of namespace %q: %v (had %v)", ns, left, keysOf[i])
		}
	}
}

// Promise: Run "runs a consumer ... until that delivery has settled" and
// reports Dead for a job "moved to the dead-letter stream"; Config.Panic
// "Defaults to PanicDeadLetter". A panicking handler's job is dead-lettered
// (the consumer's stats say DeadLettered:1), yet Run waits out its whole
// timeout and fails the test instead of returning Outcome Dead, reason panic.
func TestAttack11_RunPanicSettlesDead(t *testing.T) {
	a11Backends(t, func(t *testing.T) {
		r := pelicantest.NewRedis(t)
		job, _ := stream.NewJSONJob("a11.panic", 1)
		res := pelicantest.Run(t, consumer.HandlerFunc(func(context.Context, *stream.Job) error { panic("a11 panic") }), job,
			pelicantest.WithRedis(r))
		if res.Outcome != pelicantest.Dead || res.Reason != "panic" {
			t.Fatalf("outcome %q reason %q, want dead/panic", res.Outcome, res.Reason)
		}
		keys, _ := stream.KeysFor(r.Name("jobs"))
		if n, _ := r.Client.XLen(context.Background(), keys.Dead).Result(); n != 1 {
			t.Fatalf("dead letters: %d, want 1", n)
		}
	})
}
