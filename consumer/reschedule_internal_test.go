package consumer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// One retry script reschedules a batch; each job in it is owner-checked on
// its own: a stale worker can reschedule nothing in any batch, and the
// jobs it still owns in the same batch are rescheduled. Against real Redis.
func TestRetryScript_batchOwnerChecked(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	tag := "{" + redistest.Prefix(t, rdb) + "}"
	key, delayed := tag+"s", tag+"delayed"
	ids := make([]string, 4)
	for i := range ids {
		ids[i] = rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"type", "t"}}).Val()
	}
	if err := rdb.XGroupCreate(ctx, key, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	read := func(consumer string, n int64) {
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: consumer, Streams: []string{key, ">"}, Count: n, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	read("a", 3) // ids[0..2]
	read("b", 1) // ids[3]
	rdb.XAck(ctx, key, "g", ids[2])
	member := stream.EncodeDelayed(ids[0], []any{"type", "t", "attempt", "1"})
	args := []any{"g", "a", ids[0], ids[3],
		ids[0], 60000, member, 0, "", 0, // later: the delayed set
		ids[1], 0, "", 0, "", 4, "type", "t", "attempt", "1", // now: a new entry
		ids[2], 0, "", 0, "", 2, "type", "t", // no longer pending
		ids[3], 0, "", 0, "", 2, "type", "t", // b's
	}
	res, err := retryScript.Run(ctx, rdb, []string{key, delayed}, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 || res[0] != "" || res[2] != int64(-1) || res[3] != int64(-1) {
		t.Fatalf("retry.lua = %v; want \"\", a new ID, -1, -1", res)
	}
	newID, _ := res[1].(string)
	if got := rdb.XRange(ctx, key, newID, newID).Val(); len(got) != 1 || got[0].Values["attempt"] != "1" {
		t.Errorf("new entry %s = %v; want the retried job", newID, got)
	}
	if n := rdb.ZCard(ctx, delayed).Val(); n != 1 {
		t.Errorf("delayed set holds %d; want the one job", n)
	}
	p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: "g", Start: "-", End: "+", Count: 10}).Val()
	if len(p) != 1 || p[0].ID != ids[3] || p[0].Consumer != "b" {
		t.Errorf("pending %+v; want only b's entry, untouched", p)
	}
}

// scriptCounter counts the EVALSHA/EVAL calls of one script (its hash
// and its text).
type scriptCounter struct {
	sha, body string
	n         atomic.Int64
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && (args[0] == "evalsha" || args[0] == "eval") {
			if s, _ := args[1].(string); s == h.sha || s == h.body {
				h.n.Add(1)
			}
		}
		return next(ctx, cmd)
	}
}
func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Jobs that fail together are rescheduled together: fewer retry scripts
// than jobs, each job once.
func TestConsumer_retriesBatched(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	q := "{" + redistest.Prefix(t, rdb) + "}q"
	keys, _ := stream.KeysFor(q)
	const n = 200
	jobs := make([]*stream.Job, n)
	for i := range jobs {
		jobs[i] = &stream.Job{Type: "t", Payload: []byte("{}")}
	}
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: q}).EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	counter := &scriptCounter{sha: retryScript.Hash(), body: idsLua + retryLua}
	crdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	defer crdb.Close()
	crdb.AddHook(counter)
	var mu sync.Mutex
	runs := map[string]int{}
	c := New(crdb, Config{Stream: q, Group: "g", Concurrency: 50, Logger: slog.New(slog.DiscardHandler),
		Backoff: Backoff{Base: time.Nanosecond, Cap: time.Nanosecond}}).Handle(HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		runs[j.ID]++
		first := runs[j.ID] == 1
		mu.Unlock()
		if first {
			time.Sleep(5 * time.Millisecond) // finish together
			return errors.New("once")
		}
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for c.Stats().Acked < n {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, j := range jobs {
		if runs[j.ID] != 2 {
			t.Errorf("job %s ran %d times, want 2", j.ID, runs[j.ID])
		}
	}
	if st := c.Stats(); st.Retried != n {
		t.Errorf("stats %+v; want %d retried", st, n)
	}
	calls := counter.n.Load()
	t.Logf("%d jobs rescheduled by %d retry scripts", n, calls)
	if calls >= n {
		t.Errorf("%d retry scripts for %d jobs; want them batched", calls, n)
	}
	if rdb.ZCard(ctx, keys.Delayed).Val() != 0 {
		t.Error("jobs left in the delayed set")
	}
}

// Jobs dead-lettered together are dead-lettered by one script per batch:
// fewer dead-letter scripts than jobs, each job once, Config.OnDeadLetter
// called once per job with its own dead-letter entry, and the bound
// (Config.DeadLetterMaxLen) kept, every entry trimmed counted.
func TestConsumer_deadLettersBatched(t *testing.T) {
	t.Parallel()
	for _, hook := range []bool{false, true} {
		t.Run(map[bool]string{false: "no hook", true: "hook"}[hook], func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			ctx := context.Background()
			q := "{" + redistest.Prefix(t, rdb) + "}q"
			keys, _ := stream.KeysFor(q)
			const n, bound = 200, 50
			jobs := make([]*stream.Job, n)
			for i := range jobs {
				jobs[i] = &stream.Job{Type: "t", Payload: []byte("{}")}
			}
			if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: q}).EnqueueBatch(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			counter := &scriptCounter{sha: deadScript.Hash(), body: idsLua + deadLua}
			crdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
			defer crdb.Close()
			crdb.AddHook(counter)
			var mu sync.Mutex
			alerts := map[string]string{} // job ID -> dead entry ID
			cfg := Config{Stream: q, Group: "g", Concurrency: 50, Logger: slog.New(slog.DiscardHandler), DeadLetterMaxLen: bound}
			if hook {
				cfg.OnDeadLetter = func(_ context.Context, d DeadLetter) {
					mu.Lock()
					defer mu.Unlock()
					if _, ok := alerts[d.Job.ID]; ok || d.DeadEntryID == "" {
						t.Errorf("alert %+v: twice, or without its dead entry", d)
					}
					alerts[d.Job.ID] = d.DeadEntryID
				}
			}
			c := New(crdb, cfg).Handle(HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				time.Sleep(5 * time.Millisecond) // finish together
				return Permanent(errors.New("never"))
			}))
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			deadline := time.Now().Add(30 * time.Second)
			for c.Stats().DeadLettered < n {
				if time.Now().After(deadline) {
					t.Fatalf("stats %+v", c.Stats())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := c.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			<-done
			if st := c.Stats(); st.DeadLettered != n || st.DeadTrimmed != n-bound || st.Stale != 0 {
				t.Errorf("stats %+v; want %d dead-lettered, %d trimmed", st, n, n-bound)
			}
			dead := rdb.XRange(ctx, keys.Dead, "-", "+").Val()
			if len(dead) != bound {
				t.Errorf("dead-letter stream holds %d; want its bound %d", len(dead), bound)
			}
			seen := map[string]bool{}
			for _, e := range dead {
				id, _ := e.Values[stream.FieldJobID].(string)
				if seen[id] || e.Values["dead_reason"] != ReasonPermanent || e.Values["dead_consumer"] == "" {
					t.Errorf("dead letter %v: twice, or without its fields", e.Values)
				}
				seen[id] = true
				if hook && alerts[id] != e.ID {
					t.Errorf("job %s: alert for dead entry %q, dead entry %s", id, alerts[id], e.ID)
				}
			}
			if hook && len(alerts) != n {
				t.Errorf("%d alerts; want %d", len(alerts), n)
			}
			if p := rdb.XPending(ctx, q, "g").Val(); p.Count != 0 {
				t.Errorf("%d entries pending", p.Count)
			}
			calls := counter.n.Load()
			t.Logf("%d jobs dead-lettered by %d scripts", n, calls)
			if calls >= n {
				t.Errorf("%d dead-letter scripts for %d jobs; want them batched", calls, n)
			}
		})
	}
}

