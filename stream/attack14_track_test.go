package stream_test

// Outside tests of tracked jobs (issue 14), written from docs/wire-format.md ("Tracked jobs", "Enqueue
// once"), the README ("Finding and cancelling a job") and the godoc of stream.JobKey,
// stream.ProducerConfig.Track, stream.Producer.EnqueueBatch and control.Lookup. The raw tests call the
// enqueue script as a non-Go producer would: EVAL of stream/enqueue.lua's text with the KEYS/ARGV the
// docs describe (KEYS: the stream, then markers and records in any order; ARGV: MAXLEN, window ms, the
// number of jobs, then per job its marker's index in KEYS, its job ID, the number of values, the fields).

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// a14Script is the text of the enqueue script, as a non-Go producer would load it.
func a14Script(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("enqueue.lua")
	if err != nil {
		t.Fatalf("read enqueue.lua: %v", err)
	}
	return string(b)
}

// a14Job is one job of a raw enqueue call.
type a14Job struct {
	marker int // index in KEYS (1-based) of its enqueue-once marker, 0 for none
	id     string
	fields []string
}

func a14Args(maxLen, windowMS int64, jobs []a14Job) []any {
	args := []any{maxLen, windowMS, len(jobs)}
	for _, j := range jobs {
		args = append(args, j.marker, j.id, len(j.fields))
		for _, f := range j.fields {
			args = append(args, f)
		}
	}
	return args
}

func a14Eval(ctx context.Context, rdb redis.UniversalClient, script string, keys []string, jobs []a14Job) ([]any, error) {
	v, err := rdb.Eval(ctx, script, keys, a14Args(0, 86400000, jobs)...).Result()
	if err != nil {
		return nil, err
	}
	s, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("reply %T %v is not an array", v, v)
	}
	// One [entry ID, job ID, duplicate] per job: flattened here.
	var flat []any
	for _, e := range s {
		triple, ok := e.([]any)
		if !ok || len(triple) != 3 {
			return nil, fmt.Errorf("reply %v: %v is not a triple", v, e)
		}
		flat = append(flat, triple...)
	}
	return flat, nil
}

func a14TrackedFields(id string) []string {
	return []string{"type", "t", "payload", "p-" + id, "job_id", id, "track", "1"}
}

func a14Stream(t *testing.T) (string, stream.Keys) {
	t.Helper()
	name := redistest.Name(t)
	k, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	return name, k
}

// a14Cleanup deletes every key of the queue when t ends.
func a14Cleanup(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Cleanup(func() {
		redistest.DeleteKeys(rdb, "{"+name+"}*")
		rdb.Del(context.Background(), name)
	})
}

// a14Nothing fails t unless the queue has no stream, no record and no marker.
func a14Nothing(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Helper()
	ctx := context.Background()
	if n, _ := rdb.Exists(ctx, name).Result(); n != 0 {
		xs, _ := rdb.XRange(ctx, name, "-", "+").Result()
		t.Errorf("a refused call added to the stream: %v", xs)
	}
	keys, _ := rdb.Keys(ctx, "{"+name+"}*").Result()
	if len(keys) != 0 {
		t.Errorf("a refused call wrote keys %v", keys)
	}
}

// a14CheckWaiting fails t unless Lookup says id is waiting in entry, and the entry is in the stream
// with that job ID.
func a14CheckWaiting(t *testing.T, rdb redis.UniversalClient, name, id, entry string) {
	t.Helper()
	ctx := context.Background()
	info, err := control.Lookup(ctx, rdb, name, id)
	if err != nil {
		t.Errorf("Lookup(%q): %v", id, err)
		return
	}
	if info.State != stream.StateWaiting || (entry != "" && info.EntryID != entry) {
		t.Errorf("Lookup(%q) = state %q entry %q, want waiting in %q", id, info.State, info.EntryID, entry)
		return
	}
	xs, err := rdb.XRange(ctx, name, info.EntryID, info.EntryID).Result()
	if err != nil || len(xs) != 1 {
		t.Errorf("record of %q names entry %s, not in the stream (%v, %v)", id, info.EntryID, xs, err)
		return
	}
	if got, _ := xs[0].Values["job_id"].(string); got != id && !(got == "" && id == info.EntryID) {
		t.Errorf("record of %q names entry %s of job %q", id, info.EntryID, got)
	}
}

