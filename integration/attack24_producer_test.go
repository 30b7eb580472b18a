package integration

// Outside tester (s24-attack) of the producer's error wording: "(not
// enqueued)" when Redis refused the write (OOM, NOPERM, WRONGTYPE), and
// "(outcome unknown)" when the reply was lost or late. With MaxRetries -1,
// "(not enqueued)" must mean the job is not in Redis, and a lost reply must
// never say "(not enqueued)".

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

const (
	attack24NotEnqueued = "(not enqueued)"
	attack24Unknown     = "(outcome unknown)"
)

// attack24Enqueues are the producer calls tried in each fault: each adds one
// job (payload tag) and reports its error.
func attack24Enqueues(s string) map[string]func(ctx context.Context, rdb redis.UniversalClient, tag string) error {
	job := func(tag string) *stream.Job {
		return &stream.Job{Type: "t", Payload: []byte(tag), IdempotencyKey: "k-" + tag}
	}
	return map[string]func(ctx context.Context, rdb redis.UniversalClient, tag string) error{
		"plain": func(ctx context.Context, rdb redis.UniversalClient, tag string) error {
			_, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s}).Enqueue(ctx, job(tag))
			return err
		},
		"tracked": func(ctx context.Context, rdb redis.UniversalClient, tag string) error {
			_, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s, Track: true}).Enqueue(ctx, job(tag))
			return err
		},
		"once": func(ctx context.Context, rdb redis.UniversalClient, tag string) error {
			_, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s, EnqueueOnce: time.Hour}).Enqueue(ctx, job(tag))
			return err
		},
		"batch": func(ctx context.Context, rdb redis.UniversalClient, tag string) error {
			_, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s}).EnqueueBatch(ctx, []*stream.Job{job(tag)})
			return err
		},
		"delayed": func(ctx context.Context, rdb redis.UniversalClient, tag string) error {
			return stream.NewProducer(rdb, stream.ProducerConfig{Stream: s}).EnqueueIn(ctx, job(tag), time.Hour)
		},
	}
}

// attack24Present reports whether a job with payload tag is in the stream or
// its delayed set (searched by bytes, as the encoding is the producer's).
func attack24Present(t *testing.T, rdb redis.UniversalClient, s, tag string) bool {
	t.Helper()
	ctx := context.Background()
	keys, err := stream.KeysFor(s)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(ctx, s, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Values["payload"] == tag {
			return true
		}
	}
	members, err := rdb.ZRange(ctx, keys.Delayed, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if strings.Contains(m, tag) {
			return true
		}
	}
	return false
}

