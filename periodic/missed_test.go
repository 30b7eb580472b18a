package periodic

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// runUntil runs a scheduler of sched on stream name until it has at least
// n entries, and returns the Redis time (as the scheduler measured it) when
// it started and the first tick it tried.
func runUntil(t *testing.T, rdb redis.UniversalClient, name string, sched Schedule, n int64) (started, first time.Time) {
	t.Helper()
	s, err := New(rdb, Config{Stream: name, Schedules: []Schedule{sched}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	s.observe = func(_ string, tick time.Time, status string, late time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if status == "start" {
			started = tick.Add(late)
		} else if first.IsZero() {
			first = tick
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	waitLen(t, rdb, name, n, sched.Every)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return started, first
}

// TestScheduler_missed stops the only scheduler of a one-second schedule
// (tolerance 200 ms) for over three seconds and starts another 400 to
// 700 ms into a second: with Skip nothing is enqueued for the downtime,
// with RunOnce exactly one job, for the latest tick, late; then the
// schedule goes on tick by tick.
func TestScheduler_missed(t *testing.T) {
	t.Parallel()
	for _, policy := range []Missed{Skip, RunOnce} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			redistest.Widen(t, "downtime", 3*time.Second, func(t *testing.T, downtime time.Duration) time.Duration {
				rdb := redistest.Shared(t)
				name := "{" + redistest.Name(t) + "}"
				t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
				sched := Schedule{Name: "hb", Type: "ping", Every: time.Second, Tolerance: 200 * time.Millisecond, Missed: policy}
				_, _ = runUntil(t, rdb, name, sched, 2)
				jobs := entries(t, rdb, name)
				lastA := tickOf(t, "hb", jobs[len(jobs)-1].ID)
				var r0 time.Time
				for {
					r0 = redisNow(t, rdb)
					if ms := r0.UnixMilli() % 1000; r0.UnixMilli() >= lastA+downtime.Milliseconds() && ms >= 400 && ms < 700 {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				started, first := runUntil(t, rdb, name, sched, int64(len(jobs))+2)
				latest := r0.Truncate(time.Second)
				if !started.Before(latest.Add(time.Second)) {
					t.Logf("the scheduler started at %v, in the second after the one planned (Redis time was %v): again", started, r0)
					return 2 * downtime
				}
				if policy == RunOnce && !first.Equal(latest) || policy == Skip && !first.Equal(latest.Add(time.Second)) {
					t.Errorf("started at %v, the scheduler first tried tick %v", started, first)
				}

				msgs, _ := rdb.XRange(context.Background(), name, "-", "+").Result()
				var during []int64
				var after []int64
				for _, m := range msgs {
					tick := tickOf(t, "hb", m.Values["job_id"].(string))
					switch {
					case tick > lastA && tick <= r0.UnixMilli():
						during = append(during, tick)
						if policy == RunOnce && entryMS(t, m.ID)-tick < 200 {
							t.Errorf("the catch-up of tick %d was enqueued within its tolerance, at %s", tick, m.ID)
						}
					case tick > r0.UnixMilli():
						after = append(after, tick)
					}
				}
				switch policy {
				case Skip:
					if len(during) != 0 {
						t.Errorf("Skip enqueued %v for the downtime (%d, %v]", during, lastA, r0)
					}
				case RunOnce:
					if len(during) != 1 || during[0] != latest.UnixMilli() {
						t.Errorf("RunOnce enqueued %v for the downtime (%d, %v], want only the latest tick %d", during, lastA, r0, latest.UnixMilli())
					}
				}
				if len(after) < 1 || after[0] != latest.Add(time.Second).UnixMilli() {
					t.Errorf("after the restart: ticks %v, want from %d on", after, latest.Add(time.Second).UnixMilli())
				}
				for i := 1; i < len(after); i++ {
					if after[i] != after[i-1]+1000 {
						t.Errorf("after the restart: ticks %v are not consecutive", after)
					}
				}
				return 0
			})
		})
	}
}