// TestAttack14_rawEvalTracked: a tracked job added by the documented script call, with its record key
// in KEYS, is waiting in the entry the script replied with.
func TestAttack14_rawEvalTracked(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	script := a14Script(t)

	id := "raw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	rep, err := a14Eval(ctx, rdb, script, []string{name, stream.JobKey(k, id)},
		[]a14Job{{0, id, a14TrackedFields(id)}})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	if len(rep) != 3 || rep[1] != id || fmt.Sprint(rep[2]) != "0" {
		t.Fatalf("reply %v, want [entry %s 0]", rep, id)
	}
	a14CheckWaiting(t, rdb, name, id, rep[0].(string))
	// The raw record parses.
	v, err := rdb.Get(ctx, stream.JobKey(k, id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	r, err := stream.ParseRecord(v)
	if err != nil || r.State != stream.StateWaiting || r.Entry != rep[0] {
		t.Errorf("ParseRecord(%q) = %+v, %v", v, r, err)
	}
}

// TestAttack14_rawEvalRefused: the script refuses, writing nothing, a call in which a tracked job's
// record is missing: not declared at all, declared under another job's ID, in another queue's tag,
// in the unhashed form of a long ID; and a batch in which only the last job's record is missing
// writes none of the batch.
func TestAttack14_rawEvalRefused(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	script := a14Script(t)

	long := strings.Repeat("L", 200)
	cases := []struct {
		name string
		keys func(name string, k stream.Keys, id string) []string
		id   string
	}{
		{"missing", func(name string, k stream.Keys, id string) []string { return []string{name} }, "j1"},
		{"otherID", func(name string, k stream.Keys, id string) []string {
			return []string{name, stream.JobKey(k, id+"x")}
		}, "j1"},
		{"prefixOnly", func(name string, k stream.Keys, id string) []string { return []string{name, k.Job} }, "j1"},
		{"otherQueue", func(name string, k stream.Keys, id string) []string {
			ok, _ := stream.KeysFor(name + "-other")
			return []string{name, stream.JobKey(ok, id)}
		}, "j1"},
		{"noTag", func(name string, k stream.Keys, id string) []string {
			return []string{name, name + ":job:" + id}
		}, "j1"},
		{"longUnhashed", func(name string, k stream.Keys, id string) []string {
			return []string{name, k.Job + id}
		}, long},
		{"longWrongHash", func(name string, k stream.Keys, id string) []string {
			return []string{name, k.Job + "sha1:" + strings.Repeat("0", 40)}
		}, long},
		{"markerInstead", func(name string, k stream.Keys, id string) []string {
			return []string{name, k.Once + id}
		}, "j1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name, k := a14Stream(t)
			a14Cleanup(t, rdb, name)
			redistest.DeleteKeys(rdb, "{"+name+"-other}*")
			t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+name+"-other}*") })
			keys := c.keys(name, k, c.id)
			rep, err := a14Eval(ctx, rdb, script, keys, []a14Job{{0, c.id, a14TrackedFields(c.id)}})
			if err == nil {
				t.Errorf("KEYS %q: the script took a tracked job without its record: %v", keys, rep)
			}
			a14Nothing(t, rdb, name)
			if n, _ := rdb.Exists(ctx, keys[1:]...).Result(); len(keys) > 1 && n != 0 {
				t.Errorf("the refused call wrote a declared key %q", keys[1:])
			}
		})
	}

	t.Run("lastOfBatch", func(t *testing.T) {
		name, k := a14Stream(t)
		a14Cleanup(t, rdb, name)
		jobs := []a14Job{
			{0, "b1", a14TrackedFields("b1")},
			{0, "u1", []string{"type", "t", "payload", "plain"}},
			{2, "k1", []string{"type", "t", "job_id", "k1", "idempotency_key", "key1"}},
			{0, "b2", a14TrackedFields("b2")},
		}
		keys := []string{name, k.Once + "key1", stream.JobKey(k, "b1")} // b2's record missing
		rep, err := a14Eval(ctx, rdb, script, keys, jobs)
		if err == nil {
			t.Errorf("the script took a batch with job 4's record missing: %v", rep)
		}
		a14Nothing(t, rdb, name)
	})
}

// TestAttack14_rawEvalKeyOrder: records and markers in any order, a record declared twice, records of
// jobs not in the call: the script adds each job once, in ARGV order, each tracked job waiting in its
// own entry, each untracked one without a record.
func TestAttack14_rawEvalKeyOrder(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	script := a14Script(t)
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)

	jobs := []a14Job{
		{0, "t1", a14TrackedFields("t1")},
		{0, "u1", []string{"type", "t", "job_id", "u1"}},
		{6, "kt", append(a14TrackedFields("kt"), "idempotency_key", "K-kt")}, // keyed and tracked
		{3, "ku", []string{"type", "t", "job_id", "ku", "idempotency_key", "K-ku"}},
		{0, "t2", a14TrackedFields("t2")},
	}
	keys := []string{
		name,
		stream.JobKey(k, "t2"), // 2
		k.Once + "K-ku",        // 3
		stream.JobKey(k, "kt"), // 4
		stream.JobKey(k, "t1"), // 5
		k.Once + "K-kt",        // 6
		stream.JobKey(k, "t1"), // 7: declared twice
		stream.JobKey(k, "nobody"),
	}
	rep, err := a14Eval(ctx, rdb, script, keys, jobs)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	if len(rep) != 3*len(jobs) {
		t.Fatalf("reply %v: want %d values", rep, 3*len(jobs))
	}
	xs, err := rdb.XRange(ctx, name, "-", "+").Result()
	if err != nil || len(xs) != len(jobs) {
		t.Fatalf("stream holds %d entries (%v), want %d", len(xs), err, len(jobs))
	}
	for i, j := range jobs {
		entry, _ := rep[3*i].(string)
		if rep[3*i+1] != j.id || fmt.Sprint(rep[3*i+2]) != "0" {
			t.Errorf("job %d: reply %v", i, rep[3*i:3*i+3])
		}
		if xs[i].ID != entry || xs[i].Values["job_id"] != j.id {
			t.Errorf("job %d (%s): entry %d is %s %v, reply said %s", i, j.id, i, xs[i].ID, xs[i].Values, entry)
		}
		tracked := false
		for f := 0; f+1 < len(j.fields); f += 2 {
			tracked = tracked || (j.fields[f] == "track" && j.fields[f+1] == "1")
		}
		if tracked {
			a14CheckWaiting(t, rdb, name, j.id, entry)
		} else if n, _ := rdb.Exists(ctx, stream.JobKey(k, j.id)).Result(); n != 0 {
			t.Errorf("untracked job %s has a record", j.id)
		}
	}
	if n, _ := rdb.Exists(ctx, stream.JobKey(k, "nobody")).Result(); n != 0 {
		t.Errorf("a declared record of no job in the call was written")
	}
	for _, m := range []string{k.Once + "K-ku", k.Once + "K-kt"} {
		if n, _ := rdb.Exists(ctx, m).Result(); n != 1 {
			t.Errorf("marker %s not set", m)
		}
	}
}

