package consumer_test

// Attack 21 (settlement): an outside tester's tests, written from README.md
// and the consumer godoc only. Promises attacked:
//   - every settlement (ack, retry, snooze, dead letter) is owner-checked and
//     batched, so a worker whose job was taken over settles nothing, also in
//     batches that mix stale entries with owned ones and mix outcomes;
//   - settled entries are deleted once every group has settled them, never
//     before (a lagging group, a group holding entries pending, a long job);
//   - a pause holds prefetched (queued) jobs;
//   - a queued job whose lease ended is not started by its worker.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

var a21Discard = slog.New(slog.DiscardHandler)

// a21Run is one run of a handler, as the test saw it.
type a21Run struct {
	Consumer, JobID, EntryID, Type string
	Attempt, Deliveries            int
}

// a21Book records every handler run of a test.
type a21Book struct {
	mu   sync.Mutex
	runs []a21Run
}

func (b *a21Book) add(consumerName string, j *stream.Job) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.runs = append(b.runs, a21Run{consumerName, j.ID, j.EntryID, j.Type, j.Attempt, j.Deliveries})
}

func (b *a21Book) snapshot() []a21Run {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]a21Run(nil), b.runs...)
}

func (b *a21Book) count(f func(a21Run) bool) int {
	n := 0
	for _, r := range b.snapshot() {
		if f(r) {
			n++
		}
	}
	return n
}

// a21Start runs c until the test ends (or stop is called) and returns stop,
// which shuts c down and waits for Run.
func a21Start(t *testing.T, c *consumer.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Logf("consumer Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Errorf("consumer Run did not return 60s after cancel")
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-c.Reading():
	case err := <-done:
		t.Fatalf("consumer Run returned before reading: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("consumer not reading after 30s")
	}
	return stop
}

func a21Enqueue(t *testing.T, rdb redis.UniversalClient, s string, types ...string) []*stream.Job {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	jobs := make([]*stream.Job, len(types))
	for i, typ := range types {
		j, err := stream.NewJSONJob(typ, map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		jobs[i] = j
	}
	for i := 0; i < len(jobs); i += 500 {
		if _, err := p.EnqueueBatch(context.Background(), jobs[i:min(i+500, len(jobs))]); err != nil {
			t.Fatal(err)
		}
	}
	return jobs
}

// a21Pending returns the group's pending entries: entry ID -> owner.
func a21Pending(t *testing.T, rdb redis.UniversalClient, s, group string) map[string]redis.XPendingExt {
	t.Helper()
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: s, Group: group, Start: "-", End: "+", Count: 100000}).Result()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	out := make(map[string]redis.XPendingExt, len(p))
	for _, e := range p {
		out[e.ID] = e
	}
	return out
}

// a21EntriesByJob returns, for the stream s, job ID -> entry IDs present.
func a21EntriesByJob(t *testing.T, rdb redis.UniversalClient, s string) map[string][]string {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), s, "-", "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", s, err)
	}
	out := map[string][]string{}
	for _, m := range msgs {
		id, _ := m.Values["job_id"].(string)
		out[id] = append(out[id], m.ID)
	}
	return out
}

// a21Outcomes is the handler of the mixed-outcome tests: the job's type says
// what its run returns. "retry": Retry on its first attempt, then done;
// "snooze": Snooze on its first entry, then done; "dead": Dead; "ack": done.
// firstEntry remembers each job's first entry ID.
type a21Outcomes struct {
	mu         sync.Mutex
	firstEntry map[string]string
}

func (o *a21Outcomes) outcome(j *stream.Job) error {
	o.mu.Lock()
	first, ok := o.firstEntry[j.ID]
	if !ok {
		o.firstEntry[j.ID] = j.EntryID
		first = j.EntryID
	}
	o.mu.Unlock()
	switch j.Type {
	case "retry":
		if j.Attempt == 0 {
			return consumer.Retry(20*time.Millisecond, errors.New("attack21 retry"))
		}
	case "snooze":
		if j.EntryID == first {
			return consumer.Snooze(20 * time.Millisecond)
		}
	case "dead":
		return consumer.Dead(consumer.ReasonPermanent, errors.New("attack21 dead"))
	}
	return nil
}

// TestAttack21_StaleMixedBatch: a consumer whose 8 running jobs (two of each
// outcome) lose half of their entries to another consumer (XCLAIM, as a
// sweep after a stall would) settles them all in one go: the batches mix
// stale and owned entries and acks, retries, snoozes and dead letters. Only
// the owned half may be settled; the stolen half must stay pending under the
// thief, with no retry, snooze or dead letter made for it. Then the thief runs
// its entries, and every job is settled exactly once.
//
// "cutoff": the consumer is partitioned from Redis (faultproxy Blackhole)
// when its handlers return, the entries are stolen during the partition, and
// the settlements it sent into the partition reach Redis after the theft (a
// cut-off connection delivering late).
//
// Catches: an unscoped XACK, a retry/dead script that checks only the first
// entry of a batch or the batch as a whole, a settlement that trusts the
// consumer's local view of ownership.
func TestAttack21_StaleMixedBatch(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"stolen", "cutoff"} {
		t.Run(mode, func(t *testing.T) { a21StaleMixed(t, mode == "cutoff") })
	}
}

