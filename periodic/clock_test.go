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
// enqueued once, none early, and no call is refused as early: the offset is
// a lower bound, which a slow round trip (a busy machine) does not move.
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
	if early > 0 {
		t.Errorf("%d early refusals: the schedulers aimed by their local clocks, or by an offset to Redis that is not a lower bound", early)
	}
}

// An offset measured from a slow round trip whose call reached Redis late
// (sent late on a busy machine) does not move a lower bound measured from a
// fast one: aimed by the slow one's middle, the next call would be early.
// A reading that proves the offset wrong (a local clock stepped either way)
// moves it to that reading's least value.
func TestScheduler_offsetLowerBound(t *testing.T) {
	t.Parallel()
	s := &Scheduler{}
	base := time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC)
	const off = 3 * time.Second // the true offset: Redis is 3 s ahead
	at := func(local time.Duration) time.Time { return base.Add(local) }
	check := func(what string, lo, hi time.Duration) {
		t.Helper()
		if got := time.Duration(s.offset.Load()); got < lo || got > hi {
			t.Errorf("%s: offset %v, want within [%v, %v]", what, got, lo, hi)
		}
	}
	// A fast round trip (1 ms): Redis read its clock somewhere in it.
	s.measuredAt(at(0), at(time.Millisecond), at(500*time.Microsecond+off), time.Microsecond)
	check("after a fast round trip", off-time.Millisecond, off)
	// A slow one (100 ms), its call sent late: Redis read its clock 1 ms
	// before the reply came back. The middle would be 49 ms too high.
	s.measuredAt(at(time.Second), at(time.Second+100*time.Millisecond), at(time.Second+99*time.Millisecond+off), time.Millisecond)
	check("after a slow round trip sent late", off-time.Millisecond, off)
	// And one whose reply was read late.
	s.measuredAt(at(2*time.Second), at(2*time.Second+100*time.Millisecond), at(2*time.Second+time.Millisecond+off), time.Millisecond)
	check("after a slow round trip read late", off-time.Millisecond, off)
	// The local clock stepped 1 s back (the offset grew by 1 s), then
	// 2 s forward (it shrank by 2 s): each reading moves it.
	s.measuredAt(at(3*time.Second), at(3*time.Second+time.Millisecond), at(3*time.Second+off+time.Second), time.Millisecond)
	check("after the local clock stepped back", off+time.Second-time.Millisecond, off+time.Second)
	s.measuredAt(at(4*time.Second), at(4*time.Second+time.Millisecond), at(4*time.Second+off-time.Second), time.Millisecond)
	check("after the local clock stepped forward", off-time.Second-time.Millisecond, off-time.Second)
}