// TestAttack14_rawEvalLongID: a tracked job with an ID over 128 bytes is declared by its hashed name
// (JobKey: "sha1:" + hex SHA-1 of the ID, computed here from the doc's words, not from JobKey), and
// Lookup finds it by its ID.
func TestAttack14_rawEvalLongID(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	id := strings.Repeat("é", 80) // 160 bytes
	sum := sha1.Sum([]byte(id))
	key := "{" + name + "}:job:sha1:" + hex.EncodeToString(sum[:])
	if got := stream.JobKey(k, id); got != key {
		t.Fatalf("JobKey = %q, the docs say %q", got, key)
	}
	edge := strings.Repeat("e", 128) // exactly 128 bytes: not hashed
	if got := stream.JobKey(k, edge); got != "{"+name+"}:job:"+edge {
		t.Errorf("JobKey of a 128-byte ID = %q, want it unhashed", got)
	}
	rep, err := a14Eval(ctx, rdb, a14Script(t), []string{name, key, stream.JobKey(k, edge)},
		[]a14Job{{0, id, a14TrackedFields(id)}, {0, edge, a14TrackedFields(edge)}})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	a14CheckWaiting(t, rdb, name, id, rep[0].(string))
	a14CheckWaiting(t, rdb, name, edge, rep[3].(string))
}

// a14Run runs a consumer of name with h until t ends; it returns the consumer.
func a14Run(t *testing.T, rdb redis.UniversalClient, name string, h consumer.HandlerFunc) *consumer.Consumer {
	t.Helper()
	c := consumer.New(rdb, consumer.Config{
		Stream:          name,
		Group:           "g",
		Consumer:        "c1",
		Block:           50 * time.Millisecond,
		PromoteInterval: 50 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	}).Handle(h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return c
}

func a14WaitState(t *testing.T, rdb redis.UniversalClient, name, id, state string) control.JobInfo {
	t.Helper()
	var info control.JobInfo
	poll.Until(t, 60*time.Second, func() (bool, string) {
		var err error
		info, err = control.Lookup(context.Background(), rdb, name, id)
		return err == nil && info.State == state, fmt.Sprintf("Lookup(%s) = %+v, %v; want %s", id, info, err, state)
	})
	return info
}

// TestAttack14_onceDuplicateKeepsRecord: with enqueue once, a duplicate "adds nothing". A producer's
// retry of a tracked keyed job (same key, same ID) after the job finished must not make its record
// say waiting again (an active record has no TTL: it would lie forever), and a duplicate under
// another job ID must not get a record that says waiting.
func TestAttack14_onceDuplicateKeepsRecord(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true, EnqueueOnce: time.Hour})

	job := &stream.Job{ID: "first", Type: "t", Payload: []byte(`{}`), IdempotencyKey: "op-1"}
	entry, err := p.Enqueue(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	a14CheckWaiting(t, rdb, name, "first", entry)

	// A duplicate while it waits: same entry, still waiting.
	again := &stream.Job{ID: "first", Type: "t", Payload: []byte(`{}`), IdempotencyKey: "op-1"}
	if e2, err := p.Enqueue(ctx, again); err != nil || e2 != entry {
		t.Fatalf("duplicate Enqueue = %q, %v; want %q", e2, err, entry)
	}
	a14CheckWaiting(t, rdb, name, "first", entry)

	c := a14Run(t, rdb, name, func(ctx context.Context, j *stream.Job) error {
		return consumer.SetResult(ctx, []byte("ok-"+j.ID))
	})
	done := a14WaitState(t, rdb, name, "first", stream.StateDone)
	_ = c

	// The producer retries (a lost reply): the same job, the same key.
	for _, id := range []string{"first", "second"} {
		j := &stream.Job{ID: id, Type: "t", Payload: []byte(`{}`), IdempotencyKey: "op-1"}
		if e, err := p.Enqueue(ctx, j); err != nil || e != entry || j.ID != "first" {
			t.Errorf("duplicate Enqueue(%s) = %q, %v, job.ID %q; want %q, first", id, e, err, j.ID, entry)
		}
		// The same through a batch.
		j = &stream.Job{ID: id, Type: "t", Payload: []byte(`{}`), IdempotencyKey: "op-1"}
		if es, err := p.EnqueueBatch(ctx, []*stream.Job{j}); err != nil || es[0] != entry {
			t.Errorf("duplicate EnqueueBatch(%s) = %q, %v; want %q", id, es, err, entry)
		}
	}
	info, err := control.Lookup(ctx, rdb, name, "first")
	if err != nil || info.State != stream.StateDone || string(info.Result) != "ok-first" || !info.At.Equal(done.At) {
		t.Errorf("after duplicates, Lookup(first) = %+v, %v; want done as before (%+v)", info, err, done)
	}
	if ttl, _ := rdb.PTTL(ctx, stream.JobKey(k, "first")).Result(); ttl <= 0 {
		t.Errorf("the done record lost its time to live: PTTL %v", ttl)
	}
	info, err = control.Lookup(ctx, rdb, name, "second")
	if err != nil || info.State == stream.StateWaiting {
		t.Errorf("Lookup(second), a duplicate that added nothing, = %+v, %v", info, err)
	}
	// The consumer deletes settled entries (KeepSettled false): count what was ever added.
	if xi, err := rdb.XInfoStream(ctx, name).Result(); err != nil || xi.EntriesAdded != 1 {
		t.Errorf("stream had %+v entries added (%v), want 1", xi, err)
	}
}

