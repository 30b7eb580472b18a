package stream_test

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// TrimAcked runs XINFO GROUPS, XPENDING and TIME inside Lua, where miniredis
// differs from Redis (REDIS-NOTES.md §5: XINFO GROUPS, pending counts), so
// its tests run against the real Redis at REDIS_ADDR.

const redisAddrEnv = "REDIS_ADDR"

var trimStreamSeq atomic.Int64

// setupTrim returns a client of the real Redis at $REDIS_ADDR (default
// 127.0.0.1:6379) and a stream name no other test or run uses. The stream is
// deleted when the test ends; the database is never flushed.
func setupTrim(t *testing.T) (*redis.Client, string) {
	t.Helper()
	addr := os.Getenv(redisAddrEnv)
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("TrimAcked tests need a real Redis: %s=%q is unreachable (%v); start redis-server or set %s",
			redisAddrEnv, addr, err, redisAddrEnv)
	}
	name := fmt.Sprintf("pelican-test:{trim:%d:%d:%d}", os.Getpid(), time.Now().UnixNano(), trimStreamSeq.Add(1))
	t.Cleanup(func() { _ = rdb.Del(context.Background(), name).Err() })
	return rdb, name
}

// addEntries adds entries with the given IDs to s.
func addEntries(t *testing.T, rdb *redis.Client, s string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: s, ID: id, Values: []any{"type", "t"}}).Err(); err != nil {
			t.Fatalf("XADD %s %s: %v", s, id, err)
		}
	}
}

// readGroup makes group g (created from the start of the stream if needed)
// read the next n entries, and returns their IDs.
func readGroup(t *testing.T, rdb *redis.Client, s, g string, n int64) []string {
	t.Helper()
	ctx := context.Background()
	if err := rdb.XGroupCreate(ctx, s, g, "0").Err(); err != nil && err.Error() != "BUSYGROUP Consumer Group name already exists" {
		t.Fatalf("XGROUP CREATE %s %s: %v", s, g, err)
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "c", Streams: []string{s, ">"}, Count: n, Block: -1}).Result()
	if err != nil {
		t.Fatalf("XREADGROUP %s %s: %v", s, g, err)
	}
	var ids []string
	for _, m := range res[0].Messages {
		ids = append(ids, m.ID)
	}
	if int64(len(ids)) != n {
		t.Fatalf("group %s read %d entries, want %d", g, len(ids), n)
	}
	return ids
}

func ack(t *testing.T, rdb *redis.Client, s, g string, ids ...string) {
	t.Helper()
	if err := rdb.XAck(context.Background(), s, g, ids...).Err(); err != nil {
		t.Fatalf("XACK %s %s: %v", s, g, err)
	}
}

func entryIDs(t *testing.T, rdb *redis.Client, s string) []string {
	t.Helper()
	res, err := rdb.XRange(context.Background(), s, "-", "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", s, err)
	}
	ids := make([]string, 0, len(res))
	for _, m := range res {
		ids = append(ids, m.ID)
	}
	return ids
}

func pendingIDs(t *testing.T, rdb *redis.Client, s, g string) []string {
	t.Helper()
	res, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: s, Group: g, Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		t.Fatalf("XPENDING %s %s: %v", s, g, err)
	}
	ids := make([]string, 0, len(res))
	for _, p := range res {
		ids = append(ids, p.ID)
	}
	return ids
}

// seqIDs returns "from-0" … "to-0".
func seqIDs(from, to int) []string {
	var ids []string
	for i := from; i <= to; i++ {
		ids = append(ids, strconv.Itoa(i)+"-0")
	}
	return ids
}

func trim(t *testing.T, rdb *redis.Client, s string, keep time.Duration) int64 {
	t.Helper()
	n, err := stream.TrimAcked(context.Background(), rdb, s, keep)
	if err != nil {
		t.Fatalf("TrimAcked(%s, %v) error: %v", s, keep, err)
	}
	return n
}