func a21StaleMixed(t *testing.T, cutoff bool) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	proxy, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, PoolSize: 20})
	t.Cleanup(func() { viaProxy.Close() })
	s := redistest.Name(t)
	keys, _ := stream.KeysFor(s)

	book := &a21Book{}
	out := &a21Outcomes{firstEntry: map[string]string{}}
	release := make(chan struct{})
	var returned sync.WaitGroup
	returned.Add(8)
	handler := func(name string) consumer.HandlerFunc {
		return func(ctx context.Context, j *stream.Job) error {
			book.add(name, j)
			if name == "A" && j.Attempt == 0 && j.Deliveries == 1 && book.count(func(r a21Run) bool { return r.JobID == j.ID }) == 1 {
				<-release // first run on A: hold until the test says, whatever ctx says
				defer returned.Done()
			}
			return out.outcome(j)
		}
	}
	cfg := func(name string) consumer.Config {
		return consumer.Config{
			Stream: s, Group: "g", Consumer: name, Concurrency: 8, Prefetch: -1,
			VisibilityTimeout: 30 * time.Second, HeartbeatInterval: 10 * time.Second, SweepInterval: 15 * time.Second,
			Block: 100 * time.Millisecond, SettleTimeout: 30 * time.Second, PromoteInterval: 20 * time.Millisecond,
			MaxCrashes: 10, IdleConsumerTimeout: -1, Logger: a21Discard,
		}
	}
	a := consumer.New(viaProxy, cfg("A")).Handle(handler("A"))
	stopA := a21Start(t, a)

	jobs := a21Enqueue(t, rdb, s, "ack", "retry", "snooze", "dead", "ack", "retry", "snooze", "dead")
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := book.count(func(r a21Run) bool { return r.Consumer == "A" })
		return n == 8, fmt.Sprintf("%d of 8 jobs started on A", n)
	})
	pend := a21Pending(t, rdb, s, "g")
	entryOf := map[string]string{}
	for _, r := range book.snapshot() {
		entryOf[r.JobID] = r.EntryID
	}
	// Steal jobs 0..3 (one of each outcome); keep 4..7.
	stolen := map[string]bool{}
	var stolenEntries []string
	for _, j := range jobs[:4] {
		stolen[j.ID] = true
		stolenEntries = append(stolenEntries, entryOf[j.ID])
	}
	for _, e := range stolenEntries {
		if pend[e].Consumer != "A" {
			t.Fatalf("entry %s pending under %q before the theft, want A", e, pend[e].Consumer)
		}
	}
	steal := func() {
		if err := rdb.XClaim(context.Background(), &redis.XClaimArgs{Stream: s, Group: "g", Consumer: "thief", MinIdle: 0, Messages: stolenEntries}).Err(); err != nil {
			t.Fatalf("XCLAIM: %v", err)
		}
	}
	if cutoff {
		proxy.Blackhole()
		close(release)
		returned.Wait()
		steal()
		// Give A time to put its settlements into the partition; they reach
		// Redis when it heals, after the theft.
		time.Sleep(500 * time.Millisecond)
		proxy.Pass()
	} else {
		steal()
		close(release)
		returned.Wait()
	}

	// The kept half settles: ack, retry then ack, snooze then ack, dead.
	kept := jobs[4:]
	poll.Until(t, 30*time.Second, func() (bool, string) {
		p := a21Pending(t, rdb, s, "g")
		underA := 0
		for _, e := range p {
			if e.Consumer == "A" {
				underA++
			}
		}
		second := book.count(func(r a21Run) bool {
			return r.Consumer == "A" && (r.JobID == kept[1].ID || r.JobID == kept[2].ID) && r.EntryID != entryOf[r.JobID]
		})
		z, _ := rdb.ZCard(context.Background(), keys.Delayed).Result()
		return underA == 0 && second >= 2 && z == 0, fmt.Sprintf("pending under A %d, second runs of kept retry/snooze %d, delayed %d", underA, second, z)
	})
	// Let any late settlement land (nothing should).
	time.Sleep(300 * time.Millisecond)
	p := a21Pending(t, rdb, s, "g")
	for _, e := range stolenEntries {
		if pe, ok := p[e]; !ok || pe.Consumer != "thief" {
			t.Errorf("stolen entry %s: pending=%v owner=%q; a stale worker settled (or moved) it", e, ok, pe.Consumer)
		}
	}
	if len(p) != 4 {
		t.Errorf("pending entries: %d, want the 4 stolen ones: %v", len(p), p)
	}
	dead, err := rdb.XRange(context.Background(), keys.Dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Values["job_id"] != kept[3].ID {
		t.Errorf("dead letters after the stale batch: %d (%v), want only the kept dead job %s", len(dead), a21JobIDs(dead), kept[3].ID)
	}
	byJob := a21EntriesByJob(t, rdb, s)
	for _, j := range jobs[:4] {
		if len(byJob[j.ID]) != 1 {
			t.Errorf("stolen %s job %s has entries %v in the stream, want its original only", j.Type, j.ID, byJob[j.ID])
		}
	}
	for _, j := range jobs[:4] {
		if n := book.count(func(r a21Run) bool { return r.JobID == j.ID }); n != 1 {
			t.Errorf("stolen %s job ran %d times before the thief ran, want 1", j.Type, n)
		}
	}
	st := a.Stats()
	t.Logf("A stats after the stale batch: %+v", st)
	if st.Acked+st.Retried+st.Snoozed+st.DeadLettered > 0 && st.Acked > 3 {
		t.Errorf("A counted %d acks, at most 3 are its own (kept ack, kept retry's and snooze's second runs)", st.Acked)
	}

	// The thief, a real consumer now, re-reads its pending entries and
	// settles them: every job ends settled exactly once.
	thief := consumer.New(rdb, cfg("thief")).Handle(handler("thief"))
	stopT := a21Start(t, thief)
	// Entries per job over all runs: ack and dead 1, retry and snooze 2.
	entries := func() map[string]map[string]bool {
		out := map[string]map[string]bool{}
		for _, r := range book.snapshot() {
			if out[r.JobID] == nil {
				out[r.JobID] = map[string]bool{}
			}
			out[r.JobID][r.EntryID] = true
		}
		return out
	}
	// Settled: nothing pending, delayed, or added and not yet read (a
	// retry's new entry, before its run, leaves nothing pending).
	poll.Until(t, 30*time.Second, func() (bool, string) {
		p := a21Pending(t, rdb, s, "g")
		z, _ := rdb.ZCard(context.Background(), keys.Delayed).Result()
		d, _ := rdb.XLen(context.Background(), keys.Dead).Result()
		lag := a21Lag(t, rdb, s, "g")
		return len(p) == 0 && z == 0 && d == 2 && lag == 0, fmt.Sprintf("pending %d delayed %d dead %d lag %d", len(p), z, d, lag)
	})
	stopT()
	stopA()
	dead, _ = rdb.XRange(context.Background(), keys.Dead, "-", "+").Result()
	ids := a21JobIDs(dead)
	if len(ids) != 2 || !(ids[jobs[3].ID] == 1 && ids[jobs[7].ID] == 1) {
		t.Errorf("dead letters %v, want one each of %s and %s", ids, jobs[3].ID, jobs[7].ID)
	}
	for _, j := range jobs {
		want := 1
		if j.Type == "retry" || j.Type == "snooze" {
			want = 2
		}
		if n := len(entries()[j.ID]); n != want {
			t.Errorf("%s job %s (stolen %v) ran from %d entries, want %d", j.Type, j.ID, stolen[j.ID], n, want)
		}
	}
}

