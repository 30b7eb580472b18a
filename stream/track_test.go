package stream_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// scriptText returns an embedded script's source, as non-Go callers read it.
func scriptText(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// enqueue.lua writes only index records declared in KEYS: a tracked job
// whose record is not declared makes the call fail with nothing written,
// the other jobs of the call included; declared, the record is written.
func TestEnqueueScript_recordInKeys(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	record := stream.JobKey(keys, "J1")
	t.Cleanup(func() { rdb.Del(context.Background(), name, record) })
	src := scriptText(t, "enqueue.lua")
	plain := []any{"0", "P1", 4, "type", "t", "job_id", "P1"}
	tracked := []any{"0", "J1", 6, "type", "t", "job_id", "J1", "track", "1"}
	argv := append(append([]any{0, 1000, 2}, plain...), tracked...)
	err := rdb.Eval(ctx, src, []string{name}, argv...).Err()
	if err == nil || !strings.Contains(err.Error(), "not in KEYS") {
		t.Errorf("tracked job without its record in KEYS: %v; want an error naming KEYS", err)
	}
	if n := rdb.Exists(ctx, name, record).Val(); n != 0 {
		t.Fatalf("the refused call wrote %d of the stream and the record", n)
	}
	if err := rdb.Eval(ctx, src, []string{name, record}, argv...).Err(); err != nil {
		t.Fatal(err)
	}
	r, err := stream.ParseRecord(rdb.Get(ctx, record).Val())
	if err != nil || r.State != stream.StateWaiting || rdb.XLen(ctx, name).Val() != 2 {
		t.Errorf("record %+v (%v), %d entries; want waiting and 2 entries", r, err, rdb.XLen(ctx, name).Val())
	}
}

// promote.lua writes only index records declared in KEYS: called without
// them it moves the due jobs before the first tracked one and names the
// records it needs; called with them it moves the rest, in order.
func TestPromoteScript_recordsInKeys(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name := "{" + redistest.Name(t) + "}:jobs"
	keys, _ := stream.KeysFor(name)
	t.Cleanup(func() {
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, stream.JobKey(keys, "B"), stream.JobKey(keys, "D"))
	})
	for i, id := range []string{"A", "B", "C", "D"} {
		f := []any{"type", "t", "job_id", id}
		if id == "B" || id == "D" {
			f = append(f, "track", "1")
		}
		rdb.ZAdd(ctx, keys.Delayed, redis.Z{Score: float64(1000 + i), Member: stream.EncodeDelayed(id, f)})
	}
	src := scriptText(t, "promote.lua")
	base := []string{keys.Stream, keys.Delayed, keys.Dead}
	v, err := rdb.Eval(ctx, src, base, 10).Slice()
	want := []any{int64(1), stream.JobKey(keys, "B"), stream.JobKey(keys, "D")}
	if err != nil || fmt.Sprint(v) != fmt.Sprint(want) {
		t.Fatalf("promote without records = %v, %v; want %v", v, err, want)
	}
	if n := rdb.Exists(ctx, stream.JobKey(keys, "B"), stream.JobKey(keys, "D")).Val(); n != 0 {
		t.Errorf("%d undeclared records written", n)
	}
	v, err = rdb.Eval(ctx, src, append(base, stream.JobKey(keys, "B"), stream.JobKey(keys, "D")), 10).Slice()
	if err != nil || fmt.Sprint(v) != "[3]" {
		t.Fatalf("promote with the records = %v, %v; want [3]", v, err)
	}
	var order []string
	for _, m := range rdb.XRange(ctx, name, "-", "+").Val() {
		order = append(order, m.Values["job_id"].(string))
	}
	if !slices.Equal(order, []string{"A", "B", "C", "D"}) {
		t.Errorf("stream order %v, want A B C D", order)
	}
	for _, id := range []string{"B", "D"} {
		if r, err := stream.ParseRecord(rdb.Get(ctx, stream.JobKey(keys, id)).Val()); err != nil || r.State != stream.StateWaiting {
			t.Errorf("record of %s: %+v, %v; want waiting", id, r, err)
		}
	}
}

