package integration

// Attack 23 (reading and prefetch), in-process consumers on the shared
// Redis, written from README.md ("Reading") and the consumer godoc only:
//   - with short jobs and the default Config, reads come in batches of 50
//     to 100 and never take the consumer past 100 jobs held;
//   - a consumer holds at most Concurrency + Prefetch fresh jobs (running or
//     queued), also when its room grew on short jobs and a burst of jobs that
//     block follows (the README promised such a burst "held no more than
//     with Prefetch = Concurrency"; it now states the limit instead).
// Reads are observed with a go-redis hook on the consumer's own client:
// every XREADGROUP ... > reply's entries are counted as delivered, and a
// job counts as no longer held once its handler has returned (before its
// ack), so the held figure computed at each read is a lower bound of what
// the consumer holds.

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// attack23Reads records the fresh reads (XREADGROUP with ">") made through
// a client, and what the consumer held after each.
type attack23Reads struct {
	delivered atomic.Int64 // entries delivered by fresh reads
	returned  atomic.Int64 // handlers returned (set by the test's handler)
	mu        sync.Mutex
	sizes     []int // entries per fresh read, in order (empty reads left out)
	held      []int // delivered - returned right after each fresh read
	counts    []int // the COUNT each fresh read asked for
	before    []int // delivered - returned when each fresh read was sent
}

func (r *attack23Reads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *attack23Reads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		before := int(r.delivered.Load() - r.returned.Load())
		err := next(ctx, cmd)
		r.see(cmd, before)
		return err
	}
}

func (r *attack23Reads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			r.see(c, -1)
		}
		return err
	}
}

// see records cmd if it is a fresh read; before is what the consumer held
// (delivered, handler not returned) when it was sent, -1 if unknown.
func (r *attack23Reads) see(cmd redis.Cmder, before int) {
	if !strings.EqualFold(cmd.Name(), "xreadgroup") {
		return
	}
	fresh, count := false, -1
	args := cmd.Args()
	for i, a := range args {
		s, ok := a.(string)
		if ok && s == ">" {
			fresh = true
		}
		if ok && strings.EqualFold(s, "count") && i+1 < len(args) {
			count, _ = strconv.Atoi(fmt.Sprint(args[i+1]))
		}
	}
	if !fresh || cmd.Err() != nil {
		return
	}
	n := 0
	switch xs := cmd.(type) {
	case *redis.XStreamSliceCmd:
		for _, s := range xs.Val() {
			n += len(s.Messages)
		}
	case *redis.RawCmd: // a backlog's read, parsed by the consumer
		n = rawEntries(xs.Val())
	default:
		return
	}
	if n == 0 {
		return
	}
	d := r.delivered.Add(int64(n))
	held := int(d - r.returned.Load())
	r.mu.Lock()
	r.sizes = append(r.sizes, n)
	r.held = append(r.held, held)
	r.counts = append(r.counts, count)
	r.before = append(r.before, before)
	r.mu.Unlock()
}

// rawEntries returns the entry count of a one-stream XREADGROUP reply in
// raw RESP2 or RESP3 (0 for a nil or anything else).
func rawEntries(b []byte) int {
	line := func() string {
		i := bytes.Index(b, []byte("\r\n"))
		if i < 0 {
			return ""
		}
		l := string(b[:i])
		b = b[i+2:]
		return l
	}
	if top := line(); top != "*1" && top != "%1" {
		return 0
	} else if top == "*1" {
		line() // *2
	}
	size, err := strconv.Atoi(strings.TrimPrefix(line(), "$"))
	if err != nil || size+2 > len(b) {
		return 0
	}
	b = b[size+2:]
	n, _ := strconv.Atoi(strings.TrimPrefix(line(), "*"))
	return n
}

func (r *attack23Reads) snapshot() (sizes, held, counts []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes), slices.Clone(r.held), slices.Clone(r.counts)
}

// heldWhenSent returns, for each fresh read, what the consumer held when it
// was sent (see before).
func (r *attack23Reads) heldWhenSent() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.before)
}

// attack23Enqueue adds n jobs of type typ to name in batches and returns
// their entry IDs.
func attack23Enqueue(t *testing.T, rdb *redis.Client, name, typ string, n int) []string {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	var ids []string
	for i := 0; i < n; i += 500 {
		var jobs []*stream.Job
		for k := i; k < min(i+500, n); k++ {
			j, err := stream.NewJSONJob(typ, map[string]int{"n": k})
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, j)
		}
		got, err := p.EnqueueBatch(context.Background(), jobs)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	if len(ids) != n {
		t.Fatalf("EnqueueBatch returned %d entry IDs for %d jobs", len(ids), n)
	}
	return ids
}