// a21Lag returns group's lag on stream s: entries added and not yet read.
func a21Lag(t *testing.T, rdb *redis.Client, s, group string) int64 {
	t.Helper()
	groups, err := rdb.XInfoGroups(context.Background(), s).Result()
	if err != nil {
		t.Fatalf("XINFO GROUPS: %v", err)
	}
	for _, g := range groups {
		if g.Name == group {
			return g.Lag
		}
	}
	t.Fatalf("no group %s on %s", group, s)
	return 0
}

func a21JobIDs(msgs []redis.XMessage) map[string]int {
	out := map[string]int{}
	for _, m := range msgs {
		id, _ := m.Values["job_id"].(string)
		out[id]++
	}
	return out
}

// TestAttack21_RetentionLaggingGroups: three groups on one stream. g2 holds
// 5 entries pending (handlers blocked) and has read nothing else; g3 has no
// consumer at all yet. g1 settles every entry. No entry may be deleted: each
// is unread by g3, and unread or pending in g2. Then g2 and g3 run: each gets
// every entry once, with its payload, and once every group has settled them
// the stream empties.
//
// Catches: deletion that looks at the settling group only, at lag but not at
// pending entries, or at pending but not at unread entries.
func TestAttack21_RetentionLaggingGroups(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })
	ctx := context.Background()
	for _, g := range []string{"g1", "g2", "g3"} {
		if err := rdb.XGroupCreateMkStream(ctx, s, g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	const n = 400
	types := make([]string, n)
	for i := range types {
		types[i] = "t"
	}
	jobs := a21Enqueue(t, rdb, s, types...)
	want := map[string]int{}
	for i, j := range jobs {
		want[j.ID] = i
	}

	books := map[string]*a21Book{"g1": {}, "g2": {}, "g3": {}}
	var bad sync.Map
	release := make(chan struct{})
	mk := func(group string, conc int) *consumer.Consumer {
		return consumer.New(rdb, consumer.Config{
			Stream: s, Group: group, Consumer: group + "-c", Concurrency: conc, Prefetch: -1,
			VisibilityTimeout: 30 * time.Second, Block: 100 * time.Millisecond, Logger: a21Discard,
		}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			var p struct{ I int }
			if err := j.Decode(&p); err != nil || want[j.ID] != p.I {
				bad.Store(group+" "+j.ID, fmt.Sprintf("payload %q err %v", j.Payload, err))
			}
			books[group].add(group, j)
			if group == "g2" {
				<-release
			}
			return nil
		}))
	}
	g2 := mk("g2", 5)
	stop2 := a21Start(t, g2)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := books["g2"].count(func(a21Run) bool { return true })
		return n == 5, fmt.Sprintf("g2 started %d of 5", n)
	})
	g1 := mk("g1", 8)
	stop1 := a21Start(t, g1)
	poll.Until(t, 60*time.Second, func() (bool, string) {
		n := books["g1"].count(func(a21Run) bool { return true })
		p := len(a21Pending(t, rdb, s, "g1"))
		return n >= len(jobs) && p == 0, fmt.Sprintf("g1 ran %d of %d, pending %d", n, len(jobs), p)
	})
	// Settled by g1, but needed by g2 and g3: nothing may go, however long
	// we look (the trimming runs every 100 settled, at the last, or 100 ms
	// after).
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if l, _ := rdb.XLen(ctx, s).Result(); l != n {
			t.Fatalf("XLEN %d after g1 settled everything, want %d: entries deleted while g2/g3 still need them", l, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	g3 := mk("g3", 8)
	stop3 := a21Start(t, g3)
	for _, g := range []string{"g2", "g3"} {
		poll.Until(t, 60*time.Second, func() (bool, string) {
			got := books[g].count(func(a21Run) bool { return true })
			p := len(a21Pending(t, rdb, s, g))
			return got >= n && p == 0, fmt.Sprintf("%s ran %d of %d, pending %d", g, got, n, p)
		})
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		l, _ := rdb.XLen(ctx, s).Result()
		return l == 0, fmt.Sprintf("XLEN %d after all groups settled everything, want 0", l)
	})
	stop1()
	stop2()
	stop3()
	for g, b := range books {
		runs := map[string]int{}
		for _, r := range b.snapshot() {
			runs[r.JobID]++
		}
		for _, j := range jobs {
			if runs[j.ID] != 1 {
				t.Errorf("group %s ran job %d %d times, want 1", g, want[j.ID], runs[j.ID])
			}
		}
	}
	for _, c := range []*consumer.Consumer{g1, g2, g3} {
		if st := c.Stats(); st.Lost != 0 {
			t.Errorf("stats %+v: entries lost", st)
		}
	}
	bad.Range(func(k, v any) bool { t.Errorf("%v: %v", k, v); return true })
}

