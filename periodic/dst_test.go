package periodic

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// fakeClock is a local clock that Sleep advances at once, with miniredis's
// clock (TIME, entry IDs) kept equal to it; it cancels the run when it
// passes end.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	end    time.Time
	m      *miniredis.Miniredis
	cancel context.CancelFunc
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.m.SetTime(c.now)
	past := c.now.After(c.end)
	c.mu.Unlock()
	if past {
		c.cancel()
	}
	return ctx.Err()
}

// runFake runs a scheduler of sched on miniredis with a fake clock from
// from to to, and returns the stream's jobs' IDs in order.
func runFake(t *testing.T, sched Schedule, from, to time.Time) []string {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := New(rdb, Config{Stream: "q", Schedules: []Schedule{sched}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.SetTime(from)
	s.clock = &fakeClock{now: from, end: to, m: m, cancel: cancel}
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range entries(t, rdb, "q") {
		ids = append(ids, j.ID)
	}
	msgs, _ := rdb.XRange(context.Background(), "q", "-", "+").Result()
	for i, msg := range msgs {
		tick, err := time.Parse("2006-01-02T15:04:05.000Z", ids[i][len(sched.Name)+1:])
		if err != nil {
			t.Fatalf("job ID %q: %v", ids[i], err)
		}
		if at := entryMS(t, msg.ID); at < tick.UnixMilli() {
			t.Errorf("entry %s of %s is before its tick", msg.ID, ids[i])
		}
	}
	return ids
}

// TestScheduler_DST runs "30 2 * * *" and "30 1 * * *" in America/New_York
// through the 2026 spring-forward (March 8, 02:00 → 03:00) and fall-back
// (November 1, 02:00 → 01:00) with a fake clock: the ticks are the cron
// library's, each enqueued once: no 02:30 on March 8, two 01:30 on
// November 1 (EDT, then EST).
func TestScheduler_DST(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		cron     string
		from, to time.Time
		want     []string
	}{
		{"spring forward 02:30", "30 2 * * *", time.Date(2026, 3, 6, 12, 0, 0, 0, ny), time.Date(2026, 3, 10, 12, 0, 0, 0, ny), []string{
			"s@2026-03-07T07:30:00.000Z", // 02:30 EST
			// March 8: 02:30 does not exist
			"s@2026-03-09T06:30:00.000Z", // 02:30 EDT
			"s@2026-03-10T06:30:00.000Z",
		}},
		{"spring forward 01:30", "30 1 * * *", time.Date(2026, 3, 7, 12, 0, 0, 0, ny), time.Date(2026, 3, 9, 12, 0, 0, 0, ny), []string{
			"s@2026-03-08T06:30:00.000Z", // 01:30 EST, before the jump
			"s@2026-03-09T05:30:00.000Z", // 01:30 EDT
		}},
		{"fall back 01:30", "30 1 * * *", time.Date(2026, 10, 30, 12, 0, 0, 0, ny), time.Date(2026, 11, 2, 12, 0, 0, 0, ny), []string{
			"s@2026-10-31T05:30:00.000Z", // 01:30 EDT
			"s@2026-11-01T05:30:00.000Z", // 01:30 EDT
			"s@2026-11-01T06:30:00.000Z", // 01:30 EST, the repeated hour
			"s@2026-11-02T06:30:00.000Z", // 01:30 EST
		}},
		{"fall back 02:30", "30 2 * * *", time.Date(2026, 10, 31, 12, 0, 0, 0, ny), time.Date(2026, 11, 2, 12, 0, 0, 0, ny), []string{
			"s@2026-11-01T07:30:00.000Z", // 02:30 EST, once
			"s@2026-11-02T07:30:00.000Z",
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := runFake(t, Schedule{Name: "s", Type: "t", Cron: tt.cron, Location: ny}, tt.from, tt.to)
			if len(got) != len(tt.want) {
				t.Fatalf("jobs = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("jobs = %v, want %v", got, tt.want)
				}
			}
		})
	}
}
