package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// TestStats_partitioned: a partitioned queue is one queue to stats, named
// with --partitions or found by SCAN, its figures summed over the
// partitions (one never written to counts as empty), with a breakdown.
func TestStats_partitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	p, err := stream.NewPartitionedProducer(rdb, stream.PartitionedProducerConfig{Queue: "orders", Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	parts := p.Streams()
	// Keys that route to partitions 0, 1 and 3 only: partition 2 never exists.
	var used []string
	for k := 0; len(used) < 6; k++ {
		key := "k" + string(rune('a'+k))
		if stream.PartitionOf(key, 4) != 2 {
			used = append(used, key)
		}
	}
	for _, key := range used {
		if _, _, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: key}); err != nil {
			t.Fatal(err)
		}
	}
	must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: "other", Values: []any{"type", "t"}}).Err())
	for _, s := range parts {
		if n := rdb.XLen(ctx, s).Val(); n > 0 {
			must(t, rdb.XGroupCreate(ctx, s, "g", "0").Err())
			if _, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{s, ">"}, Count: 1}).Result(); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys, _ := stream.KeysFor(parts[0])
	must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"dead_reason", "panic"}}).Err())
	env := []string{"REDIS_URL=redis://" + srv.Addr() + "/0"}

	check := func(args []string, got []streamStats, out string) {
		t.Helper()
		var q *streamStats
		for i := range got {
			if got[i].Stream == "orders" {
				q = &got[i]
			}
		}
		if q == nil || q.PartitionCount != 4 || q.Length != 6 || q.DeadByReason["panic"] != 1 || len(q.Groups) != 1 ||
			q.Groups[0].Pending != 3 || len(q.Groups[0].Consumers) != 1 || q.Groups[0].Consumers[0].Pending != 3 ||
			q.Groups[0].Lag == nil || *q.Groups[0].Lag != 3 {
			t.Fatalf("%v: got %s", args, out)
		}
		var sum int64
		for _, p := range q.Partitions {
			sum += p.Length
		}
		if sum != 6 {
			t.Fatalf("%v: partitions hold %d jobs, want 6: %s", args, sum, out)
		}
	}
	args := []string{"stats", "orders", "--partitions", "4", "-o", "json"}
	out, errOut, code := runCLI(t, env, "", args...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	var got []streamStats
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("bad json %v:\n%s", err, out)
	}
	if len(got) != 1 || len(got[0].Partitions) != 4 {
		t.Fatalf("%v: want one queue of 4 partitions: %s", args, out)
	}
	check(args, got, out)

	args = []string{"stats", "-o", "json"}
	out, errOut, code = runCLI(t, env, "", args...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	got = nil
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("bad json %v:\n%s", err, out)
	}
	if len(got) != 2 || got[1].Stream != "other" || len(got[0].Partitions) != 3 {
		t.Fatalf("%v: want queue orders (its 3 partitions found) and stream other: %s", args, out)
	}
	check(args, got, out)

	out, errOut, code = runCLI(t, env, "", "stats", "orders", "--partitions", "4")
	if code != 0 || !strings.Contains(out, "orders (4 partitions)") || !strings.Contains(out, "PARTITION") || !strings.Contains(out, parts[2]) {
		t.Fatalf("stats table: exit %d\n%s\n%s", code, out, errOut)
	}
	if _, _, code := runCLI(t, env, "", "stats", "nosuch", "--partitions", "4"); code != exitNotFound {
		t.Fatalf("stats of an unknown partitioned queue: exit %d, want %d", code, exitNotFound)
	}
	if _, _, code := runCLI(t, env, "", "stats", "--partitions", "4"); code != exitUsage {
		t.Fatalf("stats --partitions without names: exit %d, want %d", code, exitUsage)
	}
}

