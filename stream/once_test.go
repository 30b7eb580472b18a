package stream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// The enqueue-once tests run against the real Redis at REDIS_ADDR.

// onceSetup returns a client to the shared Redis and a stream name of the
// test's own, whose keys are deleted when the test ends.
func onceSetup(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() {
		// Not a SCAN (slow on a full shared Redis): the keys these tests
		// use.
		keys, _ := stream.KeysFor(name)
		del := []string{name, keys.Delayed, keys.Dead, keys.Once + "k", keys.Once + "invoice-1", keys.Once + "invoice-2"}
		for i := range 300 {
			del = append(del, keys.Once+fmt.Sprint(i), keys.Once+fmt.Sprintf("k-%d", i))
		}
		rdb.Del(context.Background(), del...)
	})
	return rdb, name
}

// entriesWithKey returns the IDs of the stream's entries whose
// idempotency_key is key.
func entriesWithKey(t *testing.T, rdb *redis.Client, name, key string) []string {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range msgs {
		if m.Values[stream.FieldIdempotencyKey] == key {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

func TestProducer_EnqueueOnce(t *testing.T) {
	t.Parallel()

	t.Run("SecondEnqueueAddsNothing", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
		ctx := context.Background()
		first := &stream.Job{Type: "t", IdempotencyKey: "invoice-1"}
		id1, err := p.Enqueue(ctx, first)
		if err != nil || id1 == "" {
			t.Fatalf("first Enqueue = %q, %v", id1, err)
		}
		second := &stream.Job{Type: "t", IdempotencyKey: "invoice-1", ID: "other"}
		id2, err := p.Enqueue(ctx, second)
		if err != nil {
			t.Fatalf("second Enqueue: %v", err)
		}
		if id2 != id1 || second.ID != first.ID {
			t.Errorf("second Enqueue = %q with job ID %q; want the first's %q and %q", id2, second.ID, id1, first.ID)
		}
		// The same job again (a retry by the caller) gets its own IDs back.
		again, err := p.Enqueue(ctx, first)
		if err != nil || again != id1 {
			t.Errorf("retried Enqueue = %q, %v; want %q", again, err, id1)
		}
		if ids := entriesWithKey(t, rdb, name, "invoice-1"); len(ids) != 1 {
			t.Errorf("stream holds %v with the key; want one entry", ids)
		}
		// A job without a key, and one with another key, are added.
		if _, err := p.Enqueue(ctx, &stream.Job{Type: "t"}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "invoice-2"}); err != nil {
			t.Fatal(err)
		}
		if n := rdb.XLen(ctx, name).Val(); n != 3 {
			t.Errorf("XLEN = %d; want 3", n)
		}
		keys, _ := stream.KeysFor(name)
		if ttl := rdb.PTTL(ctx, keys.Once+"invoice-1").Val(); ttl <= 0 || ttl > time.Hour {
			t.Errorf("marker PTTL = %v; want within (0, 1h]", ttl)
		}
	})

	t.Run("AfterTheWindow", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
		ctx := context.Background()
		if _, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "k"}); err != nil {
			t.Fatal(err)
		}
		marker, _ := stream.OnceKey(name, "k")
		rdb.Del(ctx, marker) // the window has passed
		if _, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "k"}); err != nil {
			t.Fatal(err)
		}
		if ids := entriesWithKey(t, rdb, name, "k"); len(ids) != 2 {
			t.Errorf("stream holds %v with the key; want two entries once the marker is gone", ids)
		}
	})

	t.Run("WithoutEnqueueOnce", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
		ctx := context.Background()
		for range 2 {
			if _, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "k"}); err != nil {
				t.Fatal(err)
			}
		}
		if ids := entriesWithKey(t, rdb, name, "k"); len(ids) != 2 {
			t.Errorf("stream holds %v; want both jobs without EnqueueOnce", ids)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		ctx := context.Background()
		const producers = 20
		jobIDs := make([]string, producers)
		entryIDs := make([]string, producers)
		var wg sync.WaitGroup
		for i := range producers {
			wg.Go(func() {
				p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
				j := &stream.Job{Type: "t", IdempotencyKey: "k"}
				id, err := p.Enqueue(ctx, j)
				if err != nil {
					t.Error(err)
				}
				jobIDs[i], entryIDs[i] = j.ID, id
			})
		}
		wg.Wait()
		ids := entriesWithKey(t, rdb, name, "k")
		if len(ids) != 1 {
			t.Fatalf("stream holds %v; want one entry from %d producers", ids, producers)
		}
		msgs := rdb.XRange(ctx, name, "-", "+").Val()
		for i := range producers {
			if entryIDs[i] != ids[0] || jobIDs[i] != msgs[0].Values[stream.FieldJobID] {
				t.Errorf("producer %d got entry %q, job %q; want %q, %v", i, entryIDs[i], jobIDs[i], ids[0], msgs[0].Values[stream.FieldJobID])
			}
		}
	})

	t.Run("Batch", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
		ctx := context.Background()
		// 250 jobs: three scripts; keys repeat within the batch, across its
		// scripts, and with a job enqueued before.
		if _, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "k-0"}); err != nil {
			t.Fatal(err)
		}
		var jobs []*stream.Job
		for i := range 250 {
			j := &stream.Job{Type: "t", Payload: []byte(fmt.Sprint(i))}
			if i%2 == 0 {
				j.IdempotencyKey = fmt.Sprintf("k-%d", i%50)
			}
			jobs = append(jobs, j)
		}
		ids, err := p.EnqueueBatch(ctx, jobs)
		if err != nil {
			t.Fatal(err)
		}
		// 125 jobs without a key, 25 distinct keys of which k-0 existed.
		if n := rdb.XLen(ctx, name).Val(); n != 1+125+24 {
			t.Errorf("XLEN = %d; want %d", n, 1+125+24)
		}
		firstOf := map[string]int{}
		for i, j := range jobs {
			if ids[i] == "" && j.IdempotencyKey != "k-0" {
				t.Errorf("job %d has no entry ID", i)
			}
			if j.IdempotencyKey == "" || j.IdempotencyKey == "k-0" {
				continue
			}
			if f, ok := firstOf[j.IdempotencyKey]; ok {
				if ids[i] != ids[f] || j.ID != jobs[f].ID {
					t.Errorf("job %d (key %s) = %q/%q; want the first's %q/%q", i, j.IdempotencyKey, ids[i], j.ID, ids[f], jobs[f].ID)
				}
			} else {
				firstOf[j.IdempotencyKey] = i
			}
		}
	})

	t.Run("Scheduled", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Minute})
		ctx := context.Background()
		keys, _ := stream.KeysFor(name)
		first := &stream.Job{Type: "t", IdempotencyKey: "k"}
		if err := p.EnqueueIn(ctx, first, time.Hour); err != nil {
			t.Fatal(err)
		}
		// A repeat, scheduled or not, adds nothing and gets the first's ID.
		second := &stream.Job{Type: "t", IdempotencyKey: "k"}
		if err := p.EnqueueAt(ctx, second, time.Now()); err != nil {
			t.Fatal(err)
		}
		third := &stream.Job{Type: "t", IdempotencyKey: "k"}
		entry, err := p.Enqueue(ctx, third)
		if err != nil {
			t.Fatal(err)
		}
		if second.ID != first.ID || third.ID != first.ID || entry != "" {
			t.Errorf("repeats got job IDs %q, %q (entry %q); want %q and no entry", second.ID, third.ID, entry, first.ID)
		}
		if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != 1 {
			t.Errorf("delayed set holds %d; want 1", n)
		}
		if n := rdb.XLen(ctx, name).Val(); n != 0 {
			t.Errorf("XLEN = %d; want 0", n)
		}
		// The marker outlives the due time by the window.
		if ttl := rdb.PTTL(ctx, keys.Once+"k").Val(); ttl <= time.Hour || ttl > time.Hour+time.Minute {
			t.Errorf("marker PTTL = %v; want within (1h, 1h1m]", ttl)
		}
		// Once due, the promoter adds it once, although its marker exists.
		rdb.ZAdd(ctx, keys.Delayed, redis.Z{Score: 0, Member: rdb.ZRange(ctx, keys.Delayed, 0, 0).Val()[0]})
		if n, err := stream.PromoteDue(ctx, rdb, name, 10); err != nil || n != 1 {
			t.Fatalf("PromoteDue = %d, %v; want 1", n, err)
		}
		msgs := rdb.XRange(ctx, name, "-", "+").Val()
		if len(msgs) != 1 || msgs[0].Values[stream.FieldJobID] != first.ID {
			t.Errorf("stream holds %v; want the first job once", msgs)
		}
	})

	t.Run("MaxLen", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour, MaxLen: 1})
		ctx := context.Background()
		var jobs []*stream.Job
		for i := range 300 {
			jobs = append(jobs, &stream.Job{Type: "t", IdempotencyKey: fmt.Sprint(i)})
		}
		if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
			t.Fatal(err)
		}
		if n := rdb.XLen(ctx, name).Val(); n >= 300 {
			t.Errorf("XLEN = %d; want it trimmed by MAXLEN ~ 1", n)
		}
	})

	t.Run("NoScript", func(t *testing.T) {
		// The script cache is emptied (a Redis restart): the batch's
		// EVALSHAs fail with NOSCRIPT and are sent again with EVAL.
		srv := redistest.Start(t, redistest.Options{})
		rdb := srv.Client(t)
		ctx := context.Background()
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "q", EnqueueOnce: time.Hour})
		for round := range 2 {
			rdb.ScriptFlush(ctx)
			var jobs []*stream.Job
			for i := range 150 {
				jobs = append(jobs, &stream.Job{Type: "t", IdempotencyKey: fmt.Sprintf("%d-%d", round, i)})
			}
			if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
				t.Fatal(err)
			}
		}
		if n := rdb.XLen(ctx, "q").Val(); n != 300 {
			t.Errorf("XLEN = %d; want 300", n)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		rdb, name := onceSetup(t)
		ctx := context.Background()
		rdb.Set(ctx, name, "not a stream", 0)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
		_, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "k"})
		if err == nil || !strings.Contains(err.Error(), "(not enqueued)") || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("Enqueue to a string key: %v; want a WRONGTYPE not-enqueued error", err)
		}
		marker, _ := stream.OnceKey(name, "k")
		if rdb.Exists(ctx, marker).Val() != 0 {
			t.Error("a failed enqueue left its marker")
		}
	})
}