// a14Mixed builds n jobs cycling through: untracked plain, tracked, keyed untracked, keyed tracked,
// tracked; every 7th keyed job repeats an earlier key (a duplicate within the batch).
func a14Mixed(prefix string, n int) []*stream.Job {
	jobs := make([]*stream.Job, n)
	for i := range jobs {
		j := &stream.Job{ID: fmt.Sprintf("%s-%04d", prefix, i), Type: "t", Payload: []byte(strconv.Itoa(i))}
		switch i % 5 {
		case 1, 4:
			j.Track = true
		case 2:
			j.IdempotencyKey = fmt.Sprintf("%s-key-%d", prefix, i)
		case 3:
			j.IdempotencyKey = fmt.Sprintf("%s-key-%d", prefix, i)
			j.Track = true
		}
		if j.IdempotencyKey != "" && i%7 == 0 && i >= 10 {
			j.IdempotencyKey = fmt.Sprintf("%s-key-%d", prefix, i-5) // same residue: earlier job's key
		}
		jobs[i] = j
	}
	return jobs
}

// a14CheckBatch checks a mixed batch's outcome: each job not a duplicate is in the stream once, with
// the returned entry ID; a duplicate got the first job's entry ID; each tracked job added is waiting in
// its entry; untracked and duplicate jobs have no record; inOrder also checks the stream's order.
func a14CheckBatch(t *testing.T, rdb redis.UniversalClient, name string, k stream.Keys, jobs []*stream.Job, ids []string, inOrder bool) {
	t.Helper()
	ctx := context.Background()
	xs, err := rdb.XRange(ctx, name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byEntry := map[string]redis.XMessage{}
	for _, x := range xs {
		byEntry[x.ID] = x
	}
	firstOfKey := map[string]int{}
	var added []string
	for i, j := range jobs {
		if f, ok := firstOfKey[j.IdempotencyKey]; ok && j.IdempotencyKey != "" {
			if ids[i] != ids[f] {
				t.Errorf("job %d, duplicate of %d: entry %q, want %q", i, f, ids[i], ids[f])
			}
			if n, _ := rdb.Exists(ctx, stream.JobKey(k, fmt.Sprintf("%s", jobs[i].ID))).Result(); n != 0 && jobs[i].ID != jobs[f].ID {
				v, _ := rdb.Get(ctx, stream.JobKey(k, jobs[i].ID)).Result()
				t.Errorf("job %d, a duplicate that added nothing, has a record %q", i, v)
			}
			continue
		}
		if j.IdempotencyKey != "" {
			firstOfKey[j.IdempotencyKey] = i
		}
		added = append(added, ids[i])
		x, ok := byEntry[ids[i]]
		if !ok {
			t.Errorf("job %d (%s): entry %q not in the stream", i, j.ID, ids[i])
			continue
		}
		if x.Values["job_id"] != j.ID {
			t.Errorf("job %d (%s): entry %s holds job %v", i, j.ID, ids[i], x.Values["job_id"])
		}
		if j.Track {
			a14CheckWaiting(t, rdb, name, j.ID, ids[i])
		} else if n, _ := rdb.Exists(ctx, stream.JobKey(k, j.ID)).Result(); n != 0 {
			t.Errorf("untracked job %d (%s) has a record", i, j.ID)
		}
	}
	if len(xs) != len(added) {
		t.Errorf("stream holds %d entries, %d jobs were added", len(xs), len(added))
	}
	if inOrder {
		for i := range added {
			if i < len(xs) && xs[i].ID != added[i] {
				t.Errorf("stream order: entry %d is %s (%v), the batch's job there got %s", i, xs[i].ID, xs[i].Values["job_id"], added[i])
				break
			}
		}
	}
}

// TestAttack14_mixedBatchOrder: a batch of 257 jobs, tracked, untracked and keyed interleaved (several
// scripts of at most OnceBatch pipelined beside the XADDs), keeps the batch's order in the stream, and
// each tracked job added is waiting in the entry EnqueueBatch returned.
func TestAttack14_mixedBatchOrder(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
	jobs := a14Mixed("m", 257)
	ids, err := p.EnqueueBatch(ctx, jobs)
	if err != nil {
		t.Fatalf("EnqueueBatch: %v", err)
	}
	a14CheckBatch(t, rdb, name, k, jobs, ids, true)

	// 150 tracked jobs in a row (more than one script), then 150 untracked.
	var run []*stream.Job
	for i := 0; i < 300; i++ {
		run = append(run, &stream.Job{ID: fmt.Sprintf("r-%04d", i), Type: "t", Track: i < 150})
	}
	name2, k2 := a14Stream(t)
	a14Cleanup(t, rdb, name2)
	p2 := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name2})
	ids, err = p2.EnqueueBatch(ctx, run)
	if err != nil {
		t.Fatalf("EnqueueBatch: %v", err)
	}
	a14CheckBatch(t, rdb, name2, k2, run, ids, true)
}