// TestDLQ_partitioned: dlq ls, replay and purge with --partitions run on
// every partition of the queue that exists, and replay puts each job back
// into its own partition.
func TestDLQ_partitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Shared(t)
	queue := strings.ReplaceAll(redistest.Name(t), ":", "-")
	parts, err := stream.Partitions(queue, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range parts {
			redistest.DeleteKeys(rdb, p+"*")
		}
	})
	// Two dead jobs in partition 1, one in partition 3; 0 and 2 do not exist.
	for i, p := range []string{parts[1], parts[1], parts[3]} {
		keys, _ := stream.KeysFor(p)
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, ID: strconv.Itoa(1000+i) + "-0", Values: []any{
			"v", "1", "type", "t", "payload", "{}", "job_id", "j" + string(rune('0'+i)),
			"dead_reason", "panic", "dead_error", "boom", "dead_at", "1700000000000", "dead_attempts", "1",
			"dead_stream", p}}).Err())
	}
	env := []string{"REDIS_URL=redis://" + redistest.Addr() + "/0"}

	out, errOut, code := runCLI(t, env, "", "dlq", "ls", queue, "--partitions", "4", "-o", "json")
	if code != 0 {
		t.Fatalf("dlq ls: exit %d: %s", code, errOut)
	}
	var ls []entryJSON
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("bad json %v:\n%s", err, out)
	}
	deadOf := func(i int) string { k, _ := stream.KeysFor(parts[i]); return k.Dead }
	wantPart := []int{1, 1, 3} // in the queue's order: by entry ID
	if len(ls) != 3 {
		t.Fatalf("dlq ls --partitions 4: %s", out)
	}
	for i, e := range ls {
		if e.Partition == nil || *e.Partition != wantPart[i] || e.DeadLetterStream != deadOf(wantPart[i]) {
			t.Fatalf("dlq ls --partitions 4: entry %d not in partition %d: %s", i, wantPart[i], out)
		}
	}
	// --limit over the queue, --after a position.
	out, errOut, code = runCLI(t, env, "", "dlq", "ls", queue, "--partitions", "4", "--limit", "2", "-o", "json")
	want := "more entries: add --after " + ls[1].ID + "@1"
	if code != 0 || strings.Count(out, `"id"`) != 2 || !strings.Contains(errOut, want) {
		t.Fatalf("dlq ls --limit 2: exit %d, want 2 entries and %q:\n%s\n%s", code, want, out, errOut)
	}
	out, _, code = runCLI(t, env, "", "dlq", "ls", queue, "--partitions", "4", "--after", ls[1].ID+"@1", "-o", "json")
	if code != 0 || strings.Count(out, `"id"`) != 1 || !strings.Contains(out, `"`+ls[2].ID+`"`) {
		t.Fatalf("dlq ls --after: exit %d:\n%s", code, out)
	}
	if _, _, code := runCLI(t, env, "", "dlq", "ls", queue, "--partitions", "4", "--after", ls[1].ID); code != exitUsage {
		t.Fatalf("dlq ls --after without a partition: exit %d, want %d", code, exitUsage)
	}
	out, _, code = runCLI(t, env, "", "dlq", "ls", queue, "--partitions", "4")
	if code != 0 || !strings.Contains(out, "PARTITION") {
		t.Fatalf("dlq ls table: exit %d\n%s", code, out)
	}
	// show by entry ID and by job ID, in whichever partition holds it.
	out, _, code = runCLI(t, env, "", "dlq", "show", queue, ls[2].ID, "--partitions", "4")
	if code != 0 || !strings.Contains(out, "in "+deadOf(3)) {
		t.Fatalf("dlq show %s: exit %d\n%s", ls[2].ID, code, out)
	}
	out, _, code = runCLI(t, env, "", "dlq", "show", queue, "j2", "--partitions", "4", "-o", "json")
	if code != 0 || !strings.Contains(out, `"job_id": "j2"`) || !strings.Contains(out, `"partition": 3`) {
		t.Fatalf("dlq show j2: exit %d\n%s", code, out)
	}
	if _, _, code := runCLI(t, env, "", "dlq", "show", queue, "nosuch", "--partitions", "4"); code != exitNotFound {
		t.Fatalf("dlq show of an unknown job: exit %d, want %d", code, exitNotFound)
	}

	out, errOut, code = runCLI(t, env, "", "dlq", "replay", queue, "--partitions", "4", "--yes", "--rate", "0")
	if code != 0 {
		t.Fatalf("dlq replay: exit %d: %s\n%s", code, errOut, out)
	}
	for i, want := range []int64{0, 2, 0, 1} {
		keys, _ := stream.KeysFor(parts[i])
		if n, d := rdb.XLen(ctx, parts[i]).Val(), rdb.XLen(ctx, keys.Dead).Val(); n != want || d != 0 {
			t.Errorf("after replay, partition %d holds %d jobs and %d dead letters, want %d and 0", i, n, d, want)
		}
	}
	if _, _, code := runCLI(t, env, "", "dlq", "purge", "nosuch", "--partitions", "4", "--yes"); code != exitNotFound {
		t.Fatalf("dlq purge of an unknown queue: exit %d, want %d", code, exitNotFound)
	}
}
