package consumer_test

// Outside tests of batched settlement (README "How it works" / Settlement,
// "Guarantees"; godoc of Config.OnDeadLetter, DeadLetterMaxLen,
// ShutdownTimeout, Stats): Redis full while retries and dead letters are
// queued, Redis restarted and its scripts flushed between batches, a batch
// with deleted and stolen entries, dead-letter trimming counted, shutdown
// flushing what is queued.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

type s11Spec struct {
	Fails  int  `json:"fails,omitempty"`
	Dead   bool `json:"dead,omitempty"`
	Snooze bool `json:"snooze,omitempty"`
	Gate   bool `json:"gate,omitempty"`
}

type s11Rig struct {
	t      *testing.T
	rdb    *redis.Client
	stream string
	keys   stream.Keys
	maxAtt int

	gate chan struct{}

	mu       sync.Mutex
	specs    map[string]s11Spec
	entryOf  map[string]string         // job -> its first entry
	starts   map[string]map[string]int // job -> entry -> attempt
	okAt     map[string][]int
	snoozeOn map[string]string // job -> the entry that snoozed
	odl      map[string][]string
	running  int
}

func newS11Rig(t *testing.T, rdb *redis.Client, maxAtt int) *s11Rig {
	name := redistest.Name(t)
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rdb.Del(context.Background(), keys.Stream)
		redistest.DeleteKeys(rdb, "{"+name+"}:*")
	})
	return &s11Rig{t: t, rdb: rdb, stream: name, keys: keys, maxAtt: maxAtt, gate: make(chan struct{}),
		specs: map[string]s11Spec{}, entryOf: map[string]string{}, starts: map[string]map[string]int{},
		okAt: map[string][]int{}, snoozeOn: map[string]string{}, odl: map[string][]string{}}
}

func (r *s11Rig) handler(ctx context.Context, job *stream.Job) error {
	var s s11Spec
	if err := job.Decode(&s); err != nil {
		return err
	}
	r.mu.Lock()
	if r.starts[job.ID] == nil {
		r.starts[job.ID] = map[string]int{}
	}
	r.starts[job.ID][job.EntryID] = job.Attempt
	r.running++
	r.mu.Unlock()
	defer func() { r.mu.Lock(); r.running--; r.mu.Unlock() }()
	if s.Gate {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	if s.Snooze && job.Attempt == 0 {
		r.mu.Lock()
		if r.snoozeOn[job.ID] == "" {
			r.snoozeOn[job.ID] = job.EntryID
		}
		snooze := r.snoozeOn[job.ID] == job.EntryID
		r.mu.Unlock()
		if snooze {
			return consumer.Snooze(10 * time.Millisecond)
		}
	}
	if s.Dead {
		return consumer.Dead("s11", errors.New("told to die"))
	}
	if job.Attempt < s.Fails {
		return consumer.Retry(10*time.Millisecond, fmt.Errorf("fail at %d", job.Attempt))
	}
	r.mu.Lock()
	r.okAt[job.ID] = append(r.okAt[job.ID], job.Attempt)
	r.mu.Unlock()
	return nil
}

func (r *s11Rig) config(cfg consumer.Config) consumer.Config {
	cfg.Stream, cfg.Group = r.stream, "g"
	if cfg.Consumer == "" {
		cfg.Consumer = "c1"
	}
	cfg.MaxAttempts = r.maxAtt
	if cfg.PromoteInterval == 0 {
		cfg.PromoteInterval = 20 * time.Millisecond
	}
	if cfg.Block == 0 {
		cfg.Block = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.OnDeadLetter = func(_ context.Context, d consumer.DeadLetter) {
		r.mu.Lock()
		defer r.mu.Unlock()
		id := ""
		if d.Job != nil {
			id = d.Job.ID
		}
		r.odl[id] = append(r.odl[id], d.DeadEntryID)
	}
	return cfg
}

// start runs a consumer until the test ends; it returns the consumer and a
// channel with Run's error.
func (r *s11Rig) start(rdb *redis.Client, cfg consumer.Config) (*consumer.Consumer, chan error) {
	c := consumer.New(rdb, r.config(cfg)).Handle(consumer.HandlerFunc(r.handler))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() { errc <- c.Run(ctx); close(done) }()
	r.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			r.t.Errorf("Run did not return")
		}
	})
	return c, errc
}