// TestAttack14_batchAfterScriptFlush: a mixed batch after SCRIPT FLUSH (the NOSCRIPT path) adds every
// job once and every tracked job's record says waiting in its entry (the order may change: documented).
func TestAttack14_batchAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = 30 * time.Second })
	ctx := context.Background()
	name, k := a14Stream(t)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
	warm := a14Mixed("w", 20)
	if _, err := p.EnqueueBatch(ctx, warm); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, name)
	redistest.DeleteKeys(rdb, "{"+name+"}*")

	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	jobs := a14Mixed("f", 233)
	ids, err := p.EnqueueBatch(ctx, jobs)
	if err != nil {
		t.Fatalf("EnqueueBatch after SCRIPT FLUSH: %v", err)
	}
	a14CheckBatch(t, rdb, name, k, jobs, ids, false)

	// A single tracked Enqueue after another flush.
	rdb.ScriptFlush(ctx)
	one := &stream.Job{ID: "solo", Type: "t", Track: true}
	e, err := p.Enqueue(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	a14CheckWaiting(t, rdb, name, "solo", e)
}

// TestAttack14_rawEvalRecordFollowsJob: whatever a raw call the script takes, the record it writes
// must be the one the consumer later rewrites, or it lies (an active record has no time to live).
// Hostile calls: a tracked job without a job_id field (its ID is then its entry ID, the wire format
// says) named by another ID in ARGV; and duplicate "track" fields whose last value (the one the
// decoder sees) is 0, so the consumer does not track the job.
func TestAttack14_rawEvalRecordFollowsJob(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	script := a14Script(t)

	cases := []struct {
		name   string
		id     string
		fields []string
		found  string // what this case found before the fix
	}{
		{"noJobIDField", "X", []string{"type", "t", "payload", "x", "track", "1"},
			"was: enqueue.lua takes a tracked job without a job_id field (its ID is then its entry ID) and writes a waiting record under the ARGV job ID that nothing ever rewrites or expires"},
		{"trackThenUntrack", "Y", []string{"type", "t", "job_id", "Y", "track", "1", "track", "0"},
			"was: enqueue.lua treats fields \"track 1 track 0\" as tracked (requires and writes a waiting record) while the decoder sees the last value, untracked: the record is never rewritten nor expires"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name, k := a14Stream(t)
			a14Cleanup(t, rdb, name)
			rep, err := a14Eval(ctx, rdb, script, []string{name, stream.JobKey(k, c.id)}, []a14Job{{0, c.id, c.fields}})
			if err != nil {
				t.Logf("refused (fine, nothing may be written): %v", err)
				a14Nothing(t, rdb, name)
				return
			}
			entry := rep[0].(string)
			xs, _ := rdb.XRange(ctx, name, entry, entry).Result()
			job, derr := stream.Decode(xs[0].ID, xs[0].Values)
			if derr != nil {
				t.Fatalf("Decode: %v", derr)
			}
			t.Logf("taken: entry %s, decoded job ID %q, Track %v", entry, job.ID, job.Track)
			cons := a14Run(t, rdb, name, func(ctx context.Context, j *stream.Job) error { return nil })
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := cons.WaitIdle(wctx); err != nil {
				t.Fatal(err)
			}
			poll.Until(t, time.Minute, func() (bool, string) {
				p, err := rdb.XPending(ctx, name, "g").Result()
				return err == nil && p.Count == 0, fmt.Sprintf("pending %+v %v", p, err)
			})
			info, err := control.Lookup(ctx, rdb, name, c.id)
			if err != nil {
				t.Fatal(err)
			}
			v, gerr := rdb.Get(ctx, stream.JobKey(k, c.id)).Result()
			ttl := rdb.PTTL(ctx, stream.JobKey(k, c.id)).Val()
			t.Logf("after the run: Lookup(%q) = %s; record %q (%v), PTTL %v", c.id, info.State, v, gerr, ttl)
			if r, perr := stream.ParseRecord(v); gerr == nil && perr == nil && r.State == stream.StateWaiting {
				t.Errorf("job %s ran and was acknowledged, but the record the script wrote for %q still says waiting, with no time to live (a key that lives forever)", entry, c.id)
			}
			if job.Track {
				if info, err := control.Lookup(ctx, rdb, name, job.ID); err != nil || info.State != stream.StateDone {
					t.Errorf("Lookup(%q), the decoded ID, = %+v, %v; want done", job.ID, info, err)
				}
			}
		})
	}
}

