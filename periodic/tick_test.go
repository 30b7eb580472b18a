package periodic

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// setup returns a scheduler of sched on the shared Redis, on a stream of
// the test's own (its keys deleted at the end), with its clock measured.
func setup(t *testing.T, sched ...Schedule) (*Scheduler, *redis.Client) {
	t.Helper()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"}*") })
	s, err := New(rdb, Config{Stream: "{" + name + "}", Schedules: sched})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.measure(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, rdb
}

// redisNow returns the Redis clock.
func redisNow(t *testing.T, rdb redis.UniversalClient) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// entries returns the stream's entries, decoded.
func entries(t *testing.T, rdb redis.UniversalClient, name string) []*stream.Job {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	jobs := make([]*stream.Job, 0, len(msgs))
	for _, m := range msgs {
		j, err := stream.Decode(m.ID, m.Values)
		if err != nil {
			t.Fatalf("entry %s does not decode: %v", m.ID, err)
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// TestTick_script checks each refusal of tick.lua and that it writes
// nothing then.
func TestTick_script(t *testing.T) {
	t.Parallel()
	s, rdb := setup(t, Schedule{Name: "hb", Every: time.Second, Type: "ping", Tolerance: 900 * time.Millisecond,
		Payload: []byte(`{"a":1}`), MaxAttempts: 3, LockKey: "L", Headers: map[string]string{"tenant": "acme"}})
	e := s.entries[0]
	ctx := context.Background()
	call := func(tick time.Time, catchUp bool) string {
		t.Helper()
		status, now, err := s.run(ctx, e, tick, catchUp)
		if err != nil {
			t.Fatalf("run(%v): %v", tick, err)
		}
		if now.IsZero() {
			t.Fatal("no Redis time in the reply")
		}
		return status
	}
	count := func() int64 { n, _ := rdb.XLen(ctx, s.keys.Stream).Result(); return n }

	// Early: a tick 5 s ahead of the Redis clock, whatever the local one says.
	now := redisNow(t, rdb)
	if got := call(now.Add(5*time.Second).Truncate(time.Second), false); got != "early" || count() != 0 {
		t.Fatalf("a tick 5s ahead: %q with %d entries, want early and none", got, count())
	}
	// Late: a tick 3 s old (tolerance 900 ms).
	if got := call(now.Add(-3*time.Second).Truncate(time.Second), false); got != "late" || count() != 0 {
		t.Fatalf("a tick 3s old: %q with %d entries, want late and none", got, count())
	}
	// Catch-up of a schedule that has no record: nothing to catch up.
	if got := call(now.Add(-3*time.Second).Truncate(time.Second), true); got != "late" || count() != 0 {
		t.Fatalf("catch-up without a record: %q with %d entries, want late and none", got, count())
	}
	// Added: the current tick (retried until it lands within its tolerance).
	var tick time.Time
	for {
		now = redisNow(t, rdb)
		tick = now.Truncate(time.Second)
		if now.Sub(tick) < 500*time.Millisecond {
			break
		}
		time.Sleep(tick.Add(time.Second).Sub(now)) // to the next second: a precondition, not a wait for the product
	}
	if got := call(tick, false); got != "added" {
		t.Fatalf("the current tick: %q, want added", got)
	}
	if got := call(tick, false); got != "duplicate" || count() != 1 {
		t.Fatalf("the same tick again: %q with %d entries, want duplicate and 1", got, count())
	}
	// The record alone refuses it too (a marker evicted).
	rdb.Del(ctx, s.markerKey("hb", tick.UnixMilli()))
	if got := call(tick, false); got != "stale" || count() != 1 {
		t.Fatalf("the same tick without its marker: %q with %d entries, want stale and 1", got, count())
	}
	// A catch-up of an older tick than the record: refused.
	if got := call(tick.Add(-5*time.Second), true); got != "stale" || count() != 1 {
		t.Fatalf("catch-up older than the record: %q with %d entries, want stale and 1", got, count())
	}

	jobs := entries(t, rdb, s.keys.Stream)
	j := jobs[0]
	id := "hb@" + tick.UTC().Format("2006-01-02T15:04:05.000Z")
	if j.ID != id || j.IdempotencyKey != id || j.Type != "ping" || string(j.Payload) != `{"a":1}` || j.MaxAttempts != 3 ||
		j.LockKey != "L" || j.Headers["tenant"] != "acme" {
		t.Fatalf("job = %+v, want ID and idempotency key %s and the schedule's fields", j, id)
	}
	msgs, _ := rdb.XRange(ctx, s.keys.Stream, "-", "+").Result()
	if at, _ := stream.EntryTime(msgs[0].ID); at.Before(tick) {
		t.Fatalf("entry %s is before its tick %v", msgs[0].ID, tick)
	}
	recs, err := Records(ctx, rdb, s.keys.Stream)
	if err != nil || len(recs) != 1 || recs[0].Name != "hb" || !recs[0].LastTick.Equal(tick) || recs[0].JobID != id {
		t.Fatalf("Records = %+v, %v; want hb at %v", recs, err, tick)
	}

	// Wrong types fail before any write.
	rdb.Del(ctx, s.keys.Periodic+"last")
	rdb.Set(ctx, s.keys.Periodic+"last", "x", time.Minute)
	rdb.Del(ctx, s.markerKey("hb", tick.UnixMilli()))
	_, _, err = s.run(ctx, e, tick, false)
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || count() != 1 {
		t.Fatalf("records of the wrong type: %v with %d entries, want WRONGTYPE and 1", err, count())
	}
	if n, _ := rdb.Exists(ctx, s.markerKey("hb", tick.UnixMilli())).Result(); n != 0 {
		t.Fatal("a marker was written by a failed call")
	}
}

// entryMS returns the milliseconds of entry ID id.
func entryMS(t *testing.T, id string) int64 {
	t.Helper()
	at, ok := stream.EntryTime(id)
	if !ok {
		t.Fatalf("entry ID %q", id)
	}
	return at.UnixMilli()
}
