package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func a11Producer(t *testing.T, window time.Duration) (*stream.Producer, string, stream.Keys) {
	t.Helper()
	rdb := redistest.Shared(t)
	name := "{" + redistest.Name(t) + "}"
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	return stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: window}), name, keys
}

func a11Job(t *testing.T, key string) *stream.Job {
	j, err := stream.NewJob("t", map[string]int{"x": 1})
	if err != nil {
		t.Fatal(err)
	}
	j.IdempotencyKey = key
	return j
}

// A batch that names the same key twice adds it once, and both jobs get the first's IDs.
func TestAttack11_OnceBatchDuplicatesWithin(t *testing.T) {
	t.Parallel()
	p, name, _ := a11Producer(t, time.Minute)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	jobs := []*stream.Job{a11Job(t, "a"), a11Job(t, "b"), a11Job(t, "a")}
	ids, err := p.EnqueueBatch(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if n := rdb.XLen(ctx, name).Val(); n != 2 {
		t.Fatalf("XLEN = %d, want 2 (key a twice in one batch)", n)
	}
	if ids[0] != ids[2] || jobs[0].ID != jobs[2].ID {
		t.Fatalf("duplicate in batch got ids %v / job ids %q %q", ids, jobs[0].ID, jobs[2].ID)
	}
}

// A batch larger than OnceBatch with the same key in different chunks adds it once.
func TestAttack11_OnceBatchDuplicatesAcrossChunks(t *testing.T) {
	t.Parallel()
	p, name, _ := a11Producer(t, time.Minute)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	var jobs []*stream.Job
	for i := 0; i < 3*stream.OnceBatch; i++ {
		k := fmt.Sprintf("k%d", i%(stream.OnceBatch+7))
		jobs = append(jobs, a11Job(t, k))
	}
	ids, err := p.EnqueueBatch(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(stream.OnceBatch + 7)
	if n := rdb.XLen(ctx, name).Val(); n != want {
		t.Fatalf("XLEN = %d, want %d", n, want)
	}
	first := map[string]string{}
	for i, j := range jobs {
		if f, ok := first[j.IdempotencyKey]; ok {
			if f != ids[i] {
				t.Fatalf("job %d key %s: id %s, first %s", i, j.IdempotencyKey, ids[i], f)
			}
		} else {
			first[j.IdempotencyKey] = ids[i]
		}
	}
}

// Concurrent producers racing on one key: one entry, one job ID everywhere.
func TestAttack11_OnceConcurrent(t *testing.T) {
	t.Parallel()
	p, name, _ := a11Producer(t, time.Minute)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	const n = 32
	var wg sync.WaitGroup
	ids := make([]string, n)
	jids := make([]string, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// every goroutine has its own producer, as separate processes would
			pp := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Minute})
			if i%2 == 0 {
				pp = p
			}
			j := a11Job(t, "same")
			ids[i], errs[i] = pp.Enqueue(ctx, j)
			jids[i] = j.ID
		}(i)
	}
	wg.Wait()
	for i := range errs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if ids[i] != ids[0] || jids[i] != jids[0] {
			t.Fatalf("call %d: %s/%s vs %s/%s", i, ids[i], jids[i], ids[0], jids[0])
		}
	}
	if c := rdb.XLen(ctx, name).Val(); c != 1 {
		t.Fatalf("XLEN = %d, want 1", c)
	}
}

// Hostile job IDs and keys: the marker is "<entry id> <job id>"; a job ID with
// spaces must come back whole to the duplicate.
func TestAttack11_OnceHostileIDs(t *testing.T) {
	t.Parallel()
	p, name, _ := a11Producer(t, time.Minute)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	for i, c := range []struct{ key, id string }{
		{"k with space", "id with  two spaces "},
		{"k\nnewline\x00nul", "id\nnl"},
		{strings.Repeat("K", 5000), strings.Repeat("I", 3000)},
		{"{brace}", "{x}"},
	} {
		j := a11Job(t, c.key)
		j.ID = c.id
		id1, err := p.Enqueue(ctx, j)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		j2 := a11Job(t, c.key)
		id2, err := p.Enqueue(ctx, j2)
		if err != nil {
			t.Fatalf("case %d dup: %v", i, err)
		}
		if id1 != id2 || j2.ID != c.id {
			t.Fatalf("case %d: dup got entry %q job %q, want %q %q", i, id2, j2.ID, id1, c.id)
		}
		if n := rdb.XLen(ctx, name).Val(); n != int64(i+1) {
			t.Fatalf("case %d: XLEN %d", i, n)
		}
	}
}

