package periodic

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestScheduler_redisErrors runs one scheduler through a proxy that loses
// the reply of one tick's script (applied, reply lost) and then resets
// every connection for 40% of an interval just as another tick comes: both
// errors are logged and retried within the tolerance, and every tick is in
// the stream exactly once, none skipped.
func TestScheduler_redisErrors(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "every", time.Second, func(t *testing.T, every time.Duration) time.Duration {
		shared := redistest.Shared(t)
		name := "{" + redistest.Name(t) + "}"
		t.Cleanup(func() { redistest.DeleteKeys(shared, name+"*") })
		p, err := faultproxy.Start(redistest.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		var logs syncBuffer
		s, err := New(rdb, Config{Stream: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []Schedule{
			{Name: "hb", Type: "ping", Every: every, Tolerance: every * 9 / 10},
		}})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		seen := map[int64][]string{}
		firstReply := map[int64]time.Time{} // the Redis time of a tick's first reply
		s.observe = func(_ string, tick time.Time, status string, late time.Duration) {
			if status == "start" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if _, ok := firstReply[tick.UnixMilli()]; !ok && status != "error" {
				firstReply[tick.UnixMilli()] = tick.Add(late)
			}
			seen[tick.UnixMilli()] = append(seen[tick.UnixMilli()], status)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				cancel()
				<-done
			}
		}
		defer stop()

		waitLen(t, shared, name, 1, every)
		now := redisNow(t, shared)
		lost := now.Truncate(every).Add(2 * every) // the tick whose reply is lost
		p.DropReplies(1, s.markerKey("hb", lost.UnixMilli()))
		cut := lost.Add(2 * every) // the tick Redis is unreachable for
		for redisNow(t, shared).Before(cut.Add(-every / 10)) {
			time.Sleep(5 * time.Millisecond)
		}
		p.Refuse()
		for redisNow(t, shared).Before(cut.Add(every * 3 / 10)) {
			time.Sleep(5 * time.Millisecond)
		}
		p.Pass()
		healed := redisNow(t, shared)
		deadline := time.Now().Add(time.Minute + 10*every)
		for time.Now().Before(deadline) {
			msgs, _ := shared.XRange(context.Background(), name, "-", "+").Result()
			if len(msgs) > 0 && tickOf(t, "hb", msgs[len(msgs)-1].Values["job_id"].(string)) >= cut.Add(2*every).UnixMilli() {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		stop()

		if healed.After(cut.Add(every * 6 / 10)) {
			t.Logf("the outage ended %v after the tick, past what the scenario allows: again", healed.Sub(cut))
			return 2 * every
		}
		mu.Lock()
		if st := seen[lost.UnixMilli()]; len(st) >= 2 && st[0] == "error" && st[len(st)-1] == "added" {
			// The first attempt failed without reaching Redis (a loaded
			// machine timed it out before the proxy passed it on), so no
			// reply was lost: the scenario did not happen.
			mu.Unlock()
			t.Logf("the first attempt of the lost-reply tick never reached Redis (%v): again", st)
			return 2 * every
		}
		mu.Unlock()
		mu.Lock()
		if st := seen[cut.UnixMilli()]; len(st) > 0 && st[0] != "error" && !firstReply[cut.UnixMilli()].Before(healed.Add(-every/10)) {
			mu.Unlock()
			t.Logf("the scheduler first tried the tick at %v, after the outage (healed at %v): it stalled; again", firstReply[cut.UnixMilli()], healed)
			return 2 * every
		}
		mu.Unlock()
		msgs, _ := shared.XRange(context.Background(), name, "-", "+").Result()
		count := map[int64]int{}
		var first, last int64
		for i, m := range msgs {
			tick := tickOf(t, "hb", m.Values["job_id"].(string))
			count[tick]++
			if i == 0 {
				first = tick
			}
			last = tick
		}
		for tick := first; tick <= last; tick += every.Milliseconds() {
			if count[tick] != 1 {
				t.Errorf("tick %d enqueued %d times (attempts %v)", tick, count[tick], seen[tick])
			}
		}
		if first > lost.UnixMilli() || last < cut.UnixMilli() {
			t.Errorf("ticks from %d to %d do not cover the faults at %d and %d", first, last, lost.UnixMilli(), cut.UnixMilli())
		}
		mu.Lock()
		defer mu.Unlock()
		if st := seen[lost.UnixMilli()]; len(st) < 2 || st[0] != "error" || st[len(st)-1] != "duplicate" {
			t.Errorf("attempts of the tick whose reply was lost: %v, want an error, then duplicate", st)
		}
		if st := seen[cut.UnixMilli()]; len(st) < 2 || st[0] != "error" || st[len(st)-1] != "added" {
			t.Errorf("attempts of the tick during the outage: %v, want errors, then added", st)
		}
		if l := logs.String(); !strings.Contains(l, "periodic: tick not enqueued; retrying") || strings.Contains(l, "tick missed") {
			t.Errorf("logs do not show the retries, or show a missed tick:\n%s", l)
		}
		return 0
	})
}
