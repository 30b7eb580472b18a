package stream_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// The member format is part of the wire format: the example in
// docs/wire-format.md must be what EncodeDelayed writes.
func TestEncodeDelayed_docExample(t *testing.T) {
	t.Parallel()
	const want = "k1|1:v1:14:type1:t7:payload2:{}"
	got := stream.EncodeDelayed("k1", stream.Encode(&stream.Job{Type: "t", Payload: []byte("{}")}))
	if got != want {
		t.Fatalf("EncodeDelayed = %q, want %q", got, want)
	}
	doc, err := os.ReadFile("../docs/wire-format.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), want) {
		t.Errorf("docs/wire-format.md does not show the member %q", want)
	}
	key, fields, err := stream.DecodeDelayed(got)
	if err != nil || key != "k1" || strings.Join(fields, ",") != "v,1,type,t,payload,{}" {
		t.Fatalf("DecodeDelayed = %q, %q, %v", key, fields, err)
	}
}

func TestDecodeDelayed_rejects(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"", "nobar", "k|", "k|3:ab", "k|x:ab", "k|1:a", "k|-1:a1:b", "k|1:a1:b1:c"} {
		if _, _, err := stream.DecodeDelayed(m); err == nil {
			t.Errorf("DecodeDelayed(%q) = nil error", m)
		}
	}
}

func TestProducer_EnqueueAt(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.SetTime(time.UnixMilli(1_800_000_000_000))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "sched"})
	keys, _ := stream.KeysFor("sched")

	at := &stream.Job{Type: "at"}
	if err := p.EnqueueAt(ctx, at, time.UnixMilli(1_800_000_005_000)); err != nil {
		t.Fatal(err)
	}
	in := &stream.Job{Type: "in"}
	if err := p.EnqueueIn(ctx, in, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if at.ID == "" || in.ID == "" {
		t.Fatal("scheduled jobs got no ID")
	}
	scores, err := rdb.ZRangeWithScores(ctx, keys.Delayed, 0, -1).Result()
	if err != nil || len(scores) != 2 {
		t.Fatalf("delayed set = %v, %v", scores, err)
	}
	// EnqueueIn counts from the Redis clock (1_800_000_000_000), EnqueueAt is absolute.
	if scores[0].Score != 1_800_000_002_000 || scores[1].Score != 1_800_000_005_000 {
		t.Fatalf("due times %v, want 1800000002000 (in) and 1800000005000 (at)", scores)
	}

	promote := func() int {
		n, err := stream.PromoteDue(ctx, rdb, "sched", 10)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := promote(); n != 0 {
		t.Fatalf("promoted %d jobs before they were due", n)
	}
	m.SetTime(time.UnixMilli(1_800_000_002_000))
	if n := promote(); n != 1 {
		t.Fatalf("promoted %d at +2s, want 1", n)
	}
	m.SetTime(time.UnixMilli(1_800_000_009_000))
	if n := promote(); n != 1 {
		t.Fatalf("promoted %d at +9s, want 1", n)
	}
	msgs, _ := rdb.XRange(ctx, "sched", "-", "+").Result()
	if len(msgs) != 2 || msgs[0].Values["type"] != "in" || msgs[1].Values["type"] != "at" || msgs[1].Values["job_id"] != at.ID {
		t.Fatalf("stream = %v", msgs)
	}

	// A member that does not parse is dead-lettered, not looped on.
	rdb.ZAdd(ctx, keys.Delayed, redis.Z{Score: 1, Member: "junk"})
	if n := promote(); n != 1 {
		t.Fatalf("promoted %d with a junk member, want 1 (moved to the DLQ)", n)
	}
	dead, _ := rdb.XRange(ctx, keys.Dead, "-", "+").Result()
	if len(dead) != 1 || dead[0].Values["delayed_member"] != "junk" || dead[0].Values["dead_reason"] != "malformed" {
		t.Fatalf("dead-letter stream = %v", dead)
	}
	if rdb.ZCard(ctx, keys.Delayed).Val() != 0 {
		t.Fatal("delayed set not empty")
	}
}