// Scheduled then immediate: the immediate adds nothing; after promotion one entry;
// a second EnqueueAt adds nothing either.
func TestAttack11_OnceScheduledThenNow(t *testing.T) {
	t.Parallel()
	p, name, keys := a11Producer(t, time.Minute)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	j := a11Job(t, "sch")
	if err := p.EnqueueAt(ctx, j, time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	first := j.ID
	j2 := a11Job(t, "sch")
	id, err := p.Enqueue(ctx, j2)
	if err != nil {
		t.Fatal(err)
	}
	if id != "" || j2.ID != first {
		t.Fatalf("Enqueue after EnqueueAt: entry %q job %q, want \"\" %q", id, j2.ID, first)
	}
	j3 := a11Job(t, "sch")
	if err := p.EnqueueIn(ctx, j3, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if j3.ID != first {
		t.Fatalf("EnqueueIn dup job id %q want %q", j3.ID, first)
	}
	if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != 1 {
		t.Fatalf("delayed set %d, want 1", n)
	}
	if n := rdb.XLen(ctx, name).Val(); n != 0 {
		t.Fatalf("XLEN %d before due", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for rdb.XLen(ctx, name).Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("never promoted")
		}
		if _, err := stream.PromoteDue(ctx, rdb, name, 100); err != nil {
			t.Fatal(err)
		}
	}
	// after promotion, still within the window: nothing more
	j4 := a11Job(t, "sch")
	if _, err := p.Enqueue(ctx, j4); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.PromoteDue(ctx, rdb, name, 100); err != nil {
		t.Fatal(err)
	}
	if n := rdb.XLen(ctx, name).Val(); n != 1 {
		t.Fatalf("XLEN %d after promotion + dup, want 1", n)
	}
	if j4.ID != first {
		t.Fatalf("dup after promotion job id %q want %q", j4.ID, first)
	}
}

// Scheduled in the past, or far in the future: the job is promoted once, and no
// marker is left without a time to live.
func TestAttack11_OnceScheduledExtremes(t *testing.T) {
	t.Parallel()
	p, name, keys := a11Producer(t, time.Minute)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	for i, due := range []time.Time{time.Unix(0, 0), time.Unix(1, 0).Add(-time.Hour * 24 * 365), time.Now().Add(-2 * time.Minute), time.Now().Add(100 * 365 * 24 * time.Hour)} {
		k := fmt.Sprintf("ext%d", i)
		j := a11Job(t, k)
		err := p.EnqueueAt(ctx, j, due)
		pt := rdb.PTTL(ctx, keys.Once+k).Val()
		if rdb.Exists(ctx, keys.Once+k).Val() == 1 && pt < 0 {
			t.Fatalf("due %v: marker without TTL (%v), err %v", due, pt, err)
		}
		if err != nil {
			continue
		}
		j2 := a11Job(t, k)
		_ = p.EnqueueAt(ctx, j2, due)
	}
	// past-due jobs get promoted; each key at most twice (window passed allows a re-add),
	// and none is missing
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := stream.PromoteDue(ctx, rdb, name, 100)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 && rdb.ZCard(ctx, keys.Delayed).Val() <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("promotion never finished")
		}
	}
	if rdb.ZCard(ctx, keys.Delayed).Val() != 1 {
		t.Fatalf("far-future job: delayed has %d members, want 1", rdb.ZCard(ctx, keys.Delayed).Val())
	}
	seen := map[string]int{}
	for _, m := range rdb.XRange(ctx, name, "-", "+").Val() {
		j, _ := stream.Decode(m.ID, m.Values)
		seen[j.IdempotencyKey]++
	}
	for i := 0; i < 3; i++ {
		if c := seen[fmt.Sprintf("ext%d", i)]; c < 1 {
			t.Fatalf("ext%d promoted %d times", i, c)
		}
	}
	t.Logf("promoted per key: %v", seen)
}
