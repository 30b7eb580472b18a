package integration

// Outside tests of tracked jobs (issue 14) with real processes: a non-Go producer calling the enqueue
// script with redis-cli --eval (docs/wire-format.md, "Tracked jobs" and "Enqueue once"), read back
// with the pelican command; and a Go producer SIGKILLed mid-batch while SCRIPT FLUSH forces the NOSCRIPT
// path, after which nothing half-written may lie.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func a14trExit(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestAttack14Track_redisCliEval: the documented redis-cli call, with a tracked job's record in KEYS,
// adds the job and `pelican job` says waiting in that entry; the same call without the record is
// refused (redis-cli -e exits non-zero), writes nothing, and `pelican job` exits 4 (unknown).
func TestAttack14Track_redisCliEval(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("no redis-cli")
	}
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name := redistest.Name(t)
	k, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), name); redistest.DeleteKeys(rdb, "{"+name+"}*") })
	host, port, _ := strings.Cut(redistest.Addr(), ":")
	cli := pelicanCLI(t)
	url := "redis://" + redistest.Addr() + "/0"

	eval := func(keys []string, argv ...string) (string, error) {
		args := []string{"-e", "-h", host, "-p", port, "--eval", "../stream/enqueue.lua"}
		args = append(append(append(args, keys...), ","), argv...)
		out, err := exec.Command("redis-cli", args...).CombinedOutput()
		return string(out), err
	}
	job := func(id string) (string, int) {
		out, err := exec.Command(cli, "--redis", url, "job", name, id, "-o", "json").CombinedOutput()
		return string(out), a14trExit(err)
	}

	// Refused: the record missing, then the record of another queue.
	for _, keys := range [][]string{{name}, {name, "{" + name + "x}:job:r1"}} {
		out, err := eval(keys, "0", "86400000", "1", "0", "r1", "8", "type", "t", "payload", "{}", "job_id", "r1", "track", "1")
		if err == nil {
			t.Errorf("KEYS %q: redis-cli exited 0: %s", keys, out)
		}
		if n, _ := rdb.Exists(ctx, name, stream.JobKey(k, "r1"), "{"+name+"x}:job:r1").Result(); n != 0 {
			t.Errorf("KEYS %q: a refused call wrote %d keys", keys, n)
		}
		if out, code := job("r1"); code != 4 {
			t.Errorf("pelican job after a refused call: exit %d, %s", code, out)
		}
	}
	rdb.Del(ctx, "{"+name+"x}:job:r1")

	// Taken: a tracked, keyed job (marker at index 3, record at index 2).
	out, err := eval([]string{name, stream.JobKey(k, "r1"), k.Once + "key-r1"},
		"0", "86400000", "1", "3", "r1", "10", "type", "t", "payload", "{}", "job_id", "r1", "track", "1", "idempotency_key", "key-r1")
	if err != nil {
		t.Fatalf("redis-cli: %v: %s", err, out)
	}
	lines := strings.Fields(out)
	if len(lines) != 3 || lines[1] != "r1" || lines[2] != "0" {
		t.Fatalf("reply %q, want entry, r1, 0", out)
	}
	entry := lines[0]
	jout, code := job("r1")
	if code != 0 {
		t.Fatalf("pelican job: exit %d: %s", code, jout)
	}
	var info map[string]any
	if err := json.Unmarshal([]byte(jout), &info); err != nil {
		t.Fatalf("pelican job -o json: %v: %s", err, jout)
	}
	if !strings.Contains(jout, stream.StateWaiting) || !strings.Contains(jout, entry) {
		t.Errorf("pelican job says %s, want waiting in %s", jout, entry)
	}
	// The same call again (a retry after a lost reply): a duplicate, the same entry, still waiting.
	out, err = eval([]string{name, k.Once + "key-r1", stream.JobKey(k, "r1")},
		"0", "86400000", "1", "2", "r1", "10", "type", "t", "payload", "{}", "job_id", "r1", "track", "1", "idempotency_key", "key-r1")
	if f := strings.Fields(out); err != nil || len(f) != 3 || f[0] != entry || f[2] != "1" {
		t.Errorf("repeat: %v: %q, want %s r1 1", err, out, entry)
	}
	if n, _ := rdb.XLen(ctx, name).Result(); n != 1 {
		t.Errorf("stream holds %d entries, want 1", n)
	}
	if info, err := control.Lookup(ctx, rdb, name, "r1"); err != nil || info.State != stream.StateWaiting || info.EntryID != entry {
		t.Errorf("Lookup = %+v, %v", info, err)
	}
}