// a14Consistent checks that nothing half-written lies: for every job of jobs, at most one entry; a
// tracked job has a record if and only if it has an entry, and the record names that entry; an
// untracked job has no record; a keyed job's marker exists if and only if its entry does, and names
// it. A job whose EnqueueBatch ID is not empty is in the stream.
func a14Consistent(t *testing.T, rdb redis.UniversalClient, name string, k stream.Keys, jobs []*stream.Job, ids []string) (added int) {
	t.Helper()
	ctx := context.Background()
	xs, err := rdb.XRange(ctx, name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string][]string{}
	for _, x := range xs {
		id, _ := x.Values["job_id"].(string)
		entries[id] = append(entries[id], x.ID)
	}
	for i, j := range jobs {
		es := entries[j.ID]
		if len(es) > 1 {
			t.Errorf("job %s is in the stream %d times: %v", j.ID, len(es), es)
		}
		if ids[i] != "" && len(es) == 0 {
			t.Errorf("job %s: EnqueueBatch returned entry %s, not in the stream", j.ID, ids[i])
		}
		if len(es) > 0 {
			added++
		}
		v, gerr := rdb.Get(ctx, stream.JobKey(k, j.ID)).Result()
		switch {
		case j.Track && len(es) > 0:
			r, perr := stream.ParseRecord(v)
			if gerr != nil || perr != nil || r.State != stream.StateWaiting || r.Entry != es[0] {
				t.Errorf("tracked job %s is in entry %s, its record is %q (%v, %v)", j.ID, es[0], v, gerr, perr)
			}
		case j.Track:
			if gerr == nil {
				t.Errorf("tracked job %s is not in the stream, but has a record %q", j.ID, v)
			}
		default:
			if gerr == nil {
				t.Errorf("untracked job %s has a record %q", j.ID, v)
			}
		}
		if j.IdempotencyKey != "" {
			m, merr := rdb.Get(ctx, k.Once+j.IdempotencyKey).Result()
			switch {
			case len(es) > 0 && (merr != nil || m != es[0]+" "+j.ID):
				t.Errorf("keyed job %s is in entry %s, its marker is %q (%v)", j.ID, es[0], m, merr)
			case len(es) == 0 && merr == nil:
				t.Errorf("keyed job %s is not in the stream, but its marker says %q", j.ID, m)
			}
		}
	}
	return added
}

// TestAttack14_redisFullMidBatch: Redis at maxmemory with noeviction refuses writes part way through a
// stream of mixed batches (tracked, untracked, keyed). Whatever got in, nothing half-written lies: no
// record without its entry or the reverse, no marker without its entry, nothing twice.
func TestAttack14_redisFullMidBatch(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = 30 * time.Second })
	ctx := context.Background()
	name, k := a14Stream(t)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})

	payload := []byte(strings.Repeat("x", 3000))
	var all []*stream.Job
	var allIDs []string
	failedBatches, oom := 0, 0
	for b := 0; b < 400 && failedBatches < 3; b++ {
		jobs := a14Mixed(fmt.Sprintf("b%03d", b), 40)
		for i, j := range jobs {
			j.Payload = payload
			if j.IdempotencyKey != "" && i%7 == 0 && i >= 10 {
				j.IdempotencyKey = fmt.Sprintf("b%03d-uniq-%d", b, i) // no duplicates here: each job stands alone
			}
		}
		ids, err := p.EnqueueBatch(ctx, jobs)
		if err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatalf("batch %d: %v", b, err)
			}
			oom++
			got := 0
			for _, id := range ids {
				if id != "" {
					got++
				}
			}
			if got == 0 {
				failedBatches++
			}
		}
		all = append(all, jobs...)
		allIDs = append(allIDs, ids...)
	}
	if oom == 0 {
		t.Fatalf("Redis never refused a write: the test did not fill it")
	}
	added := a14Consistent(t, rdb, name, k, all, allIDs)
	t.Logf("%d jobs sent, %d added, %d batches with OOM errors", len(all), added, oom)

	// Room again: the jobs that were refused are sent again (same IDs, same keys) and get in once.
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	var retry []*stream.Job
	for i, j := range all {
		if allIDs[i] == "" {
			retry = append(retry, j)
		}
	}
	for start := 0; start < len(retry); start += 40 {
		end := min(start+40, len(retry))
		ids, err := p.EnqueueBatch(ctx, retry[start:end])
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		for i, id := range ids {
			for x, j := range all {
				if j == retry[start+i] {
					allIDs[x] = id
				}
			}
		}
	}
	if added := a14Consistent(t, rdb, name, k, all, allIDs); added != len(all) {
		t.Errorf("after the retries %d of %d jobs are in the stream", added, len(all))
	}
}

// a14Member writes a delayed-set member as docs/wire-format.md ("The delayed set") describes it.
func a14Member(key string, fields ...string) string {
	var b strings.Builder
	b.WriteString(strings.NewReplacer("%", "%25", "|", "%7C").Replace(key))
	b.WriteString("|")
	for _, f := range fields {
		fmt.Fprintf(&b, "%d:%s", len(f), f)
	}
	return b.String()
}