// attack23Median returns the median of xs (0 for none).
func attack23Median(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestAttack23ReadBatchSizes: 6,000 jobs that do nothing, one consumer with
// the default Config. The README: "With the default Prefetch the room grows
// while jobs are short, up to 100 (reads of 50 to 100)". The reads after the
// first few (the room growing) and before the last (the stream running dry)
// must have a median of 50 to 100 entries, and no read may take the consumer
// past 100 jobs held. Every job runs exactly once.
//
// Precondition: jobs are short. The handler measures its own run time; a
// run whose average is over 0.5 ms (a loaded machine: at 0.5 ms a room of
// 100 on 10 workers already makes queued jobs wait 5 ms) checks nothing and
// is repeated.
func TestAttack23ReadBatchSizes(t *testing.T) {
	t.Parallel()
	for run := 1; run <= 4; run++ {
		broken := false
		if !t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) { broken = attack23ReadBatchSizes(t) }) || !broken {
			return
		}
	}
	t.Fatalf("4 runs in a row could not check: the machine kept jobs from being short")
}

// attack23ReadBatchSizes runs the scenario once; it returns true when the
// precondition was broken (nothing checked).
func attack23ReadBatchSizes(t *testing.T) (broken bool) {
	const n = 6000
	shared := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(shared, name+"*"); redistest.DeleteKeys(shared, "{"+name+"}:*") })
	ids := attack23Enqueue(t, shared, name, "fast", n)

	reads := &attack23Reads{}
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(reads)
	var runs sync.Map // entry ID -> *atomic.Int32
	var busy atomic.Int64
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "a", Block: 100 * time.Millisecond}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			start := time.Now()
			v, _ := runs.LoadOrStore(j.EntryID, new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
			busy.Add(int64(time.Since(start)))
			reads.returned.Add(1)
			return nil
		}))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	attack23Finish(t, c, done, n, ids, &runs)
	sizes, held, counts := reads.snapshot()
	avg := time.Duration(busy.Load() / n)
	t.Logf("%d fresh reads, sizes %v; COUNT asked %v; held after each %v; handler average %v", len(sizes), sizes, counts, held, avg)
	if maxHeld := slices.Max(held); maxHeld > 100 {
		t.Errorf("a read took the consumer to %d jobs held (delivered, handler not returned), over 100", maxHeld)
	}
	if avg > 500*time.Microsecond {
		t.Logf("precondition broken: handler average %v over 0.5 ms; nothing checked", avg)
		return true
	}
	if len(sizes) < 12 {
		t.Fatalf("only %d fresh reads for %d jobs: batches far over 100", len(sizes), n)
	}
	mid := sizes[5 : len(sizes)-1]
	if m := attack23Median(mid); m < 50 || m > 100 {
		t.Errorf("median read of %d entries (reads after the 5th, before the last: %v), want 50 to 100", m, mid)
	}
	return false
}

// attack23HoldCase is one configuration of TestAttack23HoldBound.
type attack23HoldCase struct {
	name     string
	prefetch int // Config.Prefetch
	bound    int // the most jobs that may be held
	why      string
}

// TestAttack23HoldBound: one consumer with Concurrency 4 runs 3,000 jobs
// that do nothing, followed in the stream by 200 jobs that block until
// released. While its workers are blocked, the consumer may hold (read,
// handler not returned) at most:
//   - Prefetch 6: Concurrency + Prefetch = 10 ("holds at most Concurrency +
//     Prefetch fresh jobs"; only the default Prefetch is raised), and no
//     read is sent while jobs are queued and more than 5 held ("while jobs
//     are still queued it reads only once half of that room is free");
//   - Prefetch -1: Concurrency = 4 ("each read takes only the free slots").
//
// The blocking jobs are counted held from the read hook and, separately,
// as entries pending under the consumer that never returned. After the
// release every job has run exactly once and nothing is pending.
// (Seen red without touching product code: with the Prefetch 6 bound
// lowered to 7, both checks fail at the 10 the consumer held; and the same
// checks fail in TestAttack23HoldBurstDefaultPrefetch, 100 held against 8.)
func TestAttack23HoldBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []attack23HoldCase{
		{"prefetch6", 6, 10, "Concurrency + Prefetch"},
		{"noPrefetch", -1, 4, "Concurrency, Prefetch negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			attack23HoldBound(t, tc)
		})
	}
}

// TestAttack23HoldBurstDefaultPrefetch: the same with the default Prefetch.
// The README: the room grows while jobs are short, "so slow jobs, or a burst
// of jobs that block, are held no more than with Prefetch = Concurrency"
// (here 8). Measured: after the short jobs the consumer reads the burst
// 100 at a time and holds 100 blocking jobs, 4 running and 96 queued behind
// them, which no other consumer of the group can take until its workers
// free (the godoc's own "price is balance").
func TestAttack23HoldBurstDefaultPrefetch(t *testing.T) {
	t.Skip("FINDING, now a documented limit (README Reading): with the default Prefetch a burst of blocking jobs read after short jobs is held 100 at a time (4 running, 96 queued), not 2*Concurrency; a give-back of the excess (branch s23-hold) was not merged: given-back jobs wait for a sweep (15 s by default) on a lone consumer")
	t.Parallel()
	attack23HoldBound(t, attack23HoldCase{"defaultPrefetch", 0, 8, "as with Prefetch = Concurrency"})
}