// TestAttack21_RetentionLongJob: one job runs long in g1 while 3,000 more
// settle behind it in g1 and g2 (g2 also settles the long job at once). The
// long job's entry must stay (g1 holds it), and the stream must hold at most
// about 1,000 settled entries beyond it. After it finishes the stream empties.
//
// Catches: a MINID trim past a pending entry (the long job lost), or a
// retention that keeps everything after the oldest pending entry.
func TestAttack21_RetentionLongJob(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })
	ctx := context.Background()
	for _, g := range []string{"g1", "g2"} {
		if err := rdb.XGroupCreateMkStream(ctx, s, g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	long := a21Enqueue(t, rdb, s, "long")[0]
	release := make(chan struct{})
	books := map[string]*a21Book{"g1": {}, "g2": {}}
	mk := func(group string) *consumer.Consumer {
		return consumer.New(rdb, consumer.Config{
			Stream: s, Group: group, Consumer: group + "-c", Concurrency: 4,
			VisibilityTimeout: 10 * time.Second, Block: 100 * time.Millisecond, Logger: a21Discard,
		}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			books[group].add(group, j)
			if group == "g1" && j.Type == "long" {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}))
	}
	c1, c2 := mk("g1"), mk("g2")
	stop1 := a21Start(t, c1)
	stop2 := a21Start(t, c2)
	poll.Until(t, 30*time.Second, poll.True("long job started in g1", func() bool {
		return books["g1"].count(func(r a21Run) bool { return r.Type == "long" }) == 1
	}))
	const n = 3000
	types := make([]string, n)
	for i := range types {
		types[i] = "short"
	}
	a21Enqueue(t, rdb, s, types...)
	for _, g := range []string{"g1", "g2"} {
		poll.Until(t, 120*time.Second, func() (bool, string) {
			got := books[g].count(func(r a21Run) bool { return r.Type == "short" })
			return got >= n, fmt.Sprintf("%s ran %d of %d short jobs", g, got, n)
		})
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		p1, p2 := len(a21Pending(t, rdb, s, "g1")), len(a21Pending(t, rdb, s, "g2"))
		l, _ := rdb.XLen(ctx, s).Result()
		return p1 == 1 && p2 == 0 && l <= 1100, fmt.Sprintf("pending g1 %d (want 1) g2 %d (want 0); XLEN %d, want at most about 1,000 beyond the long job", p1, p2, l)
	})
	var longEntry string
	for _, r := range books["g1"].snapshot() {
		if r.JobID == long.ID {
			longEntry = r.EntryID
		}
	}
	if m, err := rdb.XRange(ctx, s, longEntry, longEntry).Result(); err != nil || len(m) != 1 {
		t.Fatalf("long job's entry %s: %v %v; deleted while g1 holds it pending", longEntry, m, err)
	}
	close(release)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		l, _ := rdb.XLen(ctx, s).Result()
		return l == 0, fmt.Sprintf("XLEN %d after everything settled, want 0", l)
	})
	stop1()
	stop2()
	for g, b := range books {
		if got := b.count(func(a21Run) bool { return true }); got != n+1 {
			t.Errorf("group %s ran %d jobs, want %d", g, got, n+1)
		}
	}
	if st := c1.Stats(); st.Lost != 0 {
		t.Errorf("g1 stats %+v: lost", st)
	}
}

