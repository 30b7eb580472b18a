package periodic

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// skewedClock is the real clock shifted by skew.
type skewedClock struct{ skew time.Duration }

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }

func (c skewedClock) Sleep(ctx context.Context, d time.Duration) error {
	return realClock{}.Sleep(ctx, d)
}

// TestScheduler_skewedClocks runs two schedulers whose local clocks are 3 s
// ahead of and 3 s behind Redis on a one-second schedule: the offset they
// measure from Redis puts their ticks on the Redis clock, so every tick is
// enqueued once, none early, and the skew costs no early refusals beyond
// the first tick.
func TestScheduler_skewedClocks(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := "{" + redistest.Name(t) + "}"
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	var mu sync.Mutex
	early := 0
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, skew := range []time.Duration{3 * time.Second, -3 * time.Second} {
		s, err := New(rdb, Config{Stream: name, Schedules: []Schedule{{Name: "hb", Type: "ping", Every: time.Second, Tolerance: time.Second}}})
		if err != nil {
			t.Fatal(err)
		}
		s.clock = skewedClock{skew}
		s.observe = func(_ string, _ time.Time, status string, _ time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			if status == "early" {
				early++
			}
		}
		wg.Go(func() { _ = s.Run(ctx) })
	}
	waitLen(t, rdb, name, 5, time.Second)
	cancel()
	wg.Wait()
	count := map[int64]int{}
	msgs, _ := rdb.XRange(context.Background(), name, "-", "+").Result()
	for _, m := range msgs {
		tick := tickOf(t, "hb", m.Values["job_id"].(string))
		if at := entryMS(t, m.ID); at < tick {
			t.Errorf("entry %s is %d ms before its tick %d", m.ID, tick-at, tick)
		}
		count[tick]++
	}
	for tick, c := range count {
		if c != 1 {
			t.Errorf("tick %d enqueued %d times", tick, c)
		}
	}
	if early > 2 {
		t.Errorf("%d early refusals: the schedulers aimed by their local clocks, not by Redis", early)
	}
}
