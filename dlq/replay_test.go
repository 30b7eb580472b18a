package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/internal/poll"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// rawEntries returns key's entries with their raw fields in order.
func rawEntries(t *testing.T, rdb *redis.Client, key string) [][2]any {
	t.Helper()
	res, err := rdb.Do(context.Background(), "XRANGE", key, "-", "+").Slice()
	if err != nil {
		t.Fatal(err)
	}
	out := make([][2]any, len(res))
	for i, r := range res {
		p := r.([]any)
		out[i] = [2]any{p[0], p[1]}
	}
	return out
}

func fieldMap(fields []any) map[string]any {
	m := make(map[string]any)
	for i := 0; i+1 < len(fields); i += 2 {
		m[fields[i].(string)] = fields[i+1]
	}
	return m
}

// addJobs dead-letters n jobs with job IDs prefix-0 … and returns their
// dead-letter entry IDs.
func addJobs(t *testing.T, b *bundle, n int, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	cmds, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range n {
			p.XAdd(ctx, &redis.XAddArgs{Stream: b.dead, Values: deadJob(
				[]any{"type", "t", "payload", "{}", "job_id", fmt.Sprintf("%s-%d", prefix, i), "attempt", "3"},
				"exhausted", "e", time.Now(), 3)})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, n)
	for i, c := range cmds {
		out[i] = c.(*redis.StringCmd).Val()
	}
	return out
}

// jobIDs returns the job_id of every entry of the source stream, in order.
func jobIDs(t *testing.T, b *bundle) []string {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), b.source, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i], _ = m.Values["job_id"].(string)
	}
	return out
}

func TestDLQ_ReplayFields(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{})
	ctx := context.Background()
	job := []any{"v", "1", "type", "email", "payload", "\x00\xffbin", "job_id", "J1", "idempotency_key", "IK1",
		"attempt", "4", "last_error", "boom", "h.tenant", "acme", "origin", "cron", "origin", "cron2"}
	full := b.add(t, deadJob(job, "exhausted", "boom", time.Now(), 5))
	// A job written without job_id and created_at (as redis-cli would), that
	// died on its first attempt, and one replayed twice before.
	bare := b.add(t, deadJob([]any{"type", "sms", "payload", "{}"}, "permanent", "no", time.Now(), 1))
	again := b.add(t, deadJob([]any{"type", "sms", "job_id", "J3", "replayed_from", "1-1", "replay_count", "2"}, "panic", "p", time.Now(), 1))

	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 3 || res.Missing != 0 || res.Examined != 3 || res.Resumed {
		t.Errorf("result %+v, want 3 replayed of 3 examined", res)
	}
	if n := b.len(t, b.dead); n != 0 {
		t.Errorf("%d entries left in the dead-letter stream", n)
	}
	for _, k := range []string{b.lease, b.cursor} {
		if n, _ := b.rdb.Exists(ctx, k).Result(); n != 0 {
			t.Errorf("key %s left after the replay", k)
		}
	}
	got := rawEntries(t, b.rdb, b.source)
	if len(got) != 3 {
		t.Fatalf("source has %d entries, want 3", len(got))
	}
	wantFields := [][]any{
		{"v", "1", "type", "email", "payload", "\x00\xffbin", "job_id", "J1", "idempotency_key", "IK1",
			"last_error", "boom", "h.tenant", "acme", "origin", "cron", "origin", "cron2", "created_at", "1700000000000", "replayed_from", full, "replay_count", "1"},
		{"type", "sms", "payload", "{}", "job_id", "1700000000000-7", "created_at", "1700000000000", "replayed_from", bare, "replay_count", "1"},
		{"type", "sms", "job_id", "J3", "created_at", "1700000000000", "replayed_from", again, "replay_count", "3"},
	}
	for i, e := range got {
		fields := e[1].([]any)
		if fmt.Sprint(fields) != fmt.Sprint(wantFields[i]) {
			t.Errorf("replayed entry %d:\n got %q\nwant %q", i, fields, wantFields[i])
		}
		j, err := stream.Decode(e[0].(string), fieldMap(fields))
		if err != nil {
			t.Errorf("replayed entry %d does not decode: %v", i, err)
			continue
		}
		if j.Attempt != 0 {
			t.Errorf("replayed entry %d: attempt %d, want 0", i, j.Attempt)
		}
		if i == 0 && (j.ID != "J1" || j.IdempotencyKey != "IK1" || string(j.Payload) != "\x00\xffbin") {
			t.Errorf("replayed job: %+v", j)
		}
		if i == 1 && (j.ID != "1700000000000-7" || !j.CreatedAt.Equal(time.UnixMilli(1700000000000))) {
			t.Errorf("replayed bare job: ID %q created %v, want its first entry's", j.ID, j.CreatedAt)
		}
	}
}