// TestAttack21_PauseHoldsPrefetched: a consumer (Concurrency 1, Prefetch 4)
// holds one running job and four queued ones when the queue is paused. The
// running job finishes; the four queued ones must not start while paused,
// held past several visibility timeouts (their leases kept by the heartbeat,
// so a second consumer of the group takes none of them). On resume each runs
// once, on the first consumer, from its first delivery.
//
// Catches: a worker that starts queued jobs without looking at the pause, a
// parked job whose lease is not extended (reclaimed, a suspect).
func TestAttack21_PauseHoldsPrefetched(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })
	ctx := context.Background()
	book := &a21Book{}
	release := make(chan struct{})
	firstDone := make(chan struct{})
	mk := func(name string) *consumer.Consumer {
		return consumer.New(rdb, consumer.Config{
			Stream: s, Group: "g", Consumer: name, Concurrency: 1, Prefetch: 4,
			VisibilityTimeout: time.Second, SweepInterval: 100 * time.Millisecond,
			Block: 100 * time.Millisecond, Logger: a21Discard,
		}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			book.add(name, j)
			if j.Type == "first" {
				<-release
				close(firstDone)
			}
			return nil
		}))
	}
	a := mk("A")
	stopA := a21Start(t, a)
	jobs := a21Enqueue(t, rdb, s, "first")
	poll.Until(t, 30*time.Second, poll.True("first job started", func() bool { return book.count(func(a21Run) bool { return true }) == 1 }))
	jobs = append(jobs, a21Enqueue(t, rdb, s, "q", "q", "q", "q")...)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		p := a21Pending(t, rdb, s, "g")
		under := 0
		for _, e := range p {
			if e.Consumer == "A" {
				under++
			}
		}
		return under == 5, fmt.Sprintf("%d of 5 entries pending under A (1 running, 4 queued)", under)
	})
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, poll.True("A sees the pause", func() bool { return a.Health().Paused }))
	close(release)
	<-firstDone
	poll.Until(t, 30*time.Second, func() (bool, string) {
		h := a.Health()
		first := a21Pending(t, rdb, s, "g")[book.snapshot()[0].EntryID]
		return h.Held == 4 && first.ID == "", fmt.Sprintf("held %d (want 4), first job still pending %v", h.Held, first.ID != "")
	})
	t.Logf("A health while 4 parked: %+v", a.Health())
	b := mk("B")
	stopB := a21Start(t, b)
	// Paused for three visibility timeouts: nothing starts, nothing moves.
	deadline := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := book.count(func(a21Run) bool { return true }); n != 1 {
			t.Fatalf("%d jobs started while the queue was paused, want only the first: %v", n, book.snapshot())
		}
		time.Sleep(50 * time.Millisecond)
	}
	p := a21Pending(t, rdb, s, "g")
	for id, e := range p {
		if e.Consumer != "A" || e.RetryCount != 1 {
			t.Errorf("parked entry %s: owner %s deliveries %d, want A and 1 (its lease kept while paused)", id, e.Consumer, e.RetryCount)
		}
	}
	if err := control.Resume(ctx, rdb, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := book.count(func(a21Run) bool { return true })
		return n >= 5 && len(a21Pending(t, rdb, s, "g")) == 0, fmt.Sprintf("%d of 5 started", n)
	})
	stopB()
	stopA()
	runs := book.snapshot()
	if len(runs) != 5 {
		t.Errorf("runs %v, want 5", runs)
	}
	for _, r := range runs {
		if r.Consumer != "A" || r.Deliveries != 1 {
			t.Errorf("run %+v: want each job run by A from its first delivery", r)
		}
	}
	_ = jobs
}

// TestAttack21_QueuedLeaseEnded: a consumer (Concurrency 1, Prefetch 3) runs
// one job (which ignores its context) and holds three queued ones when it is
// cut off from Redis for longer than the visibility timeout; another consumer
// takes all four over and runs them. When the running job returns and the
// connection heals, the first consumer's worker is free: it must not start
// any of the three queued jobs whose leases ended.
//
// Catches: a worker that starts a queued job without checking its lease.
func TestAttack21_QueuedLeaseEnded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	proxy, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	t.Cleanup(func() { viaProxy.Close() })
	s := redistest.Name(t)
	book := &a21Book{}
	release := make(chan struct{})
	mk := func(rc redis.UniversalClient, name string) *consumer.Consumer {
		return consumer.New(rc, consumer.Config{
			Stream: s, Group: "g", Consumer: name, Concurrency: 1, Prefetch: 3,
			VisibilityTimeout: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
			SweepInterval: 200 * time.Millisecond, Block: 100 * time.Millisecond, Logger: a21Discard,
		}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			book.add(name, j)
			if name == "A" && j.Type == "first" {
				<-release
			}
			return nil
		}))
	}
	a := mk(viaProxy, "A")
	stopA := a21Start(t, a)
	first := a21Enqueue(t, rdb, s, "first")[0]
	poll.Until(t, 30*time.Second, poll.True("first started on A", func() bool { return book.count(func(a21Run) bool { return true }) == 1 }))
	queued := a21Enqueue(t, rdb, s, "q", "q", "q")
	poll.Until(t, 30*time.Second, func() (bool, string) {
		p := a21Pending(t, rdb, s, "g")
		return len(p) == 4, fmt.Sprintf("%d of 4 pending under A", len(p))
	})
	proxy.Blackhole()
	b := mk(rdb, "B")
	stopB := a21Start(t, b)
	poll.Until(t, 60*time.Second, func() (bool, string) {
		n := book.count(func(r a21Run) bool { return r.Consumer == "B" })
		return n == 4 && len(a21Pending(t, rdb, s, "g")) == 0, fmt.Sprintf("B ran %d of 4", n)
	})
	close(release)
	proxy.Pass()
	// A is connected again with a free worker: wait until it reads again
	// (a read answered after the heal), then a while longer.
	healed := time.Now()
	poll.Until(t, 30*time.Second, poll.True("A reads again", func() bool { return a.Health().LastRead.After(healed) && a.Health().InFlight == 0 }))
	time.Sleep(500 * time.Millisecond)
	stopA()
	stopB()
	for _, j := range queued {
		if n := book.count(func(r a21Run) bool { return r.Consumer == "A" && r.JobID == j.ID }); n != 0 {
			t.Errorf("queued job %s started %d times on A after its lease ended (B had it)", j.ID, n)
		}
	}
	t.Logf("A stats %+v; first %s", a.Stats(), first.ID)
}

