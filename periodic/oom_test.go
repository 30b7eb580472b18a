package periodic

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// TestTick_oom fills a 20 MB redis-server (noeviction) until it refuses
// writes: the tick script then fails with OOM having written nothing (no
// entry, marker or record); once memory is freed, the same tick is added.
func TestTick_oom(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "20mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	ctx := context.Background()
	s, err := New(rdb, Config{Stream: "q", Schedules: []Schedule{{Name: "hb", Type: "ping", Every: time.Second, Tolerance: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.measure(ctx); err != nil {
		t.Fatal(err)
	}
	// Fill until a small write is refused. A refused command's own buffer
	// is freed after it, which can bring Redis back under its limit; so
	// each round tops up with small writes, and a script that ran anyway
	// (status, no error) is undone and tried again after more filling.
	pad := strings.Repeat("x", 1000)
	n := 0
	fill := func() {
		t.Helper()
		for ; ; n++ {
			if n > 100_000 {
				t.Fatal("Redis never filled up")
			}
			if err := rdb.Set(ctx, "fill:"+strconv.Itoa(n), pad, 0).Err(); err != nil {
				if !strings.Contains(err.Error(), "OOM") {
					t.Fatalf("fill: %v, want OOM once full", err)
				}
				return
			}
		}
	}
	e := s.entries[0]
	refused := false
	for round := 0; round < 5 && !refused; round++ {
		fill()
		tick := redisNow(t, rdb).Truncate(time.Second)
		status, _, err := s.run(ctx, e, tick, false)
		if err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatalf("tick on a full Redis: %v, want OOM", err)
			}
			if n, _ := rdb.Exists(ctx, "q", s.markerKey("hb", tick.UnixMilli()), s.keys.Periodic+"last").Result(); n != 0 {
				t.Fatalf("a refused tick left %d of its keys", n)
			}
			refused = true
			break
		}
		t.Logf("round %d: the script ran (%s): Redis was under its limit again", round, status)
		rdb.Del(ctx, "q", s.markerKey("hb", tick.UnixMilli()), s.keys.Periodic+"last")
	}
	if !refused {
		t.Fatal("the tick script was never refused on a full Redis")
	}
	iter := rdb.Scan(ctx, 0, "fill:*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	for tick := redisNow(t, rdb).Truncate(time.Second); ; {
		status, _, err := s.run(ctx, e, tick, false)
		if err != nil {
			t.Fatal(err)
		}
		if status == "added" {
			break
		}
		if status != "late" {
			t.Fatalf("after freeing memory: %q", status)
		}
		tick = redisNow(t, rdb).Truncate(time.Second) // the second passed while filling: the next one
	}
	if n, _ := rdb.XLen(ctx, "q").Result(); n != 1 {
		t.Fatalf("%d entries, want 1", n)
	}
}
