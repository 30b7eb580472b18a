package periodic

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// waitLen polls until stream name has at least n entries, failing the test
// after a deadline that scales with every.
func waitLen(t *testing.T, rdb redis.UniversalClient, name string, n int64, every time.Duration) {
	t.Helper()
	deadline := time.Now().Add(time.Duration(n)*every + time.Minute)
	for {
		l, err := rdb.XLen(context.Background(), name).Result()
		if err == nil && l >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream has %d entries (%v), want %d by now", l, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tickOf returns the tick of a periodic job's ID, in Unix milliseconds.
func tickOf(t *testing.T, name, id string) int64 {
	t.Helper()
	at, err := time.Parse("2006-01-02T15:04:05.000Z", strings.TrimPrefix(id, name+"@"))
	if err != nil || !strings.HasPrefix(id, name+"@") {
		t.Fatalf("job ID %q is not %s@<tick>: %v", id, name, err)
	}
	return at.UnixMilli()
}

// TestScheduler_fiveProcesses runs five scheduler processes on one
// schedule ticking every second (tolerance: the whole second), SIGKILLs two
// of them midway and starts them again: every tick from the first to the
// last is enqueued exactly once (counted per job ID), none before its tick
// by the Redis clock (the entry ID's time), and each scheduler runs the
// script about once per tick. A missing tick that every scheduler found
// late means the machine stalled them all past the tolerance: the scenario
// runs again with a longer interval.
func TestScheduler_fiveProcesses(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "every", time.Second, func(t *testing.T, every time.Duration) time.Duration {
		rdb := redistest.Shared(t)
		name := "{" + redistest.Name(t) + "}"
		t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
		ms := strconv.FormatInt(every.Milliseconds(), 10)
		env := []string{"PERIODIC_STREAM=" + name, "PERIODIC_EVERY_MS=" + ms, "PERIODIC_TOLERANCE_MS=" + ms}
		var kids []*child
		for range 5 {
			kids = append(kids, startChild(t, env...))
		}
		waitLen(t, rdb, name, 4, every)
		kids[0].kill()
		kids[1].kill()
		n, _ := rdb.XLen(context.Background(), name).Result()
		waitLen(t, rdb, name, n+4, every)
		kids = append(kids, startChild(t, env...), startChild(t, env...))
		n, _ = rdb.XLen(context.Background(), name).Result()
		waitLen(t, rdb, name, n+6, every)
		for _, k := range kids[2:] {
			k.stop(t)
		}

		msgs, err := rdb.XRange(context.Background(), name, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		perTick := map[int64]int{}
		for _, m := range msgs {
			id, _ := m.Values["job_id"].(string)
			tick := tickOf(t, "hb", id)
			if at := entryMS(t, m.ID); at < tick {
				t.Errorf("entry %s (Redis time %d) of %s is %d ms before its tick", m.ID, at, id, tick-at)
			}
			if tick%every.Milliseconds() != 0 {
				t.Errorf("job %s is not on a tick of every %v", id, every)
			}
			perTick[tick]++
		}
		var ticks []int64
		for tick, c := range perTick {
			ticks = append(ticks, tick)
			if c != 1 {
				t.Errorf("tick %d enqueued %d times", tick, c)
			}
		}
		sort.Slice(ticks, func(i, j int) bool { return ticks[i] < ticks[j] })
		all := map[int64][]attempt{}
		for _, k := range kids {
			perKid := map[int64]int{}
			for _, a := range k.attempts() {
				all[a.tick] = append(all[a.tick], a)
				if a.status != "error" && a.status != "missed" && a.status != "start" {
					perKid[a.tick]++
				}
			}
			for tick, c := range perKid {
				if c > 2 {
					t.Errorf("scheduler %d ran the script %d times for tick %d", k.cmd.Process.Pid, c, tick)
				}
			}
		}
		var wider time.Duration
		for i := 1; i < len(ticks); i++ {
			for tick := ticks[i-1] + every.Milliseconds(); tick < ticks[i]; tick += every.Milliseconds() {
				tried := all[tick]
				stalled := len(tried) > 0
				for _, a := range tried {
					if a.status == "start" {
						continue
					}
					if a.status == "added" {
						t.Errorf("tick %d was added but is not in the stream", tick)
					}
					if a.status != "late" && a.status != "missed" && a.status != "error" {
						stalled = false
					}
				}
				if !stalled {
					t.Errorf("tick %d is missing although schedulers ran (attempts: %v)", tick, tried)
					continue
				}
				t.Logf("tick %d was late for every scheduler (%v): the machine stalled them", tick, tried)
				wider = 2 * every
			}
		}
		t.Logf("%d ticks from %d to %d, %d entries", len(ticks), ticks[0], ticks[len(ticks)-1], len(msgs))
		if t.Failed() {
			return 0
		}
		return wider
	})
}