// The range the scripts' owner check reads is computed from entry IDs as
// numbers, in any order: "10-0" is above "9-5", and "9-10" above "9-5".
func TestIDRange(t *testing.T) {
	t.Parallel()
	batch := []*retryReq{{id: "9-10"}, {id: "10-0"}, {id: "9-5"}, {id: "9-9"}}
	if lo, hi := idRange(batch); lo != "9-5" || hi != "10-0" {
		t.Errorf("idRange = %s, %s; want 9-5, 10-0", lo, hi)
	}
	if lo, hi := idRange(batch[:1]); lo != "9-10" || hi != "9-10" {
		t.Errorf("idRange of one = %s, %s; want 9-10, 9-10", lo, hi)
	}
}

// retry.lua owner-checks over the range it is given: a job outside it reads
// as not owned and nothing is written for it (a wrong range cannot settle a
// job twice or lose it; it stays pending). Against real Redis.
func TestRetryScript_outsideRangeNotOwned(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	tag := "{" + redistest.Prefix(t, rdb) + "}"
	key, delayed := tag+"s", tag+"delayed"
	ids := make([]string, 3)
	for i := range ids {
		ids[i] = rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"type", "t"}}).Val()
	}
	if err := rdb.XGroupCreate(ctx, key, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "a", Streams: []string{key, ">"}, Count: 3, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	args := []any{"g", "a", ids[1], ids[2],
		ids[0], 0, "", 0, "", 2, "type", "t", // below the range
		ids[1], 0, "", 0, "", 2, "type", "t",
	}
	res, err := retryScript.Run(ctx, rdb, []string{key, delayed}, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0] != int64(-1) {
		t.Fatalf("retry.lua = %v; want -1, a new ID", res)
	}
	if id, _ := res[1].(string); id == "" {
		t.Fatalf("retry.lua = %v; want -1, a new ID", res)
	}
	p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: "g", Start: "-", End: "+", Count: 10}).Val()
	if len(p) != 2 || p[0].ID != ids[0] || p[1].ID != ids[2] {
		t.Errorf("pending %+v; want %s and %s", p, ids[0], ids[2])
	}
	if n := rdb.XLen(ctx, key).Val(); n != 4 {
		t.Errorf("stream holds %d entries; want the 3 and one new", n)
	}
}