func (r *s11Rig) enqueue(specs ...s11Spec) []string {
	r.t.Helper()
	p := stream.NewProducer(r.rdb, stream.ProducerConfig{Stream: r.stream})
	jobs := make([]*stream.Job, len(specs))
	for i, s := range specs {
		j, err := stream.NewJSONJob("s11", s)
		if err != nil {
			r.t.Fatal(err)
		}
		jobs[i] = j
	}
	var ids []string
	var err error
	for try := 0; ; try++ {
		ids, err = p.EnqueueBatch(context.Background(), jobs)
		if err == nil {
			break
		}
		if try > 50 {
			r.t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // Redis restarting
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(jobs))
	for i, j := range jobs {
		r.specs[j.ID] = specs[i]
		r.entryOf[j.ID] = ids[i]
		out[i] = j.ID
	}
	return out
}

// mixed returns n job specs cycling through the outcomes.
func (r *s11Rig) mixed(n int, gate bool) []s11Spec {
	out := make([]s11Spec, n)
	for i := range out {
		s := s11Spec{Gate: gate, Snooze: i%5 == 4}
		switch i % 6 {
		case 1:
			s.Fails = 1
		case 2:
			s.Dead = true
		case 3:
			s.Fails = r.maxAtt // exhausted
		case 4:
			s.Fails = r.maxAtt - 1
		}
		out[i] = s
	}
	return out
}

func (r *s11Rig) isDead(s s11Spec) bool { return s.Dead || s.Fails >= r.maxAtt }

func (r *s11Rig) deadByJob() map[string][]redis.XMessage {
	msgs, _ := r.rdb.XRange(context.Background(), r.keys.Dead, "-", "+").Result()
	out := map[string][]redis.XMessage{}
	for _, m := range msgs {
		id, _ := m.Values["job_id"].(string)
		out[id] = append(out[id], m)
	}
	return out
}

// final reports whether every job has its outcome and nothing is pending
// or delayed.
func (r *s11Rig) final() (bool, string) {
	ctx := context.Background()
	p, err := r.rdb.XPending(ctx, r.stream, "g").Result()
	if err != nil {
		return false, fmt.Sprintf("XPENDING: %v", err)
	}
	delayed, err := r.rdb.ZCard(ctx, r.keys.Delayed).Result()
	if err != nil {
		return false, fmt.Sprintf("ZCARD: %v", err)
	}
	dead := r.deadByJob()
	r.mu.Lock()
	defer r.mu.Unlock()
	missing := 0
	for id, s := range r.specs {
		if r.isDead(s) {
			if len(dead[id]) == 0 {
				missing++
			}
		} else if len(r.okAt[id]) == 0 {
			missing++
		}
	}
	return p.Count == 0 && delayed == 0 && missing == 0,
		fmt.Sprintf("pending %d, delayed %d, jobs without outcome %d of %d", p.Count, delayed, missing, len(r.specs))
}

// verify checks each job of ids (all when nil): one entry per attempt (and
// per snooze), one outcome, one dead letter with its attempts, OnDeadLetter
// once per dead letter when odlExact.
func (r *s11Rig) verify(ids []string, odlExact bool) {
	r.t.Helper()
	dead := r.deadByJob()
	r.mu.Lock()
	defer r.mu.Unlock()
	if ids == nil {
		for id := range r.specs {
			ids = append(ids, id)
		}
	}
	bad := 0
	report := func(format string, args ...any) {
		bad++
		if bad <= 20 {
			r.t.Errorf(format, args...)
		}
	}
	for _, id := range ids {
		s := r.specs[id]
		want := s.Fails + 1
		if s.Dead {
			want = 1
		} else if s.Fails >= r.maxAtt {
			want = r.maxAtt
		}
		if s.Snooze {
			want++
		}
		if got := len(r.starts[id]); got != want {
			report("job %s (%+v): %d distinct entries ran, want %d (%v)", id, s, got, want, r.starts[id])
		}
		if r.isDead(s) {
			if len(dead[id]) != 1 {
				report("job %s (%+v): %d dead letters, want 1", id, s, len(dead[id]))
			}
			for _, m := range dead[id] {
				wantAtt := "1"
				if !s.Dead {
					wantAtt = strconv.Itoa(r.maxAtt)
				}
				if m.Values["dead_attempts"] != wantAtt {
					report("job %s (%+v): dead_attempts %v, want %s", id, s, m.Values["dead_attempts"], wantAtt)
				}
			}
			if n := len(r.odl[id]); n > len(dead[id]) || (odlExact && n != len(dead[id])) {
				report("job %s: OnDeadLetter called %d times for %d dead letters", id, n, len(dead[id]))
			}
			if len(r.okAt[id]) != 0 {
				report("job %s: dead and done", id)
			}
		} else {
			if len(dead[id]) != 0 {
				report("job %s (%+v): %d dead letters, want none", id, s, len(dead[id]))
			}
			if len(r.okAt[id]) == 0 {
				report("job %s (%+v): never done", id, s)
			}
		}
	}
	if bad > 0 {
		r.t.Errorf("%d problems over %d jobs", bad, len(ids))
	}
}

func (r *s11Rig) waitRunning(n int) {
	r.t.Helper()
	poll.Until(r.t, time.Minute, func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.running >= n, fmt.Sprintf("%d handlers running, want %d", r.running, n)
	})
}