// TestAttack21_BatchAcrossPendingGap: a batch of eight settlements (two of
// each outcome) whose entries lie far apart in the stream, with 600 other
// pending entries between them: held by the same consumer (running, not in
// the batch) or by another consumer of the group. The owner check of a batch
// (a ranged XPENDING, the README says) must find every entry of the batch:
// none refused as stale, each settled once.
//
// Catches: a ranged XPENDING cut short by its COUNT (the batch's size) or not
// filtered by consumer, which would refuse the far entries as stale (they
// then run again after the visibility timeout: doubled).
func TestAttack21_BatchAcrossPendingGap(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"same", "other"} {
		t.Run(mode, func(t *testing.T) { a21Gap(t, mode == "other") })
	}
}

func a21Gap(t *testing.T, other bool) {
	rdb := redistest.Shared(t)
	s := redistest.Name(t)
	keys, _ := stream.KeysFor(s)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })
	ctx := context.Background()
	const fillers = 600
	book := &a21Book{}
	out := &a21Outcomes{firstEntry: map[string]string{}}
	release, releaseFill := make(chan struct{}), make(chan struct{})
	conc := 8
	if !other {
		conc = 8 + fillers
	}
	a := consumer.New(rdb, consumer.Config{
		Stream: s, Group: "g", Consumer: "A", Concurrency: conc, Prefetch: -1,
		VisibilityTimeout: 30 * time.Second, Block: 100 * time.Millisecond, PromoteInterval: 20 * time.Millisecond,
		MaxCrashes: 10, IdleConsumerTimeout: -1, Logger: a21Discard,
	}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		book.add("A", j)
		if j.Type == "filler" {
			<-releaseFill
			return nil
		}
		if book.count(func(r a21Run) bool { return r.JobID == j.ID }) == 1 {
			<-release
		}
		return out.outcome(j)
	}))
	stop := a21Start(t, a)
	kinds := []string{"ack", "retry", "snooze", "dead"}
	jobs := a21Enqueue(t, rdb, s, kinds...)
	poll.Until(t, 30*time.Second, poll.True("4 first jobs started", func() bool { return book.count(func(a21Run) bool { return true }) == 4 }))
	ft := make([]string, fillers)
	for i := range ft {
		ft[i] = "filler"
	}
	if other {
		if err := control.Pause(ctx, rdb, s, control.PauseOptions{}); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 30*time.Second, poll.True("A sees the pause", func() bool { return a.Health().Paused }))
		time.Sleep(300 * time.Millisecond) // a read sent before the pause may still be blocked
		a21Enqueue(t, rdb, s, ft...)
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "other", Streams: []string{s, ">"}, Count: fillers}).Err(); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, a21Enqueue(t, rdb, s, kinds...)...)
		if err := control.Resume(ctx, rdb, s, control.ResumeOptions{}); err != nil {
			t.Fatal(err)
		}
	} else {
		a21Enqueue(t, rdb, s, ft...)
		jobs = append(jobs, a21Enqueue(t, rdb, s, kinds...)...)
	}
	poll.Until(t, 60*time.Second, func() (bool, string) {
		n := book.count(func(r a21Run) bool { return r.Type != "filler" })
		return n == 8, fmt.Sprintf("%d of 8 batch jobs started", n)
	})
	p := a21Pending(t, rdb, s, "g")
	owners := map[string]int{}
	for _, e := range p {
		owners[e.Consumer]++
	}
	if other && (owners["other"] != fillers || book.count(func(r a21Run) bool { return r.Type == "filler" }) != 0) {
		t.Fatalf("precondition: fillers pending under other: %v", owners)
	}
	if !other && owners["A"] != fillers+8 {
		t.Fatalf("precondition: %v pending, want %d under A", owners, fillers+8)
	}
	close(release)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		second := book.count(func(r a21Run) bool { return r.Type == "retry" || r.Type == "snooze" })
		z, _ := rdb.ZCard(ctx, keys.Delayed).Result()
		d, _ := rdb.XLen(ctx, keys.Dead).Result()
		p := a21Pending(t, rdb, s, "g")
		return second == 8 && z == 0 && d == 2 && len(p) == fillers, fmt.Sprintf("retry/snooze runs %d of 8, delayed %d, dead %d of 2, pending %d (want %d fillers)", second, z, d, len(p), fillers)
	})
	// Redis has the settlements; the consumer counts each once its reply is
	// in, which on a loaded machine comes a little later.
	poll.Until(t, 30*time.Second, func() (bool, string) {
		st := a.Stats()
		return st.Acked+st.Stale >= 6 && st.DeadLettered+st.Stale >= 2, fmt.Sprintf("stats %+v", st)
	})
	st := a.Stats()
	if st.Stale != 0 || st.Acked != 6 || st.Retried != 2 || st.Snoozed != 2 || st.DeadLettered != 2 {
		t.Errorf("stats %+v: want Stale 0, Acked 6, Retried 2, Snoozed 2, DeadLettered 2", st)
	}
	close(releaseFill)
	stop()
	_ = jobs
}