func TestDLQ_ReplayFilterDryRun(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{PageSize: 4})
	ctx := context.Background()
	var want []string
	for i := range 30 {
		typ := "a"
		if i%3 == 0 {
			typ = "b"
			want = append(want, fmt.Sprint(i))
		}
		b.add(t, deadJob([]any{"type", typ, "job_id", fmt.Sprint(i)}, "exhausted", "e", time.Now(), 1))
	}
	f := dlq.Filter{Types: []string{"b"}}
	before := rawEntries(t, b.rdb, b.dead)
	res, err := d.Replay(ctx, f, dlq.ReplayOptions{DryRun: true})
	if err != nil || res.Replayed != 10 || res.Examined != 30 {
		t.Fatalf("dry run: %+v, %v; want 10 of 30", res, err)
	}
	res, err = d.Replay(ctx, f, dlq.ReplayOptions{DryRun: true, Limit: 4})
	if err != nil || res.Replayed != 4 {
		t.Fatalf("dry run with Limit 4: %+v, %v", res, err)
	}
	if after := rawEntries(t, b.rdb, b.dead); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("dry run changed the dead-letter stream")
	}
	for _, k := range []string{b.source, b.lease, b.cursor} {
		if n, _ := b.rdb.Exists(ctx, k).Result(); n != 0 {
			t.Errorf("dry run wrote %s", k)
		}
	}
	res, err = d.Replay(ctx, f, dlq.ReplayOptions{})
	if err != nil || res.Replayed != 10 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if got := jobIDs(t, b); !slices.Equal(got, want) {
		t.Errorf("replayed %v, want %v", got, want)
	}
	if n := b.len(t, b.dead); n != 20 {
		t.Errorf("%d entries left, want the 20 that did not match", n)
	}
}

func TestDLQ_ReplayActive(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{LeaseTTL: 300 * time.Millisecond})
	ctx := context.Background()
	addJobs(t, b, 40, "j")
	rctx, cancel := context.WithCancel(ctx)
	var (
		wg    sync.WaitGroup
		first dlq.ReplayResult
		ferr  error
	)
	wg.Go(func() { first, ferr = d.Replay(rctx, dlq.Filter{}, dlq.ReplayOptions{Rate: 50}) })
	waitFor(t, 5*time.Second, func() bool { return b.len(t, b.source) >= 5 })

	// Longer than the lease TTL: the running replay renews it.
	for range 3 {
		if _, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
			t.Fatalf("second Replay: %v, want ErrReplayActive", err)
		}
		time.Sleep(150 * time.Millisecond) // spans the lease TTL on purpose
	}
	// Another filter is refused too: one replay per dead-letter stream.
	if _, err := d.Replay(ctx, dlq.Filter{Types: []string{"x"}}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
		t.Fatalf("second Replay with another filter: %v, want ErrReplayActive", err)
	}
	cancel()
	wg.Wait()
	if !errors.Is(ferr, context.Canceled) || first.Replayed == 0 || first.Replayed >= 40 {
		t.Fatalf("cancelled replay: %+v, %v", first, ferr)
	}
	// Cancelled: the lease is released at once, and the next replay resumes.
	second, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Resumed || first.Replayed+second.Replayed != 40 || second.Examined != 40-first.Replayed {
		t.Errorf("resumed replay %+v after %+v, want the other %d jobs, nothing rescanned", second, first, 40-first.Replayed)
	}
	assertOnce(t, b, 40, "j")
}