func s11Info(t *testing.T, rdb *redis.Client, field string) int64 {
	t.Helper()
	s, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in INFO", field)
	return 0
}

// TestAttack11Settle_redisFullQueued: Redis fills up (maxmemory, noeviction)
// while 120 jobs are running; they then all return (retries, snoozes, dead
// letters, acks) while it is full. README "Redis full": settlements keep
// working. Memory is freed afterwards: every job ends once, nothing lost or
// doubled.
func TestAttack11Settle_redisFullQueued(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	ctx := context.Background()
	r := newS11Rig(t, rdb, 3)
	r.enqueue(r.mixed(120, true)...)
	c, _ := r.start(rdb, consumer.Config{Concurrency: 120, Prefetch: -1, VisibilityTimeout: time.Minute})
	r.waitRunning(120)

	used := s11Info(t, rdb, "used_memory")
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+2<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	junk := strings.Repeat("x", 64<<10)
	full := false
	for i := 0; i < 1000 && !full; i++ {
		if err := rdb.Set(ctx, "{"+r.stream+"}:junk:"+strconv.Itoa(i), junk, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			full = true
		}
	}
	if !full {
		t.Fatal("Redis never refused a write")
	}
	close(r.gate)
	// While full: the first attempts settle (acks, dead letters, retries
	// and snoozes rescheduled).
	poll.Until(t, time.Minute, func() (bool, string) {
		st := c.Stats()
		n := st.Acked + st.Retried + st.Snoozed + st.DeadLettered
		return n >= 120, fmt.Sprintf("settled %d of 120 first runs while full: %+v", n, st)
	})
	if err := rdb.Set(ctx, "{"+r.stream+"}:junk:probe", junk, 0).Err(); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Logf("Redis no longer full after the settlements (%v): settled entries freed memory", err)
	}
	redistest.DeleteKeys(rdb, "{"+r.stream+"}:junk:*")
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 2*time.Minute, r.final)
	r.verify(nil, true)
	t.Logf("stats %+v", c.Stats())
}