func attack23HoldBound(t *testing.T, tc attack23HoldCase) {
	const fast, blocking, conc = 3000, 200, 4
	shared := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(shared, name+"*"); redistest.DeleteKeys(shared, "{"+name+"}:*") })
	ids := attack23Enqueue(t, shared, name, "fast", fast)
	blockIDs := attack23Enqueue(t, shared, name, "block", blocking)
	ids = append(ids, blockIDs...)

	reads := &attack23Reads{}
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(reads)
	release := make(chan struct{})
	var runs sync.Map // entry ID -> *atomic.Int32
	var blockedNow atomic.Int32
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "a", Concurrency: conc,
		Prefetch: tc.prefetch, Block: 100 * time.Millisecond, VisibilityTimeout: 10 * time.Second}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			v, _ := runs.LoadOrStore(j.EntryID, new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
			defer reads.returned.Add(1)
			if j.Type == "block" {
				blockedNow.Add(1)
				defer blockedNow.Add(-1)
				select {
				case <-release:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			return nil
		}))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	eventually(t, 120*time.Second, func() (bool, string) {
		n := blockedNow.Load()
		return n == conc, fmt.Sprintf("%d of %d workers blocked", n, conc)
	})
	// Every worker is blocked: nothing finishes, so the consumer's room can
	// only be what it already is. Sample what it holds for a while (a
	// longer look could only find more).
	maxPending := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		p, err := shared.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: name, Group: "g",
			Start: blockIDs[0], End: blockIDs[len(blockIDs)-1], Count: 1000, Consumer: "a"}).Result()
		if err != nil {
			t.Fatalf("XPENDING: %v", err)
		}
		maxPending = max(maxPending, len(p))
	}
	sizes, held, counts := reads.snapshot()
	close(release)
	attack23Finish(t, c, done, fast+blocking, ids, &runs)
	if n := (&scenario{t: t, rdb: shared, stream: name}).pending("g"); n != 0 {
		t.Errorf("%d entries still pending", n)
	}
	big := 0
	for _, n := range sizes {
		if n >= 50 {
			big++
		}
	}
	t.Logf("%d fresh reads (%d of 50 or more); last reads %v, COUNT %v, held after %v", len(sizes), big, sizes[max(0, len(sizes)-8):], counts[max(0, len(counts)-8):], held[max(0, len(held)-8):])
	t.Logf("blocking jobs pending under the consumer while its workers were blocked: at most %d (bound %d: %s)", maxPending, tc.bound, tc.why)
	if maxHeld := slices.Max(held); maxHeld > max(tc.bound, 100) || (tc.prefetch != 0 && maxHeld > tc.bound) {
		t.Errorf("a read took the consumer to %d jobs held, over %d (%s)", maxHeld, tc.bound, tc.why)
	}
	// "While jobs are still queued it reads only once half of that room is
	// free": with an explicit Prefetch, a read sent while more jobs were
	// held (delivered, handler not returned) than there are workers, so
	// some were queued, holds at most half of the room. (What it holds
	// when the read is sent is at most what it held when it chose to read.)
	if tc.prefetch > 0 {
		for i, h := range reads.heldWhenSent() {
			if h > conc && h > (conc+tc.prefetch)/2 {
				t.Errorf("read %d (COUNT %d) sent while %d jobs were held, %d of them queued: over half of the room of %d", i, counts[i], h, h-conc, conc+tc.prefetch)
			}
		}
	}
	if maxPending > tc.bound {
		t.Errorf("the consumer held %d blocking jobs (%d running, %d queued that no other consumer can take), over %d (%s)",
			maxPending, conc, maxPending-conc, tc.bound, tc.why)
	}
}

// attack23Finish waits until consumer c (its Run's error on done) acked
// want jobs, shuts it down, and checks that each entry of ids ran exactly
// once (runs: entry ID -> *atomic.Int32, counted by the handler).
func attack23Finish(t *testing.T, c *consumer.Consumer, done <-chan error, want int, ids []string, runs *sync.Map) {
	t.Helper()
	eventually(t, 120*time.Second, func() (bool, string) {
		st := c.Stats()
		return st.Acked == uint64(want), fmt.Sprintf("acked %d of %d", st.Acked, want)
	})
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	for _, id := range ids {
		got := int32(0)
		if v, ok := runs.Load(id); ok {
			got = v.(*atomic.Int32).Load()
		}
		if got != 1 {
			t.Errorf("entry %s ran %d times, want 1", id, got)
		}
	}
}
