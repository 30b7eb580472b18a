package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// F28, Redis full: a 20 MB redis-server with noeviction is filled with jobs
// until XADD fails with OOM. A consumer then drains it while Redis is over
// its limit: plain jobs are acknowledged, some fail once (the retry script
// and the promoter run under OOM), some are dead-lettered (the dead-letter
// script runs under OOM), and one job stays running until the end, so its
// entry stays pending the whole time. Settlements succeed under OOM, the
// pending job pins nothing but itself, and enqueueing works again within
// seconds of the backlog draining. Every job ends exactly once: acknowledged
// after one effect, or dead-lettered.
func TestFault_redisFull(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "20mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	ctx := context.Background()
	const name = "full"
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupCreateMkStream(ctx, name, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	pad := strings.Repeat("x", 1000)
	newJob := func(kind string, i int) *stream.Job {
		j, err := stream.NewJSONJob(kind, map[string]any{"i": i, "pad": pad})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	kindOf := func(i int) string {
		switch {
		case i == 0:
			return "long"
		case i%50 == 0:
			return "dead"
		case i%10 == 0:
			return "flaky"
		}
		return "plain"
	}

	// Fill Redis until it refuses.
	var enqueued []string
	kinds := map[string]string{}
	for batch := 0; ; batch++ {
		jobs := make([]*stream.Job, 100)
		for k := range jobs {
			i := batch*100 + k
			jobs[k] = newJob(kindOf(i), i)
		}
		ids, err := p.EnqueueBatch(ctx, jobs)
		for k, id := range ids {
			if id != "" {
				enqueued = append(enqueued, jobs[k].ID)
				kinds[jobs[k].ID] = jobs[k].Type
			}
		}
		if err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatalf("enqueue: %v; want an OOM error once Redis is full", err)
			}
			break
		}
		if batch > 1000 {
			t.Fatal("Redis never filled up")
		}
	}
	// Whatever the batch's error, trust only what is in the stream.
	inStream := map[string]bool{}
	msgs, err := rdb.XRange(ctx, name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		id, _ := m.Values[stream.FieldJobID].(string)
		inStream[id] = true
	}
	var all []string
	for _, id := range enqueued {
		if inStream[id] {
			all = append(all, id)
		}
	}
	if len(all) != len(msgs) {
		t.Fatalf("the stream holds %d entries but %d of the enqueued jobs", len(msgs), len(all))
	}
	t.Logf("Redis full after %d jobs (%s)", len(all), usedMemory(t, rdb))

	var mu sync.Mutex
	effects := map[string]int{}
	failed := map[string]bool{}
	release := make(chan struct{})
	longStarted := make(chan struct{})
	c := consumer.New(rdb, consumer.Config{
		Stream: name, Group: "g", Consumer: "c", Concurrency: 20,
		PromoteInterval: 20 * time.Millisecond,
		Backoff:         consumer.Backoff{Base: 20 * time.Millisecond, Cap: 20 * time.Millisecond},
		Logger:          slog.New(slog.DiscardHandler),
	}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		defer mu.Unlock()
		switch j.Type {
		case "long":
			close(longStarted)
			mu.Unlock()
			<-release
			mu.Lock()
		case "dead":
			return consumer.Permanent(errors.New("never"))
		case "flaky":
			if !failed[j.ID] {
				failed[j.ID] = true
				return errors.New("once")
			}
		}
		effects[j.ID]++
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		close(release)
		if err := c.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		<-done
	}()
	select {
	case <-longStarted:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}

	var wantDead int
	for _, id := range all {
		if kinds[id] == "dead" {
			wantDead++
		}
	}
	settled := func() (int, int) {
		mu.Lock()
		n := len(effects)
		mu.Unlock()
		d, _ := rdb.XLen(ctx, keys.Dead).Result()
		return n, int(d)
	}
	eventually(t, 120*time.Second, func() (bool, string) {
		n, d := settled()
		return n == len(all)-1-wantDead && d == wantDead, fmt.Sprintf("%d of %d jobs done, %d of %d dead-lettered; %+v; %s",
			n, len(all)-1-wantDead, d, wantDead, c.Stats(), usedMemory(t, rdb))
	})
	drained := time.Now()
	var accepted time.Duration
	eventually(t, 30*time.Second, func() (bool, string) {
		_, err := p.Enqueue(ctx, newJob("plain", -1))
		if err != nil {
			return false, fmt.Sprintf("enqueue after the backlog drained: %v (%s, stream length %d)", err, usedMemory(t, rdb), rdb.XLen(ctx, name).Val())
		}
		accepted = time.Since(drained)
		return true, ""
	})
	t.Logf("enqueueing works again %v after the backlog drained (%s, stream length %d, the long job still pending)",
		accepted.Round(time.Millisecond), usedMemory(t, rdb), rdb.XLen(ctx, name).Val())

	release <- struct{}{}
	eventually(t, 30*time.Second, func() (bool, string) {
		pending, err := rdb.XPending(ctx, name, "g").Result()
		if err != nil {
			return false, err.Error()
		}
		n, _ := settled()
		return pending.Count == 0 && n == len(all)-wantDead+1, fmt.Sprintf("%d pending, %d effects", pending.Count, n)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range all {
		want := 1
		if kinds[id] == "dead" {
			want = 0
		}
		if effects[id] != want {
			t.Errorf("job %s (%s) has %d effects, want %d", id, kinds[id], effects[id], want)
		}
	}
	if n, _ := rdb.ZCard(ctx, keys.Delayed).Result(); n != 0 {
		t.Errorf("%d jobs left in the delayed set", n)
	}
	if n, _ := rdb.XLen(ctx, name).Result(); n != 0 {
		t.Errorf("the stream still holds %d settled entries", n)
	}
}

func usedMemory(t *testing.T, rdb *redis.Client) string {
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		return "INFO failed: " + err.Error()
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory_human:"); ok {
			return "used_memory " + v
		}
	}
	return "used_memory unknown"
}