// TestAttack21_RetentionUnknownLag: a group created after settled entries
// were deleted (an operator adds a group, at "0" or at an ID inside the
// deleted range) may have no lag that Redis can compute (XINFO GROUPS lag
// nil: tombstones after its position). The entries added after must still
// reach it: the first group settling them must not delete them while the new
// group has not read them.
//
// Catches: a retention that treats an unknown lag as "read everything".
func TestAttack21_RetentionUnknownLag(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"zero", "middle", "setid"} {
		t.Run(at, func(t *testing.T) { a21UnknownLag(t, at) })
	}
}

func a21UnknownLag(t *testing.T, at string) {
	rdb := redistest.Shared(t)
	s := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })
	ctx := context.Background()
	books := map[string]*a21Book{"g1": {}, "g2": {}}
	mk := func(group string) *consumer.Consumer {
		return consumer.New(rdb, consumer.Config{
			Stream: s, Group: group, Consumer: group + "-c", Concurrency: 4,
			VisibilityTimeout: 10 * time.Second, Block: 100 * time.Millisecond, Logger: a21Discard,
		}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			books[group].add(group, j)
			return nil
		}))
	}
	types := make([]string, 200)
	for i := range types {
		types[i] = "t"
	}
	a21Enqueue(t, rdb, s, types...)
	c1 := mk("g1")
	stop1 := a21Start(t, c1)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		l, _ := rdb.XLen(ctx, s).Result()
		return l == 0 && books["g1"].count(func(a21Run) bool { return true }) == 200, fmt.Sprintf("first 200: XLEN %d", l)
	})
	stop1()
	firstRuns := books["g1"].snapshot()
	mid := firstRuns[100].EntryID
	switch at {
	case "zero":
		if err := rdb.XGroupCreate(ctx, s, "g2", "0").Err(); err != nil {
			t.Fatal(err)
		}
	case "middle":
		if err := rdb.XGroupCreate(ctx, s, "g2", mid).Err(); err != nil {
			t.Fatal(err)
		}
	case "setid":
		if err := rdb.XGroupCreate(ctx, s, "g2", "$").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.XGroupSetID(ctx, s, "g2", mid).Err(); err != nil {
			t.Fatal(err)
		}
	}
	later := a21Enqueue(t, rdb, s, types...)
	groups, _ := rdb.Do(ctx, "XINFO", "GROUPS", s).Result()
	t.Logf("XINFO GROUPS before g1 runs again: %v", groups)
	c1b := mk("g1")
	stop1b := a21Start(t, c1b)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := books["g1"].count(func(a21Run) bool { return true })
		return n == 400 && len(a21Pending(t, rdb, s, "g1")) == 0, fmt.Sprintf("g1 ran %d of 400", n)
	})
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if l, _ := rdb.XLen(ctx, s).Result(); l != 200 {
			t.Errorf("XLEN %d after g1 settled the later 200, want 200: deleted before g2 (lag unknown) read them", l)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	c2 := mk("g2")
	stop2 := a21Start(t, c2)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := 0
		for _, r := range books["g2"].snapshot() {
			for _, j := range later {
				if r.JobID == j.ID {
					n++
				}
			}
		}
		l, _ := rdb.XLen(ctx, s).Result()
		return n == 200 && l == 0, fmt.Sprintf("g2 got %d of the later 200; XLEN %d (want 0)", n, l)
	})
	stop1b()
	stop2()
	if st := c2.Stats(); st.Lost != 0 {
		t.Errorf("g2 stats %+v", st)
	}
}

// TestAttack21_RetentionNilLag: as TestAttack21_RetentionUnknownLag, with
// tombstones after the new group's position, so that Redis reports its lag
// as nil. "own": the tombstones are the consumer's own XDELs (a long job
// holds the horizon while 1,500 settle behind it); "foreign": one entry was
// deleted with XDEL by someone else. A group g2 is then created at "0"; 200
// more jobs settle in g1. None of those 200 may be deleted before g2 reads
// them, and g2 gets every one.
//
// Catches: a retention that treats a nil lag as 0 ("read everything").
func TestAttack21_RetentionNilLag(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"own", "foreign"} {
		t.Run(mode, func(t *testing.T) { a21NilLag(t, mode == "own") })
	}
}

