package dlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/stream"
)

// TestDLQ_Replay_enqueueOnce: a dead job whose idempotency key's
// enqueue-once marker names another job stays dead (replaying it would add
// the key's job twice within the window); with its own marker, or none, it
// is replayed.
func TestDLQ_Replay_enqueueOnce(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{})
	ctx := context.Background()
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: b.source, EnqueueOnce: time.Hour})
	marker := func(key string) string {
		m, err := stream.OnceKey(b.source, key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.rdb.Del(context.Background(), m) })
		return m
	}

	// "taken": dead job J1; another job with its key was enqueued once
	// since. "own": the marker is J2's own (it was enqueued once, then
	// died). "free": no marker (the window has passed).
	b.add(t, deadJob([]any{"type", "t", "payload", "{}", "job_id", "J1", "idempotency_key", "taken"}, "panic", "boom", time.Now(), 1))
	b.add(t, deadJob([]any{"type", "t", "payload", "{}", "job_id", "J2", "idempotency_key", "own"}, "panic", "boom", time.Now(), 1))
	b.add(t, deadJob([]any{"type", "t", "payload", "{}", "job_id", "J3", "idempotency_key", "free"}, "panic", "boom", time.Now(), 1))
	marker("free")
	newer := &stream.Job{Type: "t", IdempotencyKey: "taken"}
	if _, err := p.Enqueue(ctx, newer); err != nil {
		t.Fatal(err)
	}
	marker("taken")
	b.rdb.Set(ctx, marker("own"), "1700000000000-7 J2", time.Hour)

	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 2 || res.Duplicates != 1 {
		t.Errorf("Replay = %+v; want 2 replayed, 1 duplicate", res)
	}
	msgs := b.rdb.XRange(ctx, b.source, "-", "+").Val()
	got := map[string]int{}
	for _, m := range msgs {
		got[m.Values["job_id"].(string)]++
	}
	if len(msgs) != 3 || got[newer.ID] != 1 || got["J2"] != 1 || got["J3"] != 1 || got["J1"] != 0 {
		t.Errorf("source holds jobs %v; want the newer %s, J2 and J3 once each, not J1", got, newer.ID)
	}
	dead := b.rdb.XRange(ctx, b.dead, "-", "+").Val()
	if len(dead) != 1 || dead[0].Values["job_id"] != "J1" {
		t.Errorf("dead-letter stream holds %v; want J1 alone", dead)
	}
}