func TestDLQ_ReplayLeaseStolen(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{LeaseTTL: time.Second})
	ctx := context.Background()
	addJobs(t, b, 30, "j")
	var (
		wg  sync.WaitGroup
		res dlq.ReplayResult
		err error
	)
	wg.Go(func() { res, err = d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{Rate: 50}) })
	waitFor(t, 5*time.Second, func() bool { return b.len(t, b.source) >= 3 })
	if err := b.rdb.Set(ctx, b.lease, "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	// A move queued before the SET ran before it; every later one must see
	// the token is not the replay's.
	atSteal := b.len(t, b.source)
	wg.Wait()
	if !errors.Is(err, dlq.ErrLeaseLost) {
		t.Fatalf("Replay after its lease was taken: %+v, %v; want ErrLeaseLost", res, err)
	}
	n := b.len(t, b.source)
	if int(n) != res.Replayed || n != atSteal || n+b.len(t, b.dead) != 30 {
		t.Errorf("source %d (%d when the lease was taken), dead %d, result %+v: want the replay to stop at once", n, atSteal, b.len(t, b.dead), res)
	}
	if v, _ := b.rdb.Get(ctx, b.lease).Result(); v != "someone-else" {
		t.Errorf("the stopped replay released a lease it no longer held: %q", v)
	}
}

