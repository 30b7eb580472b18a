package pelicantest

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// shiftDelayed moves every member of a delayed set ARGV[1] ms earlier
// (scores are Unix ms, whole numbers far below 2^53: exact as doubles).
var shiftDelayed = redis.NewScript(`
local m = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, member in ipairs(m) do redis.call('ZINCRBY', KEYS[1], -tonumber(ARGV[1]), member) end
return #m`)

// shiftTTL runs a key's time to live down by ARGV[1] ms, deleting it when
// that ends it.
var shiftTTL = redis.NewScript(`
local p = redis.call('PTTL', KEYS[1])
if p < 0 then return 0 end
if p <= tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) return 1 end
redis.call('PEXPIRE', KEYS[1], p - tonumber(ARGV[1]))
return 1`)

// Advance moves Redis's side of time forward by d, without sleeping, for
// every key of the test (see [Redis.Name]):
//
//   - delayed jobs (retries, snoozes, EnqueueIn and EnqueueAt) fall due d
//     earlier, so the next promotion of a running consumer (every
//     Config.PromoteInterval) moves those now due into the stream;
//   - every pending entry of every consumer group looks idle d longer, so
//     the next sweep of a consumer whose VisibilityTimeout it now exceeds
//     reclaims it, as if its worker had died d ago (its delivery count is
//     kept: the reclaim counts the delivery);
//   - keys with a time to live (locks, idempotency leases, crash counters)
//     expire d sooner.
//
// What a process measures with its own clock does not move: a running
// handler's lease, its heartbeat, a consumer's intervals.
func (r *Redis) Advance(t TB, d time.Duration) {
	t.Helper()
	if err := r.advance(context.Background(), d); err != nil {
		t.Fatalf("pelicantest: Advance(%v): %v", d, err)
	}
}

func (r *Redis) advance(ctx context.Context, d time.Duration) error {
	ms := d.Milliseconds()
	if ms <= 0 {
		return nil
	}
	queues, err := r.queueKeys(ctx)
	if err != nil {
		return err
	}
	for k, typ := range queues {
		switch typ {
		case "stream":
			if err := r.agePending(ctx, k, ms); err != nil {
				return err
			}
		case "zset":
			if err := shiftDelayed.Run(ctx, r.Client, []string{k}, ms).Err(); err != nil {
				return err
			}
		}
	}
	if r.mini != nil {
		r.mini.FastForward(d)
		return nil
	}
	keys, err := r.keys(ctx)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := shiftTTL.Run(ctx, r.Client, []string{k}, ms).Err(); err != nil {
			return err
		}
	}
	return nil
}

// isDelayedSet reports whether key names a delayed set (stream.KeysFor:
// "{orders}:delayed" for "orders", "{shop}:orders:delayed" for
// "{shop}:orders").
func isDelayedSet(key string) bool { return strings.HasSuffix(key, ":delayed") }

// isDeadStream reports whether key names a dead-letter stream.
func isDeadStream(key string) bool { return strings.HasSuffix(key, ":dlq") }

// streamOfDelayed returns the stream whose delayed set is key.
func streamOfDelayed(key string) string {
	name := strings.TrimSuffix(key, ":delayed")
	if inner, ok := strings.CutPrefix(name, "{"); ok && strings.HasSuffix(inner, "}") && !strings.ContainsAny(inner[:len(inner)-1], "{}") {
		return inner[:len(inner)-1] // "{orders}" is the tag KeysFor put around "orders"
	}
	return name
}

// agePending makes every pending entry of every group of stream look ms
// idler, keeping its owner and delivery count (XCLAIM to its owner with IDLE
// and RETRYCOUNT, JUSTID so that the claim is not a delivery).
func (r *Redis) agePending(ctx context.Context, key string, ms int64) error {
	groups, err := r.Client.XInfoGroups(ctx, key).Result()
	if err != nil {
		return err
	}
	for _, g := range groups {
		start := "-"
		for {
			p, err := r.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: g.Name, Start: start, End: "+", Count: 1000}).Result()
			if err != nil {
				return err
			}
			for _, e := range p {
				if e.ID == start {
					continue // the page's first entry, the last of the previous page
				}
				err := r.Client.Do(ctx, "XCLAIM", key, g.Name, e.Consumer, 0, e.ID,
					"IDLE", e.Idle.Milliseconds()+ms, "RETRYCOUNT", e.RetryCount, "JUSTID").Err()
				if err != nil {
					return err
				}
			}
			if len(p) < 1000 {
				break
			}
			start = p[len(p)-1].ID
		}
	}
	return nil
}