// TestAttack24ProducerLostReplyIsNeverNotEnqueued: the reply to each kind
// of enqueue is dropped after Redis applied it, or delayed past the client's
// read timeout. The error must say "(outcome unknown)", never "(not
// enqueued)", and the job is in Redis.
func TestAttack24ProducerLostReplyIsNeverNotEnqueued(t *testing.T) {
	t.Parallel()
	admin := redistest.Shared(t)
	px, err := faultproxy.Start(redistest.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	for _, fault := range []string{"drop", "delay"} {
		s := redistest.Name(t) + fault
		t.Cleanup(func() { admin.Del(context.Background(), s); redistest.DeleteKeys(admin, "{"+s+"}:*") })
		for name, enqueue := range attack24Enqueues(s) {
			tag := fault + "-" + name + "-x"
			rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, ReadTimeout: 300 * time.Millisecond, PoolSize: 1})
			ctx := context.Background()
			// An idle connection whose script cache is warm: the matching
			// request is the enqueue's own.
			if err := enqueue(ctx, rdb, tag[:len(tag)-1]+"w"); err != nil {
				t.Fatalf("%s: warm-up: %v", tag, err)
			}
			switch fault {
			case "drop":
				px.DropReplies(1, tag)
			case "delay":
				px.Delay(faultproxy.Latency{}, faultproxy.Latency{Fixed: time.Second})
			}
			err := enqueue(ctx, rdb, tag)
			px.Pass()
			px.DropReplies(0, "")
			rdb.Close()
			if err == nil {
				t.Errorf("%s: no error although the reply was lost", tag)
				continue
			}
			if strings.Contains(err.Error(), attack24NotEnqueued) || !strings.Contains(err.Error(), attack24Unknown) {
				t.Errorf("%s: error %q, want %q and not %q", tag, err, attack24Unknown, attack24NotEnqueued)
			}
			poll := time.Now().Add(10 * time.Second)
			for !attack24Present(t, admin, s, tag) {
				if time.Now().After(poll) {
					t.Errorf("%s: the job never reached Redis (a lost reply, not a lost request)", tag)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// TestAttack24ProducerRefusalIsNotEnqueued: Redis refuses each kind of
// enqueue (OOM under maxmemory, NOPERM, WRONGTYPE on the stream key) on a
// client with MaxRetries -1. The error must say "(not enqueued)" and the job
// must not be in Redis, nor any marker or record of it.
func TestAttack24ProducerRefusalIsNotEnqueued(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "ro", "on", ">pw", "~*", "+@all", "-xadd", "-evalsha", "-eval", "-zadd", "-fcall").Err(); err != nil {
		t.Fatal(err)
	}
	for _, refusal := range []string{"oom", "noperm", "wrongtype"} {
		t.Run(refusal, func(t *testing.T) {
			s := "q-" + refusal
			keys, _ := stream.KeysFor(s)
			var rdb *redis.Client
			switch refusal {
			case "noperm":
				rdb = srv.Client(t, func(o *redis.Options) { o.Username, o.Password, o.MaxRetries = "ro", "pw", -1 })
			default:
				rdb = srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
			}
			// Both keys exist, so that the wrong-type swap below has
			// something to move aside.
			admin.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []string{"type", "seed"}})
			admin.ZAdd(ctx, keys.Delayed, redis.Z{Member: "seed"})
			for name, enqueue := range attack24Enqueues(s) {
				tag := refusal + "-" + name + "-x"
				// Warm the script cache and create the keys, so that the
				// refusal is the only thing that differs.
				if err := enqueue(ctx, admin, tag[:len(tag)-1]+"w"); err != nil {
					t.Fatalf("%s: warm-up: %v", tag, err)
				}
				before, err := admin.DBSize(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				xlen := admin.XLen(ctx, s).Val()
				zlen := admin.ZCard(ctx, keys.Delayed).Val()
				switch refusal {
				case "oom":
					admin.ConfigSet(ctx, "maxmemory", "1")
				case "wrongtype":
					admin.Rename(ctx, s, s+"-saved")
					admin.Set(ctx, s, "not a stream", 0)
					admin.Rename(ctx, keys.Delayed, keys.Delayed+"-saved")
					admin.Set(ctx, keys.Delayed, "not a zset", 0)
				}
				err = enqueue(ctx, rdb, tag)
				switch refusal {
				case "oom":
					admin.ConfigSet(ctx, "maxmemory", "0")
				case "wrongtype":
					if v := admin.Get(ctx, s).Val(); v != "not a stream" {
						t.Errorf("%s: stream key overwritten: %q", tag, v)
					}
					if v := admin.Get(ctx, keys.Delayed).Val(); v != "not a zset" {
						t.Errorf("%s: delayed key overwritten: %q", tag, v)
					}
					admin.Rename(ctx, s+"-saved", s)
					admin.Rename(ctx, keys.Delayed+"-saved", keys.Delayed)
				}
				if err == nil {
					t.Errorf("%s: no error although Redis refused", tag)
					continue
				}
				want := attack24NotEnqueued
				if name == "delayed" {
					want = "(not scheduled)" // a schedule's own word for it
				}
				if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), attack24Unknown) {
					t.Errorf("%s: error %q, want %q", tag, err, want)
				}
				if attack24Present(t, admin, s, tag) {
					t.Errorf("%s: error %q but the job is in Redis", tag, err)
				}
				after := admin.DBSize(ctx).Val()
				if after != before || admin.XLen(ctx, s).Val() != xlen || admin.ZCard(ctx, keys.Delayed).Val() != zlen {
					t.Errorf("%s: keys %d -> %d, stream %d -> %d, delayed %d -> %d after a refused enqueue", tag,
						before, after, xlen, admin.XLen(ctx, s).Val(), zlen, admin.ZCard(ctx, keys.Delayed).Val())
				}
			}
		})
	}
}