func a21NilLag(t *testing.T, own bool) {
	rdb := redistest.Shared(t)
	s := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })
	ctx := context.Background()
	books := map[string]*a21Book{"g1": {}, "g2": {}}
	release := make(chan struct{})
	mk := func(group string) *consumer.Consumer {
		return consumer.New(rdb, consumer.Config{
			Stream: s, Group: group, Consumer: group + "-c", Concurrency: 4,
			VisibilityTimeout: 10 * time.Second, Block: 100 * time.Millisecond, Logger: a21Discard,
		}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			books[group].add(group, j)
			if group == "g1" && j.Type == "long" {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}))
	}
	c1 := mk("g1")
	var stop1 func()
	n0 := 20
	if own {
		stop1 = a21Start(t, c1)
		a21Enqueue(t, rdb, s, "long")
		poll.Until(t, 30*time.Second, poll.True("long started", func() bool { return books["g1"].count(func(a21Run) bool { return true }) == 1 }))
		n0 = 1500
	}
	types := make([]string, n0)
	for i := range types {
		types[i] = "t"
	}
	a21Enqueue(t, rdb, s, types...)
	if !own {
		// One entry deleted by someone else before anyone read it.
		msgs, _ := rdb.XRevRangeN(ctx, s, "+", "-", 1).Result()
		if err := rdb.XDel(ctx, s, msgs[0].ID).Err(); err != nil {
			t.Fatal(err)
		}
		n0--
		stop1 = a21Start(t, c1)
	}
	poll.Until(t, 60*time.Second, func() (bool, string) {
		n := books["g1"].count(func(r a21Run) bool { return r.Type == "t" })
		l, _ := rdb.XLen(ctx, s).Result()
		ok := n == n0 && len(a21Pending(t, rdb, s, "g1")) == int(1-boolInt(!own))
		return ok, fmt.Sprintf("g1 ran %d of %d; XLEN %d", n, n0, l)
	})
	if l, _ := rdb.XLen(ctx, s).Result(); true {
		t.Logf("XLEN %d once g1 settled the first %d", l, n0)
	}
	if err := rdb.XGroupCreate(ctx, s, "g2", "0").Err(); err != nil {
		t.Fatal(err)
	}
	groups, _ := rdb.Do(ctx, "XINFO", "GROUPS", s).Result()
	t.Logf("XINFO GROUPS after g2 was created: %v", groups)
	later := a21Enqueue(t, rdb, s, make200()...)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := books["g1"].count(func(r a21Run) bool { return r.Type == "u" })
		return n == 200, fmt.Sprintf("g1 ran %d of the later 200", n)
	})
	time.Sleep(500 * time.Millisecond) // let any deletion land
	present := a21EntriesByJob(t, rdb, s)
	missing := 0
	for _, j := range later {
		if len(present[j.ID]) == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of the 200 later entries deleted after g1 settled them, before g2 (lag nil) read them", missing)
	}
	c2 := mk("g2")
	stop2 := a21Start(t, c2)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := 0
		got := map[string]bool{}
		for _, r := range books["g2"].snapshot() {
			got[r.JobID] = true
		}
		for _, j := range later {
			if got[j.ID] {
				n++
			}
		}
		return n == 200-missing, fmt.Sprintf("g2 got %d of the later 200", n)
	})
	close(release)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		l, _ := rdb.XLen(ctx, s).Result()
		p1, p2 := len(a21Pending(t, rdb, s, "g1")), len(a21Pending(t, rdb, s, "g2"))
		return l == 0 && p1 == 0 && p2 == 0, fmt.Sprintf("XLEN %d once both groups settled everything (want 0); pending g1 %d g2 %d", l, p1, p2)
	})
	stop1()
	stop2()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func make200() []string {
	out := make([]string, 200)
	for i := range out {
		out[i] = "u"
	}
	return out
}

// TestAttack21_RetentionAfterForeignXDEL: one group; 19 jobs, the newest
// entry deleted by someone else (XDEL, before any read). Once the 19 are
// settled and nothing else happens, the README says the stream holds
// unsettled work only: they must be deleted (no other group needs them).
//
// Catches: retention stalled by a group lag Redis cannot compute (nil: a
// tombstone after the group's position), until some later entry is read.
func TestAttack21_RetentionAfterForeignXDEL(t *testing.T) {
	rdb := redistest.Shared(t)
	s := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), s); redistest.DeleteKeys(rdb, "{"+s+"}:*") })
	ctx := context.Background()
	types := make([]string, 20)
	for i := range types {
		types[i] = "t"
	}
	a21Enqueue(t, rdb, s, types...)
	msgs, _ := rdb.XRevRangeN(ctx, s, "+", "-", 1).Result()
	if err := rdb.XDel(ctx, s, msgs[0].ID).Err(); err != nil {
		t.Fatal(err)
	}
	book := &a21Book{}
	c := consumer.New(rdb, consumer.Config{
		Stream: s, Group: "g", Consumer: "c", Concurrency: 4,
		VisibilityTimeout: 10 * time.Second, Block: 100 * time.Millisecond, Logger: a21Discard,
	}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error { book.add("c", j); return nil }))
	stop := a21Start(t, c)
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := book.count(func(a21Run) bool { return true })
		p := len(a21Pending(t, rdb, s, "g"))
		return n == 19 && p == 0, fmt.Sprintf("ran %d of 19, pending %d", n, p)
	})
	poll.Until(t, 20*time.Second, func() (bool, string) {
		l, _ := rdb.XLen(ctx, s).Result()
		return l == 0, fmt.Sprintf("XLEN %d with every entry settled by the only group, want 0", l)
	})
	stop()
}