// A replay at 100/s with progress every 100 ms: 60 moves, the last 590 ms
// after the first. Its time is bounded from what happened: at least the
// schedule (less the pacer's 100 ms catch-up burst), at most the schedule +
// 20%, twice the time its Redis calls took and twice the stalls measured
// meanwhile (a busy machine). Reports come every interval: consecutive ones
// no closer than it and no further apart than it plus the longest gap
// between two moves (by their entries' Redis times), and each one's rate
// and ETA follow from its counts.
func TestDLQ_ReplayRateProgress(t *testing.T) {
	t.Parallel()
	const (
		rate       = 100.0
		every      = 100 * time.Millisecond
		pacerBurst = 100 * time.Millisecond
	)
	_, b := setup(t, dlq.Config{})
	addJobs(t, b, 60, "j")
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	defer rdb.Close()
	var work redistest.CallTimer
	rdb.AddHook(&work)
	d, err := dlq.New(rdb, b.source, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stalls := redistest.WatchStalls(b.rdb, 2*redistest.StallInterval)
	defer stalls.Stop()
	var reports []dlq.ReplayProgress
	began := time.Now()
	res, err := d.Replay(context.Background(), dlq.Filter{}, dlq.ReplayOptions{
		Rate: rate, ProgressInterval: every,
		Progress: func(p dlq.ReplayProgress) { reports = append(reports, p) },
	})
	if err != nil {
		t.Fatal(err)
	}
	stalled := stalls.Within(began, time.Now())
	schedule := time.Duration(59 / rate * float64(time.Second)) // the first move at 0
	most := schedule*12/10 + 2*work.Total() + 2*stalled
	t.Logf("%+v; %v in Redis calls, %v stalled; %d reports", res, work.Total(), stalled, len(reports))
	if res.Replayed != 60 || res.Elapsed < schedule-pacerBurst || res.Elapsed > most {
		t.Errorf("%+v: want 60 jobs in %v to %v (the schedule %v less a burst; + 20%%, twice the %v in Redis calls and the %v stalled)",
			res, schedule-pacerBurst, most, schedule, work.Total(), stalled)
	}
	msgs, err := b.rdb.XRange(context.Background(), b.source, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var gap time.Duration // the longest time between two moves
	for i := 1; i < len(msgs); i++ {
		a, _ := stream.EntryTime(msgs[i-1].ID)
		c, _ := stream.EntryTime(msgs[i].ID)
		gap = max(gap, c.Sub(a))
	}
	if len(reports) < 3 {
		t.Fatalf("%d progress reports in %v every %v: %+v", len(reports), res.Elapsed, every, reports)
	}
	for i, p := range reports {
		if p.Total != 60 || (i > 0 && p.Done < reports[i-1].Done) {
			t.Errorf("report %d: %+v", i, p)
		}
		if p.Elapsed > 0 && math.Abs(p.Rate-float64(p.Done)/p.Elapsed.Seconds()) > 0.01*p.Rate {
			t.Errorf("report %d: %+v: the rate is not Done/Elapsed", i, p)
		}
		if i == 0 || i == len(reports)-1 { // the last one is forced
			continue
		}
		// A report is due at the first move once the interval has passed
		// (a few ms: the entry times' resolution, the time between a move
		// and its report).
		if d := p.Elapsed - reports[i-1].Elapsed; d < every-time.Millisecond || d > every+gap+5*time.Millisecond {
			t.Errorf("reports %d and %d are %v apart; want %v to %v (the interval + the longest gap between moves)",
				i-1, i, d, every, every+gap)
		}
	}
	last := reports[len(reports)-1]
	if last.Done != 60 || last.Matched != 60 || last.ETA != 0 {
		t.Errorf("last report %+v", last)
	}
	if mid := reports[len(reports)/2]; mid.ETA <= 0 || math.Abs(mid.ETA.Seconds()-float64(mid.Total-mid.Matched)/mid.Rate) > 0.01 {
		t.Errorf("a middle report %+v, want the ETA of what is left at its rate", mid)
	}
	assertOnce(t, b, 60, "j")
}

func TestDLQ_ReplayResume(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{PageSize: 5})
	ctx := context.Background()
	// 20 jobs, every other one matches.
	for i := range 20 {
		typ := []string{"a", "b"}[i%2]
		b.add(t, deadJob([]any{"type", typ, "job_id", strconv.Itoa(i)}, "exhausted", "e", time.Now(), 1))
	}
	f := dlq.Filter{Types: []string{"a"}}
	r1, err := d.Replay(ctx, f, dlq.ReplayOptions{Limit: 4})
	if err != nil || r1.Replayed != 4 || r1.Resumed {
		t.Fatalf("first replay: %+v, %v", r1, err)
	}
	// Dead-lettered after the replay began: not part of it.
	late := b.add(t, deadJob([]any{"type", "a", "job_id", "late"}, "exhausted", "e", time.Now(), 1))
	// Another filter does not disturb the cursor... until it runs: a replay
	// with another filter starts over and takes the cursor for itself.
	if r, err := d.Replay(ctx, f, dlq.ReplayOptions{DryRun: true}); err != nil || !r.Resumed || r.Replayed != 6 {
		t.Fatalf("dry run of the resumed replay: %+v, %v; want the 6 left", r, err)
	}
	r2, err := d.Replay(ctx, f, dlq.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The first stopped at the 5th match (entry 8); entries 0-7 are not read again.
	if !r2.Resumed || r2.Replayed != 6 || r2.Examined != 12 {
		t.Errorf("resumed replay %+v, want 6 replayed of 12 examined", r2)
	}
	if got := jobIDs(t, b); !slices.Equal(got, []string{"0", "2", "4", "6", "8", "10", "12", "14", "16", "18"}) {
		t.Errorf("replayed %v", got)
	}
	if _, err := d.Get(ctx, late); err != nil {
		t.Errorf("the late entry: %v, want it still dead", err)
	}
	// The finished replay deleted its cursor: the next one starts over.
	r3, err := d.Replay(ctx, f, dlq.ReplayOptions{})
	if err != nil || r3.Resumed || r3.Replayed != 1 || r3.Examined != 11 {
		t.Errorf("fresh replay %+v, %v; want the late job", r3, err)
	}
}

func TestDLQ_ReplayIDs(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{})
	ids := addJobs(t, b, 10, "j")
	res, err := d.Replay(context.Background(), dlq.Filter{IDs: []string{ids[7], ids[2], "1-1"}}, dlq.ReplayOptions{})
	if err != nil || res.Replayed != 2 {
		t.Fatalf("%+v, %v", res, err)
	}
	if got := jobIDs(t, b); !slices.Equal(got, []string{"j-2", "j-7"}) {
		t.Errorf("replayed %v", got)
	}
}

// assertOnce checks that the source stream holds jobs prefix-0 …
// prefix-(n-1) once each, and the dead-letter stream none.
func assertOnce(t *testing.T, b *bundle, n int, prefix string) {
	t.Helper()
	seen := make(map[string]int)
	for _, id := range jobIDs(t, b) {
		seen[id]++
	}
	for i := range n {
		if id := fmt.Sprintf("%s-%d", prefix, i); seen[id] != 1 {
			t.Errorf("job %s replayed %d times", id, seen[id])
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct jobs in the source, want %d", len(seen), n)
	}
	if d := b.len(t, b.dead); d != 0 {
		t.Errorf("%d entries left in the dead-letter stream", d)
	}
}

// waitFor polls cond every 5 ms until it holds, and fails the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.Until(t, timeout, poll.True("", cond))
}

// TestDLQ_ReplayBeforeMove: the hook sees each matching entry while it is
// still dead and not yet replayed, in order, and never in a dry run; an
// error stops the replay with that entry still dead, and the next Replay
// calls the hook for it again and continues.
func TestDLQ_ReplayBeforeMove(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{PageSize: 2})
	ctx := context.Background()
	ids := addJobs(t, b, 5, "j")
	var seen []string
	refuse := ids[3]
	hook := func(ctx context.Context, e dlq.Entry) error {
		if _, err := d.Get(ctx, e.ID); err != nil {
			t.Errorf("BeforeMove(%s): the entry is no longer dead: %v", e.ID, err)
		}
		if got := jobIDs(t, b); slices.Contains(got, e.Job.ID) {
			t.Errorf("BeforeMove(%s): job %s already replayed", e.ID, e.Job.ID)
		}
		seen = append(seen, e.ID)
		if e.ID == refuse {
			return errors.New("store down")
		}
		return nil
	}
	if _, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{DryRun: true, BeforeMove: hook}); err != nil || len(seen) != 0 {
		t.Fatalf("dry run: %v, hook called for %v; want no call", err, seen)
	}
	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{BeforeMove: hook})
	if err == nil || !strings.Contains(err.Error(), "store down") || res.Replayed != 3 {
		t.Fatalf("replay with a failing hook: %+v, %v; want 3 replayed and the hook's error", res, err)
	}
	if !slices.Equal(seen, ids[:4]) {
		t.Fatalf("hook saw %v, want %v", seen, ids[:4])
	}
	if _, err := d.Get(ctx, refuse); err != nil {
		t.Fatalf("the refused entry: %v, want it still dead", err)
	}
	refuse, seen = "", nil
	res, err = d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{BeforeMove: hook})
	if err != nil || !res.Resumed || res.Replayed != 2 || !slices.Equal(seen, ids[3:]) {
		t.Fatalf("resumed replay: %+v, %v, hook saw %v; want the last 2, the refused one first", res, err, seen)
	}
	assertOnce(t, b, 5, "j")
}