// TestAttack14_promoteManyTracked: 350 tracked jobs due at once (EnqueueIn), mixed with untracked ones
// and with tracked jobs a non-Go producer scheduled with a plain ZADD (no record yet), are promoted by
// PromoteDue: each is in the stream once and each tracked job's record says waiting in its entry.
func TestAttack14_promoteManyTracked(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})

	var jobs []*stream.Job
	for i := 0; i < 500; i++ {
		j := &stream.Job{ID: fmt.Sprintf("d-%04d", i), Type: "t", Payload: []byte(strconv.Itoa(i)), Track: i%10 < 7}
		if err := p.EnqueueIn(ctx, j, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	for _, j := range jobs[:5] {
		if j.Track {
			info, err := control.Lookup(ctx, rdb, name, j.ID)
			if err != nil || info.State != stream.StateScheduled || info.Due.IsZero() {
				t.Errorf("Lookup(%s) before promotion = %+v, %v; want scheduled", j.ID, info, err)
			}
		}
	}
	// A non-Go producer's tracked jobs, due already.
	for i := 0; i < 60; i++ {
		id := fmt.Sprintf("z-%04d", i)
		m := a14Member(id, "v", "1", "type", "t", "payload", "{}", "job_id", id, "track", "1")
		if err := rdb.ZAdd(ctx, k.Delayed, redis.Z{Score: 1, Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, &stream.Job{ID: id, Track: true})
	}

	moved := 0
	poll.Until(t, time.Minute, func() (bool, string) {
		n, err := stream.PromoteDue(ctx, rdb, name, 1000)
		moved += n
		left, _ := rdb.ZCard(ctx, k.Delayed).Result()
		return err == nil && left == 0, fmt.Sprintf("moved %d, %d left in the delayed set, err %v", moved, left, err)
	})
	if moved != len(jobs) {
		t.Errorf("PromoteDue moved %d, want %d", moved, len(jobs))
	}
	ids := make([]string, len(jobs))
	xs, _ := rdb.XRange(ctx, name, "-", "+").Result()
	for _, x := range xs {
		for i, j := range jobs {
			if x.Values["job_id"] == j.ID {
				ids[i] = x.ID
			}
		}
	}
	if added := a14Consistent(t, rdb, name, k, jobs, ids); added != len(jobs) {
		t.Errorf("%d of %d jobs in the stream", added, len(jobs))
	}
}

// TestAttack14_consumerPromotesTracked: the same through running consumers (two, promoting the same
// set): tracked jobs due at once end done, each run once.
func TestAttack14_consumerPromotesTracked(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, _ := a14Stream(t)
	a14Cleanup(t, rdb, name)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	runs := make(chan string, 1000)
	h := func(ctx context.Context, j *stream.Job) error { runs <- j.ID; return nil }
	var ids []string
	for i := 0; i < 300; i++ {
		j := &stream.Job{ID: fmt.Sprintf("c-%04d", i), Type: "t"}
		if err := p.EnqueueIn(ctx, j, 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	a14Run(t, rdb, name, h)
	c2 := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c2", Block: 50 * time.Millisecond,
		PromoteInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handle(consumer.HandlerFunc(h))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c2.Run(cctx) }()
	defer func() { cancel(); <-done }()
	for _, id := range ids {
		a14WaitState(t, rdb, name, id, stream.StateDone)
	}
	seen := map[string]int{}
	for len(runs) > 0 {
		seen[<-runs]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("job %s ran %d times", id, seen[id])
		}
	}
}

// TestAttack14_replayTrackedDead: a tracked job dead-lettered says dead; replayed, its record follows
// (waiting in the new entry), and after a successful run it says done.
func TestAttack14_replayTrackedDead(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	var ids []string
	for i := 0; i < 120; i++ {
		j := &stream.Job{ID: fmt.Sprintf("dead-%04d", i), Type: "t", Payload: []byte(`{}`)}
		ids = append(ids, j.ID)
	}
	jobs := make([]*stream.Job, len(ids))
	for i, id := range ids {
		jobs[i] = &stream.Job{ID: id, Type: "t", Payload: []byte(`{}`)}
	}
	if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	// An untracked job dies beside them, and a tracked one a non-Go producer added by XADD (no record).
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: name, Values: []string{"type", "t", "job_id", "plain"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: name, Values: []string{"type", "t", "job_id", "xadd", "track", "1"}}).Err(); err != nil {
		t.Fatal(err)
	}

	var replayed = make(chan struct{})
	h := func(ctx context.Context, j *stream.Job) error {
		select {
		case <-replayed:
			return consumer.SetResult(ctx, []byte("second life"))
		default:
			return consumer.Permanent(errors.New("boom"))
		}
	}
	a14Run(t, rdb, name, h)
	for _, id := range ids {
		info := a14WaitState(t, rdb, name, id, stream.StateDead)
		if !strings.Contains(info.Error, "boom") || info.At.IsZero() {
			t.Errorf("dead %s: %+v", id, info)
		}
	}
	poll.Until(t, time.Minute, func() (bool, string) {
		n, err := rdb.XLen(ctx, k.Dead).Result()
		return err == nil && n == int64(len(ids)+2), fmt.Sprintf("%d dead-letter entries (%v), want %d", n, err, len(ids)+2)
	})
	if info, _ := control.Lookup(ctx, rdb, name, "xadd"); info.State != control.StateUnknown {
		t.Logf("a tracked job added by plain XADD, dead: Lookup = %s", info.State)
	}

	// Replay while nothing consumes (the handler switches first: a run after this succeeds).
	close(replayed)
	d, err := dlq.New(rdb, name, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil || res.Replayed != len(ids)+2 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	for _, id := range append(ids, "xadd") {
		info := a14WaitState(t, rdb, name, id, stream.StateDone)
		if string(info.Result) != "second life" {
			t.Errorf("replayed %s: done with result %q", id, info.Result)
		}
	}
	if n, _ := rdb.Exists(ctx, stream.JobKey(k, "plain")).Result(); n != 0 {
		t.Errorf("untracked replayed job has a record")
	}
}

// TestAttack14_promoteDuplicateTrackField: a non-Go producer's delayed member with fields "track 1
// track 0" (the decoder sees the last: untracked) is promoted; once it ran and was acknowledged, no
// record may still say waiting. A member without job_id (its ID is then its entry ID) is checked beside
// it: its record, if any, must end done.
func TestAttack14_promoteDuplicateTrackField(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	for _, m := range []string{
		a14Member("zk", "type", "t", "payload", "{}", "track", "1"),
		a14Member("zk2", "type", "t", "payload", "{}", "job_id", "zk2", "track", "1", "track", "0"),
	} {
		if err := rdb.ZAdd(ctx, k.Delayed, redis.Z{Score: 1, Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cons := a14Run(t, rdb, name, func(ctx context.Context, j *stream.Job) error { return nil })
	poll.Until(t, time.Minute, func() (bool, string) {
		xi, err := rdb.XInfoStream(ctx, name).Result()
		return err == nil && xi.EntriesAdded == 2, fmt.Sprintf("stream %+v, %v", xi, err)
	})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := cons.WaitIdle(wctx); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, time.Minute, func() (bool, string) {
		p, err := rdb.XPending(ctx, name, "g").Result()
		return err == nil && p.Count == 0, fmt.Sprintf("pending %+v %v", p, err)
	})
	keys, _ := rdb.Keys(ctx, k.Job+"*").Result()
	for _, key := range keys {
		v := rdb.Get(ctx, key).Val()
		if r, err := stream.ParseRecord(v); err == nil && r.State == stream.StateWaiting {
			t.Errorf("after every job ran and was acknowledged, record %s = %q (PTTL %v) still says waiting", key, v, rdb.PTTL(ctx, key).Val())
		}
	}
}

// TestAttack14_racingOnceProducers: eight producers enqueue the same keys at once, each job tracked
// under its own ID: each key's job is added once, only that job has a record (waiting in its entry),
// and each loser got the winner's entry ID.
func TestAttack14_racingOnceProducers(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	const producers, keys = 8, 120
	type result struct {
		jobs []*stream.Job
		ids  []string
		err  error
	}
	out := make(chan result, producers)
	for p := 0; p < producers; p++ {
		go func() {
			pr := stream.NewProducer(redistest.Shared(t), stream.ProducerConfig{Stream: name, Track: true, EnqueueOnce: time.Hour})
			var jobs []*stream.Job
			for i := 0; i < keys; i++ {
				jobs = append(jobs, &stream.Job{ID: fmt.Sprintf("p%d-%d", p, i), Type: "t", IdempotencyKey: fmt.Sprintf("key-%d", i)})
			}
			ids, err := pr.EnqueueBatch(ctx, jobs)
			out <- result{jobs, ids, err}
		}()
	}
	entryOfKey := map[int]string{}
	var all []result
	for p := 0; p < producers; p++ {
		r := <-out
		if r.err != nil {
			t.Fatalf("EnqueueBatch: %v", r.err)
		}
		all = append(all, r)
		for i, id := range r.ids {
			if e, ok := entryOfKey[i]; ok && e != id {
				t.Errorf("key %d: entries %s and %s", i, e, id)
			}
			entryOfKey[i] = id
		}
	}
	if n, _ := rdb.XLen(ctx, name).Result(); n != keys {
		t.Errorf("stream holds %d entries, want %d", n, keys)
	}
	xs, _ := rdb.XRange(ctx, name, "-", "+").Result()
	winner := map[string]string{}
	for _, x := range xs {
		winner[x.ID], _ = x.Values["job_id"].(string)
	}
	for _, r := range all {
		for i, j := range r.jobs {
			if winner[r.ids[i]] == j.ID {
				a14CheckWaiting(t, rdb, name, j.ID, r.ids[i])
			} else if v, err := rdb.Get(ctx, stream.JobKey(k, j.ID)).Result(); err == nil {
				t.Errorf("job %s lost the race for key %d (to %s) but has a record %q", j.ID, i, winner[r.ids[i]], v)
			}
		}
	}
}

// TestAttack14_retryRecordFollows: a tracked job whose first attempt fails says retrying (due, error),
// is promoted by the consumer, and ends done; raw EVALSHA of the script works as EVAL does.
func TestAttack14_retryRecordFollows(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name, k := a14Stream(t)
	a14Cleanup(t, rdb, name)
	script := a14Script(t)
	sha, err := rdb.ScriptLoad(ctx, script).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 30; i++ {
		id := fmt.Sprintf("rt-%d", i)
		args := append([]any{"EVALSHA", sha, 2, name, stream.JobKey(k, id)}, a14Args(0, 86400000, []a14Job{{0, id, a14TrackedFields(id)}})...)
		if err := rdb.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("EVALSHA: %v", err)
		}
		ids = append(ids, id)
	}
	a14Run(t, rdb, name, func(ctx context.Context, j *stream.Job) error {
		if j.Attempt == 0 {
			return consumer.Retry(time.Hour, errors.New("first try fails"))
		}
		return nil
	})
	for _, id := range ids {
		info := a14WaitState(t, rdb, name, id, stream.StateRetrying)
		if info.Due.IsZero() || !strings.Contains(info.Error, "first try fails") {
			t.Errorf("retrying %s: %+v", id, info)
		}
	}
	// Bring the retries due now: the delayed set is a sorted set by due time (docs).
	ms, _ := rdb.ZRange(ctx, k.Delayed, 0, -1).Result()
	if len(ms) != len(ids) {
		t.Fatalf("%d delayed members, want %d", len(ms), len(ids))
	}
	for _, m := range ms {
		rdb.ZAdd(ctx, k.Delayed, redis.Z{Score: 1, Member: m})
	}
	for _, id := range ids {
		a14WaitState(t, rdb, name, id, stream.StateDone)
	}
}
