package queuestats_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/queuestats"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// fill makes stream s with n entries, group g holding 2 of them pending on
// consumer c1, and dead letters with the reasons given.
func fill(t *testing.T, rdb *redis.Client, s string, n int, reasons ...string) {
	t.Helper()
	ctx := context.Background()
	keys, _ := stream.KeysFor(s)
	t.Cleanup(func() { rdb.Del(context.Background(), s, keys.Dead, keys.Delayed) })
	for range n {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "a", "payload", "{}"}})
	}
	rdb.XGroupCreate(ctx, s, "g", "0")
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{s, ">"}, Count: 2})
	for _, r := range reasons {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"type", "a", "dead_reason", r}})
	}
}

func TestCollect(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	a, b, missing := redistest.Name(t), redistest.Name(t), redistest.Name(t)
	fill(t, rdb, a, 5, "panic", "panic", "permanent")
	fill(t, rdb, b, 3)
	qs, now, err := queuestats.Collect(context.Background(), rdb, []string{a, b, missing}, queuestats.Options{ReasonScan: 2})
	if err != nil || now.IsZero() {
		t.Fatalf("Collect: %v, %v", now, err)
	}
	qa := qs[0]
	if qa.Err != nil || qa.Length != 5 || qa.Pending() != 2 || qa.MaxLag() != 3 || qa.Consumers() != 1 || qa.DeadLetters != 3 {
		t.Errorf("queue a: %+v", qa)
	}
	// The newest 2 dead letters: one panic, one permanent; capped.
	if qa.DeadByReason["panic"] != 1 || qa.DeadByReason["permanent"] != 1 || qa.DeadScanned != 2 || !qa.DeadCapped {
		t.Errorf("queue a reasons: %v scanned %d capped %v", qa.DeadByReason, qa.DeadScanned, qa.DeadCapped)
	}
	if qa.Added != 5 || qa.Groups[0].Settled() != 0 || qa.Groups[0].OldestPendingID == "" {
		t.Errorf("queue a counters: added %d settled %d oldest %q", qa.Added, qa.Groups[0].Settled(), qa.Groups[0].OldestPendingID)
	}
	if qs[1].Err != nil || qs[1].Length != 3 || qs[1].DeadLetters != 0 || len(qs[1].DeadByReason) != 0 {
		t.Errorf("queue b: %+v", qs[1])
	}
	if !errors.Is(qs[2].Err, queuestats.ErrNotFound) {
		t.Errorf("missing stream: %v, want ErrNotFound", qs[2].Err)
	}
}

// A Redis whose script cache was flushed (a restart) answers NOSCRIPT:
// Collect loads the script and reads again. On a private server, since
// SCRIPT FLUSH is global.
func TestCollect_noScript(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t, redistest.Options{}).Client(t)
	fill(t, rdb, "q", 1, "panic")
	for range 2 {
		if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		qs, _, err := queuestats.Collect(context.Background(), rdb, []string{"q"}, queuestats.Options{})
		if err != nil || qs[0].Err != nil || qs[0].ReasonsErr != nil || qs[0].DeadByReason["panic"] != 1 {
			t.Fatalf("after SCRIPT FLUSH: %v, %+v", err, qs[0])
		}
	}
}

// A user without EVALSHA (the documented read-only dashboard user before
// pelican web's additions) gets the queue, with ReasonsErr set.
func TestCollect_reasonsDenied(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	fill(t, admin, "q", 2, "panic")
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "ro", "reset", "on", ">pw", "%R~q", "%R~{q}:*", "+ping", "+time", "+xlen", "+zcard",
		"+xinfo|groups", "+xinfo|consumers", "+xpending").Err(); err != nil {
		t.Fatal(err)
	}
	ro := srv.Client(t, func(o *redis.Options) { o.Username, o.Password = "ro", "pw" })
	qs, _, err := queuestats.Collect(ctx, ro, []string{"q"}, queuestats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q := qs[0]
	if q.Err != nil || q.Length != 2 || q.DeadLetters != 1 || !queuestats.NoPerm(q.ReasonsErr) {
		t.Errorf("read-only user: err %v, length %d, dead %d, reasons err %v", q.Err, q.Length, q.DeadLetters, q.ReasonsErr)
	}
	// With ReasonScan negative no script is sent at all.
	qs, _, _ = queuestats.Collect(ctx, ro, []string{"q"}, queuestats.Options{ReasonScan: -1})
	if qs[0].Err != nil || qs[0].ReasonsErr != nil {
		t.Errorf("ReasonScan -1: %v, %v", qs[0].Err, qs[0].ReasonsErr)
	}
}

func TestScan(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t, redistest.Options{}).Client(t)
	fill(t, rdb, "b", 1, "panic")
	fill(t, rdb, "a", 1)
	rdb.Set(context.Background(), "not-a-stream", "x", 0)
	keys, denied, err := queuestats.Scan(context.Background(), rdb)
	if err != nil || denied || len(keys) != 2 || keys[0] != "a" || keys[1] != "b" {
		t.Errorf("Scan = %q, %v, %v; want [a b] (no {b}:dlq)", keys, denied, err)
	}
}