// A replayed tracked job gets its index record, declared in the move
// script's keys: at the name the script derives from the entry. Of a
// job_id given twice the last counts, as for the decoder: a last empty one
// means none, so the job keeps its first entry's ID (the dead letter's
// dead_entry_id), the ID its first run had.
func TestDLQ_ReplayTracked(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{})
	ctx := context.Background()
	keys, _ := stream.KeysFor(b.source)
	recs := []string{stream.JobKey(keys, "J1"), stream.JobKey(keys, "J9"), stream.JobKey(keys, "1700000000000-7")}
	t.Cleanup(func() { b.rdb.Del(context.Background(), recs...) })
	b.add(t, deadJob([]any{"type", "t", "job_id", "J1", "track", "1"}, "permanent", "no", time.Now(), 1))
	b.add(t, deadJob([]any{"type", "t", "job_id", "J9", "job_id", "", "track", "1"}, "permanent", "no", time.Now(), 1))
	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil || res.Replayed != 2 {
		t.Fatalf("Replay = %+v, %v; want 2 replayed", res, err)
	}
	for i, k := range recs {
		v, err := b.rdb.Get(ctx, k).Result()
		r, _ := stream.ParseRecord(v)
		if i != 1 && (err != nil || r.State != stream.StateWaiting) || i == 1 && err == nil {
			t.Errorf("record %s = %q, %v; want waiting for J1 and the dead entry ID, none for J9", k, v, err)
		}
	}
}
