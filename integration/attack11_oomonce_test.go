package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// Enqueue-once on a full Redis (maxmemory + noeviction): a failed enqueue must leave
// no marker without its job (the job would then be lost for the window), and once
// memory is freed, retrying every job adds each key exactly once.
func TestAttack11_OnceUnderOOM(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	ctx := context.Background()
	name := "{oomonce}"
	keys, _ := stream.KeysFor(name)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
	big := strings.Repeat("x", 64<<10)
	// fill until refused
	for i := 0; ; i++ {
		if err := rdb.Set(ctx, fmt.Sprintf("fill:%d", i), big, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			break
		}
		if i > 10000 {
			t.Fatal("never OOM")
		}
	}
	mk := func(i int) *stream.Job {
		j := a11Job(t, fmt.Sprintf("k%d", i))
		j.ID = fmt.Sprintf("job%d", i)
		j.Payload = []byte(strings.Repeat("p", 2000))
		return j
	}
	var oomErrs int
	for i := 0; i < 20; i++ {
		if _, err := p.Enqueue(ctx, mk(i)); err != nil {
			oomErrs++
		}
	}
	var batch []*stream.Job
	for i := 20; i < 250; i++ {
		batch = append(batch, mk(i))
	}
	if _, err := p.EnqueueBatch(ctx, batch); err != nil {
		oomErrs++
	}
	for i := 250; i < 260; i++ {
		if err := p.EnqueueIn(ctx, mk(i), time.Millisecond); err != nil {
			oomErrs++
		}
	}
	if oomErrs == 0 {
		t.Fatal("no enqueue failed on a full Redis: precondition broken")
	}
	// every marker present must name a job that exists
	present := map[string]bool{}
	for _, m := range rdb.XRange(ctx, name, "-", "+").Val() {
		j, err := stream.Decode(m.ID, m.Values)
		if err != nil {
			t.Fatal(err)
		}
		present[j.ID] = true
	}
	for _, mem := range rdb.ZRange(ctx, keys.Delayed, 0, -1).Val() {
		for i := 250; i < 260; i++ {
			if strings.Contains(mem, fmt.Sprintf("job%d", i)) {
				present[fmt.Sprintf("job%d", i)] = true
			}
		}
	}
	for i := 0; i < 260; i++ {
		v, err := rdb.Get(ctx, keys.Once+fmt.Sprintf("k%d", i)).Result()
		if err == nil && !present[fmt.Sprintf("job%d", i)] {
			t.Fatalf("marker of k%d is %q but job%d is neither in the stream nor delayed", i, v, i)
		}
	}
	// free memory and retry everything
	redistest.DeleteKeys(rdb, "fill:*")
	for i := 0; i < 250; i++ {
		if _, err := p.Enqueue(ctx, mk(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 250; i < 260; i++ {
		if err := p.EnqueueIn(ctx, mk(i), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for rdb.ZCard(ctx, keys.Delayed).Val() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("delayed never drained")
		}
		if _, err := stream.PromoteDue(ctx, rdb, name, 100); err != nil {
			t.Fatal(err)
		}
	}
	count := map[string]int{}
	for _, m := range rdb.XRange(ctx, name, "-", "+").Val() {
		j, _ := stream.Decode(m.ID, m.Values)
		count[j.ID]++
	}
	for i := 0; i < 260; i++ {
		if c := count[fmt.Sprintf("job%d", i)]; c != 1 {
			t.Fatalf("job%d in the stream %d times (OOM errors %d)", i, c, oomErrs)
		}
	}
}