func TestTrimAcked(t *testing.T) {
	t.Parallel()

	t.Run("TwoGroups", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		addEntries(t, rdb, s, seqIDs(1, 20)...)
		// Group a has read 1..10 and acked 1..5: 6..10 are pending, 11..20 unread.
		readGroup(t, rdb, s, "a", 10)
		ack(t, rdb, s, "a", seqIDs(1, 5)...)
		// Group b has read 1..15 and acked them all: 16..20 unread.
		readGroup(t, rdb, s, "b", 15)
		ack(t, rdb, s, "b", seqIDs(1, 15)...)

		if n := trim(t, rdb, s, 0); n != 5 {
			t.Errorf("TrimAcked removed %d entries, want 5 (1-0..5-0)", n)
		}
		if got, want := entryIDs(t, rdb, s), seqIDs(6, 20); !reflect.DeepEqual(got, want) {
			t.Errorf("entries left = %v, want %v", got, want)
		}
		if got, want := pendingIDs(t, rdb, s, "a"), seqIDs(6, 10); !reflect.DeepEqual(got, want) {
			t.Errorf("pending of group a = %v, want %v", got, want)
		}

		if n := trim(t, rdb, s, 0); n != 0 {
			t.Errorf("second TrimAcked removed %d entries, want 0", n)
		}
		if got, want := entryIDs(t, rdb, s), seqIDs(6, 20); !reflect.DeepEqual(got, want) {
			t.Errorf("entries left after the second call = %v, want %v", got, want)
		}

		// Once group a acks everything it read, its horizon is its last
		// delivered entry, 10-0, which is kept.
		ack(t, rdb, s, "a", seqIDs(6, 10)...)
		if n := trim(t, rdb, s, 0); n != 4 {
			t.Errorf("TrimAcked after group a acked all removed %d entries, want 4 (6-0..9-0)", n)
		}
		if got, want := entryIDs(t, rdb, s), seqIDs(10, 20); !reflect.DeepEqual(got, want) {
			t.Errorf("entries left = %v, want %v", got, want)
		}
	})

	t.Run("GroupThatReadNothing", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		addEntries(t, rdb, s, seqIDs(1, 10)...)
		readGroup(t, rdb, s, "busy", 10)
		ack(t, rdb, s, "busy", seqIDs(1, 10)...)
		if err := rdb.XGroupCreate(context.Background(), s, "idle", "0").Err(); err != nil {
			t.Fatal(err)
		}

		if n := trim(t, rdb, s, 0); n != 0 {
			t.Errorf("TrimAcked removed %d entries that group idle has not read, want 0", n)
		}
		if got := entryIDs(t, rdb, s); len(got) != 10 {
			t.Errorf("entries left = %v, want all 10", got)
		}
	})

	t.Run("NoGroupsUntouched", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		addEntries(t, rdb, s, seqIDs(1, 5)...)
		if n := trim(t, rdb, s, 0); n != 0 {
			t.Errorf("TrimAcked removed %d entries of a stream without groups, want 0", n)
		}
		if got, want := entryIDs(t, rdb, s), seqIDs(1, 5); !reflect.DeepEqual(got, want) {
			t.Errorf("entries left = %v, want %v", got, want)
		}
	})

	t.Run("MissingStream", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		if n := trim(t, rdb, s, 0); n != 0 {
			t.Errorf("TrimAcked of a missing stream = %d, want 0", n)
		}
		if n, err := rdb.Exists(context.Background(), s).Result(); err != nil || n != 0 {
			t.Errorf("EXISTS %s = %d, %v; TrimAcked must not create the key", s, n, err)
		}
	})

	t.Run("KeepsRecentEntries", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		now, err := rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		ms := func(ago time.Duration) string { return strconv.FormatInt(now.Add(-ago).UnixMilli(), 10) }
		old := []string{ms(3*time.Hour) + "-0", ms(3*time.Hour) + "-1", ms(2*time.Hour) + "-0"}
		recent := []string{ms(30*time.Minute) + "-0", ms(time.Minute) + "-0", ms(time.Minute) + "-1"}
		addEntries(t, rdb, s, append(old, recent...)...)
		readGroup(t, rdb, s, "g", 6)
		ack(t, rdb, s, "g", append(old, recent...)...)

		if n := trim(t, rdb, s, time.Hour); n != 3 {
			t.Errorf("TrimAcked(keep 1h) removed %d entries, want the 3 older than 1h", n)
		}
		if got := entryIDs(t, rdb, s); !reflect.DeepEqual(got, recent) {
			t.Errorf("entries left = %v, want the recent %v", got, recent)
		}
		if n := trim(t, rdb, s, 4*time.Hour); n != 0 {
			t.Errorf("TrimAcked(keep 4h) removed %d entries, want 0", n)
		}
		// keep 0: everything acked goes but the last delivered entry.
		if n := trim(t, rdb, s, 0); n != 2 {
			t.Errorf("TrimAcked(keep 0) removed %d entries, want 2", n)
		}
		if got, want := entryIDs(t, rdb, s), recent[2:]; !reflect.DeepEqual(got, want) {
			t.Errorf("entries left = %v, want %v", got, want)
		}
	})

	t.Run("KeepBeyondEpoch", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		// Regression: a keep longer than the time since 1970 made a negative
		// cutoff that the script could not parse ("attempt to compare nil").
		addEntries(t, rdb, s, seqIDs(1, 3)...)
		readGroup(t, rdb, s, "g", 3)
		ack(t, rdb, s, "g", seqIDs(1, 3)...)
		for _, keep := range []time.Duration{100 * 365 * 24 * time.Hour, time.Duration(1<<63 - 1)} {
			if n := trim(t, rdb, s, keep); n != 0 {
				t.Errorf("TrimAcked(keep %v) removed %d entries, want 0", keep, n)
			}
		}
		if got := entryIDs(t, rdb, s); len(got) != 3 {
			t.Errorf("entries left = %v, want all 3", got)
		}
	})

	t.Run("SequenceBeyondFloatPrecision", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		// Regression: IDs compared as Lua numbers (doubles) made
		// 1-9007199254740992 (pending) equal to 1-9007199254740993 (last
		// delivered), so the pending entry was trimmed.
		ids := []string{"1-9007199254740992", "1-9007199254740993", "2-0"}
		addEntries(t, rdb, s, ids...)
		readGroup(t, rdb, s, "g", 2)
		ack(t, rdb, s, "g", ids[1])

		if n := trim(t, rdb, s, 0); n != 0 {
			t.Errorf("TrimAcked removed %d entries, want 0: 1-9007199254740992 is pending", n)
		}
		if got := entryIDs(t, rdb, s); !reflect.DeepEqual(got, ids) {
			t.Errorf("entries left = %v, want %v", got, ids)
		}
	})

	t.Run("WrongType", func(t *testing.T) {
		t.Parallel()
		rdb, s := setupTrim(t)

		if err := rdb.Set(context.Background(), s, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.TrimAcked(context.Background(), rdb, s, 0); err == nil {
			t.Error("TrimAcked of a string key succeeded; want an error")
		}
	})
}
