package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// DLQ replay under enqueue-once: a dead job that is the one its key's marker names
// is replayed (once, even by two replays); a dead job of the same key but another
// job ID stays dead as a duplicate. Job IDs with spaces (the marker is
// "<entry id> <job id>") must not confuse the comparison.
func TestAttack11_ReplayOnceMarker(t *testing.T) {
	t.Parallel()
	for _, jid := range []string{"plainid", "id with spaces", "- dash"} {
		t.Run(jid, func(t *testing.T) {
			t.Parallel()
			p, name, keys := a11Producer(t, time.Hour)
			rdb := redistest.Shared(t)
			ctx := context.Background()
			j := a11Job(t, "rk")
			j.ID = jid
			if _, err := p.Enqueue(ctx, j); err != nil {
				t.Fatal(err)
			}
			// the consumer dead-letters it: the source entry gone, a dead entry with its fields
			msgs := rdb.XRange(ctx, name, "-", "+").Val()
			if len(msgs) != 1 {
				t.Fatalf("XLEN %d", len(msgs))
			}
			rdb.XDel(ctx, name, msgs[0].ID)
			dead := func(id string) {
				jj := a11Job(t, "rk")
				jj.ID = id
				f := append(stream.Encode(jj), "dead_reason", "permanent", "dead_error", "boom", "dead_stream", name)
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: f}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			dead(jid)
			dead("other job")
			d, err := dlq.New(rdb, name, dlq.Config{})
			if err != nil {
				t.Fatal(err)
			}
			res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Replayed != 1 || res.Duplicates != 1 {
				t.Fatalf("replay %+v, want Replayed 1 Duplicates 1", res)
			}
			res2, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if res2.Replayed != 0 {
				t.Fatalf("second replay moved %d", res2.Replayed)
			}
			got := rdb.XRange(ctx, name, "-", "+").Val()
			if len(got) != 1 {
				t.Fatalf("source has %d entries after replay, want 1", len(got))
			}
			rj, err := stream.Decode(got[0].ID, got[0].Values)
			if err != nil || rj.ID != jid {
				t.Fatalf("replayed job %v %v", rj, err)
			}
			// and a fresh enqueue of the key still adds nothing
			j2 := a11Job(t, "rk")
			if _, err := p.Enqueue(ctx, j2); err != nil {
				t.Fatal(err)
			}
			if n := rdb.XLen(ctx, name).Val(); n != 1 {
				t.Fatalf("XLEN %d after replay + enqueue", n)
			}
			if n := rdb.XLen(ctx, keys.Dead).Val(); n != 1 {
				t.Fatalf("dead %d, want 1 (the duplicate)", n)
			}
		})
	}
}