// TestAttack11Settle_scriptFlushAndRestart: while mixed jobs settle in
// batches, SCRIPT FLUSH runs every few milliseconds, and Redis (AOF always)
// is SIGKILLed and restarted twice. Nothing lost, nothing doubled.
func TestAttack11Settle_scriptFlushAndRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{AOF: "always"})
	rdb := srv.Client(t)
	admin := srv.Client(t)
	r := newS11Rig(t, rdb, 3)
	c, _ := r.start(rdb, consumer.Config{Concurrency: 20, VisibilityTimeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	flushes := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if admin.ScriptFlush(ctx).Err() == nil {
				flushes++
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()
	for round := 0; round < 6; round++ {
		r.enqueue(r.mixed(60, false)...)
		time.Sleep(150 * time.Millisecond)
		if round == 2 || round == 4 {
			srv.Kill9()
			srv.Restart()
		}
	}
	cancel()
	wg.Wait()
	poll.Until(t, 2*time.Minute, r.final)
	r.verify(nil, false)
	t.Logf("%d script flushes; stats %+v", flushes, c.Stats())
}

func s11Cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("redis-cli", append([]string{"-h", "127.0.0.1", "-p", strings.Split(redistest.Addr(), ":")[1]}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestAttack11Settle_mixedBatchDeletedStolen: 36 jobs run at once; while
// they run, redis-cli deletes 12 of their entries (XDEL) and claims 12 for
// a consumer "thief" (XCLAIM); then all return at once, so their
// settlements share batches. The untouched ones settle exactly once
// whatever the others do; the stolen ones are not settled by this consumer
// (no retry entry, no dead letter, still pending under the thief).
func TestAttack11Settle_mixedBatchDeletedStolen(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	r := newS11Rig(t, rdb, 3)
	var specs []s11Spec
	for i := 0; i < 36; i++ {
		s := s11Spec{Gate: true}
		switch i % 3 {
		case 1:
			s.Fails = 1
		case 2:
			s.Dead = true
		}
		specs = append(specs, s)
	}
	ids := r.enqueue(specs...)
	c, _ := r.start(rdb, consumer.Config{Concurrency: 36, Prefetch: -1, VisibilityTimeout: 5 * time.Minute})
	r.waitRunning(36)
	var untouched, deleted, stolen []string
	for i, id := range ids {
		switch (i / 3) % 3 { // each group gets every outcome
		case 0:
			untouched = append(untouched, id)
		case 1:
			deleted = append(deleted, id)
			s11Cli(t, "XDEL", r.stream, r.entryOf[id])
		case 2:
			stolen = append(stolen, id)
			s11Cli(t, "XCLAIM", r.stream, "g", "thief", "0", r.entryOf[id])
		}
	}
	close(r.gate)
	poll.Until(t, time.Minute, func() (bool, string) {
		// The untouched jobs reach their outcomes.
		dead := r.deadByJob()
		r.mu.Lock()
		defer r.mu.Unlock()
		n := 0
		for _, id := range untouched {
			if len(dead[id]) > 0 || len(r.okAt[id]) > 0 {
				n++
			}
		}
		return n == len(untouched), fmt.Sprintf("%d of %d untouched jobs done", n, len(untouched))
	})
	if err := c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	r.verify(untouched, true)
	dead := r.deadByJob()
	pend, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.stream, Group: "g", Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, p := range pend {
		owner[p.ID] = p.Consumer
	}
	r.mu.Lock()
	for _, id := range stolen {
		// okAt says the handler returned nil, not that the job was acked:
		// the thief's pending entry says that.
		if len(r.starts[id]) != 1 || len(dead[id]) != 0 || len(r.odl[id]) != 0 {
			t.Errorf("stolen job %s (%+v): settled by the consumer that lost it: %d entries ran, %d dead letters, %d OnDeadLetter calls",
				id, r.specs[id], len(r.starts[id]), len(dead[id]), len(r.odl[id]))
		}
		if owner[r.entryOf[id]] != "thief" {
			t.Errorf("stolen job %s: entry %s pending under %q, want thief", id, r.entryOf[id], owner[r.entryOf[id]])
		}
	}
	for _, id := range deleted {
		s := r.specs[id]
		t.Logf("deleted job (%+v): entries ran %d, dead letters %d, done %v, still pending under %q",
			s, len(r.starts[id]), len(dead[id]), r.okAt[id], owner[r.entryOf[id]])
		for _, m := range dead[id] {
			// The dead letter must carry the job (README: the entry's raw
			// fields), or a replay has nothing to run.
			if m.Values["job_id"] != id || m.Values["type"] != "s11" || m.Values["payload"] == nil {
				t.Errorf("deleted job %s: dead letter without the job's fields: %v", id, m.Values)
			}
		}
		if len(r.starts[id]) > 2 || len(dead[id]) > 1 || len(r.odl[id]) > len(dead[id]) {
			t.Errorf("deleted job %s (%+v): doubled: %d entries ran, %d dead letters, %d OnDeadLetter calls", id, s, len(r.starts[id]), len(dead[id]), len(r.odl[id]))
		}
	}
	r.mu.Unlock()
	st := c.Stats()
	if st.Stale != uint64(len(stolen)) {
		t.Errorf("Stats.Stale %d, want %d (the stolen entries' refused settlements)", st.Stale, len(stolen))
	}
	t.Logf("stats %+v", st)
}

// TestAttack11Settle_deadLetterMaxLen: 7 foreign entries already in the
// dead-letter stream, then 60 jobs die in batches under DeadLetterMaxLen 5.
// Config.DeadLetterMaxLen: exact bound, every removal counted in
// Stats.DeadTrimmed; OnDeadLetter once per dead letter with its own
// DeadEntryID.
func TestAttack11Settle_deadLetterMaxLen(t *testing.T) {
	rdb := redistest.Shared(t)
	ctx := context.Background()
	r := newS11Rig(t, rdb, 2)
	for i := 0; i < 7; i++ {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.keys.Dead, Values: []string{"foreign", strconv.Itoa(i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var specs []s11Spec
	for i := 0; i < 60; i++ {
		specs = append(specs, s11Spec{Gate: i < 30, Dead: i%2 == 0, Fails: 2 * (i % 2)})
	}
	r.enqueue(specs...)
	c, _ := r.start(rdb, consumer.Config{Concurrency: 30, Prefetch: -1, DeadLetterMaxLen: 5})
	r.waitRunning(30)
	close(r.gate)
	poll.Until(t, time.Minute, func() (bool, string) {
		st := c.Stats()
		return st.DeadLettered == 60, fmt.Sprintf("dead-lettered %d of 60", st.DeadLettered)
	})
	if err := c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := rdb.XLen(ctx, r.keys.Dead).Result()
	if err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if n != 5 {
		t.Errorf("dead-letter stream holds %d entries, want exactly 5", n)
	}
	if st.DeadTrimmed != 60+7-5 {
		t.Errorf("Stats.DeadTrimmed %d, want %d (60 dead letters + 7 foreign - 5 kept)", st.DeadTrimmed, 60+7-5)
	}
	r.mu.Lock()
	calls, ids := 0, map[string]bool{}
	for job, list := range r.odl {
		if len(list) != 1 {
			t.Errorf("job %s: OnDeadLetter called %d times", job, len(list))
		}
		for _, id := range list {
			if id == "" || ids[id] {
				t.Errorf("job %s: DeadEntryID %q empty or repeated", job, id)
			}
			ids[id] = true
			calls++
		}
	}
	r.mu.Unlock()
	if calls != 60 {
		t.Errorf("OnDeadLetter called %d times, want 60", calls)
	}
	kept, _ := rdb.XRange(ctx, r.keys.Dead, "-", "+").Result()
	for _, m := range kept {
		if !ids[m.ID] {
			t.Errorf("kept dead letter %s %v was not reported to OnDeadLetter", m.ID, m.Values)
		}
	}
	t.Logf("stats %+v", st)
}

// TestAttack11Settle_shutdownFlushes: 60 jobs run; Shutdown is called;
// then they all return (acks, retries, snoozes, dead letters) while Redis
// is frozen for a second, so their settlements are queued. Shutdown must
// settle every finished job before it returns (nothing finished left
// pending), within its deadline.
func TestAttack11Settle_shutdownFlushes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	ctx := context.Background()
	r := newS11Rig(t, rdb, 3)
	r.enqueue(r.mixed(60, true)...)
	c, errc := r.start(rdb, consumer.Config{Concurrency: 60, Prefetch: -1, VisibilityTimeout: time.Minute, SettleTimeout: 20 * time.Second})
	r.waitRunning(60)
	sctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- c.Shutdown(sctx) }()
	poll.Until(t, time.Minute, func() (bool, string) { return c.Health().Draining, "not draining" })
	srv.Stop()
	close(r.gate)
	time.Sleep(time.Second)
	srv.Cont()
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	<-errc
	p, err := rdb.XPending(ctx, r.stream, "g").Result()
	if err != nil {
		t.Fatal(err)
	}
	if p.Count != 0 {
		t.Errorf("%d finished jobs left pending after Shutdown", p.Count)
	}
	st := c.Stats()
	want := map[string]int{}
	for _, s := range r.mixed(60, true) {
		switch { // the first run's outcome
		case s.Snooze:
			want["snoozed"]++
		case s.Dead:
			want["dead"]++
		case s.Fails > 0:
			want["retried"]++
		default:
			want["acked"]++
		}
	}
	got := map[string]int{"acked": int(st.Acked), "retried": int(st.Retried), "snoozed": int(st.Snoozed), "dead": int(st.DeadLettered)}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("settled %v, want %v (stats %+v)", got, want, st)
	}
	delayed, _ := rdb.ZCard(ctx, r.keys.Delayed).Result()
	// Retries promoted before the promoter stopped wait in the stream, unread.
	if groups, err := rdb.XInfoGroups(ctx, r.stream).Result(); err == nil && len(groups) == 1 {
		unread, _ := rdb.XRange(ctx, r.stream, "("+groups[0].LastDeliveredID, "+").Result()
		delayed += int64(len(unread))
	}
	xlenDead, _ := rdb.XLen(ctx, r.keys.Dead).Result()
	if int(delayed) != want["retried"]+want["snoozed"] || int(xlenDead) != want["dead"] {
		t.Errorf("delayed %d (want %d), dead letters %d (want %d)", delayed, want["retried"]+want["snoozed"], xlenDead, want["dead"])
	}
	r.mu.Lock()
	calls := 0
	for _, l := range r.odl {
		calls += len(l)
	}
	r.mu.Unlock()
	if calls != want["dead"] {
		t.Errorf("OnDeadLetter called %d times, want %d", calls, want["dead"])
	}
}