// PromoteDue moves tracked and untracked due jobs alike, writing each
// tracked job's record, in at most two calls for one batch.
func TestPromoteDue_tracked(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	var jobs []*stream.Job
	for i := range 50 {
		jobs = append(jobs, &stream.Job{Type: "t", ID: fmt.Sprintf("j%d", i), Track: i%3 != 0})
	}
	t.Cleanup(func() {
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead)
		for _, j := range jobs {
			rdb.Del(context.Background(), stream.JobKey(keys, j.ID))
		}
	})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	for _, j := range jobs {
		if err := p.EnqueueAt(ctx, j, time.Now().Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := stream.PromoteDue(ctx, rdb, name, 100)
	if err != nil || n != 50 {
		t.Fatalf("PromoteDue = %d, %v; want 50", n, err)
	}
	for _, j := range jobs {
		v, err := rdb.Get(ctx, stream.JobKey(keys, j.ID)).Result()
		r, _ := stream.ParseRecord(v)
		if j.Track != (err == nil) || j.Track && r.State != stream.StateWaiting {
			t.Errorf("job %s (tracked %v): record %q, %v", j.ID, j.Track, v, err)
		}
	}
}

// A batch mixing tracked and plain jobs is one round trip: XADDs and
// enqueue scripts pipelined in the batch's order; with the script cache
// emptied, the scripts are sent again and every job is added once.
func TestProducer_EnqueueBatchTracked(t *testing.T) {
	t.Parallel()
	p, b := setupProducer(t, stream.ProducerConfig{})
	ctx := context.Background()
	batch := func(round int) []*stream.Job {
		var jobs []*stream.Job
		for i := range 6 {
			jobs = append(jobs, &stream.Job{Type: "t", ID: fmt.Sprintf("%d-%d", round, i), Track: i == 1 || i == 2 || i == 4})
		}
		return jobs
	}
	if _, err := p.EnqueueBatch(ctx, batch(0)); err != nil { // loads the script
		t.Fatal(err)
	}
	b.rec.mu.Lock()
	b.rec.singles, b.rec.pipelines = nil, nil
	b.rec.mu.Unlock()
	if _, err := p.EnqueueBatch(ctx, batch(1)); err != nil {
		t.Fatal(err)
	}
	var sent []string
	for _, c := range b.rec.pipelines[0] {
		sent = append(sent, fmt.Sprint(c[0]))
	}
	if len(b.rec.singles) != 0 || len(b.rec.pipelines) != 1 || fmt.Sprint(sent) != "[xadd evalsha xadd evalsha xadd]" {
		t.Errorf("sent %d single commands and %d pipelines, the first %v; want one pipeline [xadd evalsha xadd evalsha xadd]",
			len(b.rec.singles), len(b.rec.pipelines), sent)
	}
	var order []string
	for _, m := range b.rdb.XRange(ctx, b.stream, "-", "+").Val() {
		order = append(order, m.Values["job_id"].(string))
	}
	if fmt.Sprint(order) != "[0-0 0-1 0-2 0-3 0-4 0-5 1-0 1-1 1-2 1-3 1-4 1-5]" {
		t.Errorf("stream order %v, want the batches' order", order)
	}
	keys, _ := stream.KeysFor(b.stream)
	for _, j := range append(batch(0), batch(1)...) {
		if got := b.mr.Exists(stream.JobKey(keys, j.ID)); got != j.Track {
			t.Errorf("job %s tracked %v: record exists %v", j.ID, j.Track, got)
		}
	}

	t.Run("NoScript", func(t *testing.T) {
		srv := redistest.Start(t, redistest.Options{})
		rdb := srv.Client(t)
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "q"})
		for round := range 2 {
			rdb.ScriptFlush(ctx)
			if _, err := p.EnqueueBatch(ctx, batch(round)); err != nil {
				t.Fatal(err)
			}
		}
		keys, _ := stream.KeysFor("q")
		if n, recs := rdb.XLen(ctx, "q").Val(), rdb.Exists(ctx, stream.JobKey(keys, "0-1"), stream.JobKey(keys, "1-4")).Val(); n != 12 || recs != 2 {
			t.Errorf("XLEN = %d, records %d; want 12 and 2", n, recs)
		}
	})
}