func init() { subprocessModes["a14tr-producer"] = a14trProducerMain }

// a14trProducerMain enqueues mixed batches (tracked, untracked, keyed and tracked) forever, job IDs
// <PW_RUN>-<batch>-<i>, until it is killed.
func a14trProducerMain() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("PW_ADDR")})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: os.Getenv("PW_STREAM"), EnqueueOnce: time.Hour})
	ctx := context.Background()
	for b := 0; ; b++ {
		jobs := make([]*stream.Job, 150)
		for i := range jobs {
			id := fmt.Sprintf("%s-%d-%d", os.Getenv("PW_RUN"), b, i)
			j := &stream.Job{ID: id, Type: "t", Payload: []byte(strconv.Itoa(i)), Track: i%3 != 0}
			if i%4 == 1 {
				j.IdempotencyKey = "k-" + id
			}
			jobs[i] = j
		}
		if _, err := p.EnqueueBatch(ctx, jobs); err != nil {
			fmt.Fprintln(os.Stderr, "batch:", err)
		}
	}
}

// TestAttack14Track_producerKilledMidBatch: a producer SIGKILLed (several times) while it sends mixed
// batches and the scripts are flushed beside it leaves nothing that lies: every record names an entry
// of its job, every tracked entry has its record, every marker names an entry, nothing is in twice.
func TestAttack14Track_producerKilledMidBatch(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	ctx := context.Background()
	name := redistest.Name(t)
	k, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	fctx, stopFlush := context.WithCancel(ctx)
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for fctx.Err() == nil {
			rdb.ScriptFlush(fctx)
			time.Sleep(3 * time.Millisecond) // pacing only: how often the cache is lost
		}
	}()
	for run := 0; run < 4; run++ {
		before, _ := rdb.XLen(ctx, name).Result()
		w := startSubprocess(t, "a14tr-producer", "PW_ADDR="+srv.Addr(), "PW_STREAM="+name, "PW_RUN=run"+strconv.Itoa(run))
		poll.Until(t, 2*time.Minute, func() (bool, string) {
			n, _ := rdb.XLen(ctx, name).Result()
			return n >= before+700, fmt.Sprintf("stream length %d, want %d", n, before+700)
		})
		w.signal(syscall.SIGKILL)
		_ = w.wait(time.Minute)
	}
	stopFlush()
	<-flushed

	xs, err := rdb.XRange(ctx, name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	entryOf := map[string]string{}
	for _, x := range xs {
		id, _ := x.Values["job_id"].(string)
		if e, dup := entryOf[id]; dup {
			t.Errorf("job %s twice: %s and %s", id, e, x.ID)
		}
		entryOf[id] = x.ID
		tracked := x.Values["track"] == "1"
		v, gerr := rdb.Get(ctx, stream.JobKey(k, id)).Result()
		if tracked {
			r, perr := stream.ParseRecord(v)
			if gerr != nil || perr != nil || r.State != stream.StateWaiting || r.Entry != x.ID {
				t.Errorf("tracked job %s in %s: record %q (%v, %v)", id, x.ID, v, gerr, perr)
			}
		} else if gerr == nil {
			t.Errorf("untracked job %s has a record %q", id, v)
		}
		if key, _ := x.Values["idempotency_key"].(string); key != "" {
			if m, err := rdb.Get(ctx, k.Once+key).Result(); err != nil || m != x.ID+" "+id {
				t.Errorf("job %s in %s: marker %q (%v)", id, x.ID, m, err)
			}
		}
	}
	var records, markers int
	iter := rdb.Scan(ctx, 0, k.Job+"*", 1000).Iterator()
	for iter.Next(ctx) {
		records++
		id := strings.TrimPrefix(iter.Val(), k.Job)
		if _, ok := entryOf[id]; !ok {
			v, _ := rdb.Get(ctx, iter.Val()).Result()
			t.Errorf("record %s (%q) of a job not in the stream", iter.Val(), v)
		}
	}
	iter = rdb.Scan(ctx, 0, k.Once+"*", 1000).Iterator()
	for iter.Next(ctx) {
		markers++
		m, _ := rdb.Get(ctx, iter.Val()).Result()
		e, id, _ := strings.Cut(m, " ")
		if entryOf[id] != e {
			t.Errorf("marker %s says %q: that job is not in that entry", iter.Val(), m)
		}
	}
	t.Logf("%d entries, %d records, %d markers", len(xs), records, markers)
}
