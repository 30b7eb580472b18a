package consumer_test

// Outside tests (issue 16) of consumer.Pool's shared reads: queues of one
// group and consumer name read by one blocking XREADGROUP (README "Many
// queues in one pool", docs/pool.md#reading).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// a16sLedger records every handler start (queue, payload, time) and every
// finished run, so tests count what ran in vs out.
type a16sLedger struct {
	mu     sync.Mutex
	starts []a16sStart
	done   map[string]int // stream/payload -> finished runs
}

type a16sStart struct {
	stream, payload string
	at              time.Time
}

func newA16sLedger() *a16sLedger { return &a16sLedger{done: map[string]int{}} }

func (l *a16sLedger) start(s, p string) {
	l.mu.Lock()
	l.starts = append(l.starts, a16sStart{s, p, time.Now()})
	l.mu.Unlock()
}

func (l *a16sLedger) finish(s, p string) {
	l.mu.Lock()
	l.done[s+"/"+p]++
	l.mu.Unlock()
}

func (l *a16sLedger) startedAt(s, p string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, st := range l.starts {
		if st.stream == s && st.payload == p {
			return st.at, true
		}
	}
	return time.Time{}, false
}

func (l *a16sLedger) doneCount(s, p string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done[s+"/"+p]
}

func (l *a16sLedger) startList() []a16sStart {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]a16sStart(nil), l.starts...)
}

// handler returns a handler that records the run and then calls work (if
// not nil) before finishing.
func (l *a16sLedger) handler(s string, work func(ctx context.Context, payload string) error) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		p := string(job.Payload)
		l.start(s, p)
		if work != nil {
			if err := work(ctx, p); err != nil {
				return err
			}
		}
		l.finish(s, p)
		return nil
	})
}

// a16sAdd enqueues payloads as raw XADDs (a minimal wire-format entry).
func a16sAdd(t testing.TB, rdb redis.UniversalClient, s string, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: s, Values: []any{"type", "t", "payload", p}}).Err(); err != nil {
			t.Fatalf("XADD %s %s: %v", s, p, err)
		}
	}
}

func a16sPayloads(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func a16sQuiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// a16sRun runs the pool in the background; the returned stop shuts it
// down and returns Run's error.
func a16sRun(t testing.TB, p *consumer.Pool) (stop func() error, done <-chan error) {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- p.Run(context.Background()) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = p.Shutdown(ctx)
			select {
			case err = <-ch:
			case <-time.After(30 * time.Second):
				err = errors.New("Run did not return 30s after Shutdown")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop, ch
}

func a16sWaitReady(t testing.TB, p *consumer.Pool) {
	t.Helper()
	poll.Until(t, 60*time.Second, func() (bool, string) {
		h := p.Health()
		return h.Ready, "pool not ready: " + h.Problem
	})
}

// a16sBlocked returns the IDs of the connections blocked in XREADGROUP on
// the server admin is connected to (CLIENT LIST: cmd=xreadgroup, flag b).
func a16sBlocked(t testing.TB, admin *redis.Client) []string {
	t.Helper()
	out, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	var ids []string
	for _, line := range strings.Split(out, "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				f[k] = v
			}
		}
		if f["cmd"] == "xreadgroup" && strings.Contains(f["flags"], "b") {
			ids = append(ids, f["id"])
		}
	}
	return ids
}

// --- the left-out queue's backlog must not wait for the block timeout ----

// a16sLeftOut runs the scenario of a queue left out of the shared read for
// lack of room: queue A (Max 1, no prefetch) runs a job that holds its only
// slot, so the shared read blocks for queue B alone; a2 is added to A
// meanwhile; when a1 ends, A has room again and a2 must be read without
// waiting for the blocked read's Block (20 s). It returns, per round, the
// time from a1's end to a2's start.
func a16sLeftOut(t *testing.T, rdb redis.UniversalClient, rounds int) []time.Duration {
	name := redistest.Name(t)
	sa, sb := name+":a", name+":b"
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	const block = 20 * time.Second
	led := newA16sLedger()
	release := make(chan struct{}, rounds)
	var ended sync.Map // payload -> time the hold ended
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Logger: a16sQuiet()})
	p.Add(consumer.Config{Stream: sa, Group: "g", Block: block, Prefetch: -1}, consumer.QueueOptions{Max: 1}).
		Handle(led.handler(sa, func(ctx context.Context, payload string) error {
			if strings.HasPrefix(payload, "hold") {
				<-release
				ended.Store(payload, time.Now())
			}
			return nil
		}))
	p.Add(consumer.Config{Stream: sb, Group: "g", Block: block}, consumer.QueueOptions{}).Handle(led.handler(sb, nil))
	stop, _ := a16sRun(t, p)
	a16sWaitReady(t, p)

	var lat []time.Duration
	for r := 0; r < rounds; r++ {
		hold, next, other := fmt.Sprintf("hold-%d", r), fmt.Sprintf("next-%d", r), fmt.Sprintf("b-%d", r)
		a16sAdd(t, rdb, sa, hold)
		poll.Until(t, 30*time.Second, func() (bool, string) {
			_, ok := led.startedAt(sa, hold)
			return ok, hold + " not started"
		})
		// Let the shared read be sent again without A (A has no room now).
		time.Sleep(200 * time.Millisecond)
		a16sAdd(t, rdb, sa, next)
		// B is still in the read: its job starts without waiting for Block.
		bAdded := time.Now()
		a16sAdd(t, rdb, sb, other)
		poll.Until(t, block/2, func() (bool, string) {
			_, ok := led.startedAt(sb, other)
			return ok, other + " of the queue with room not started within Block/2"
		})
		bAt, _ := led.startedAt(sb, other)
		time.Sleep(200 * time.Millisecond)
		if _, ok := led.startedAt(sa, next); ok {
			t.Fatalf("round %d: %s started while A's only slot was held (Max 1)", r, next)
		}
		release <- struct{}{}
		poll.Until(t, block/2, func() (bool, string) {
			_, ok := led.startedAt(sa, next)
			return ok, next + " (backlog of the queue that got room) not started within Block/2: it waited for the blocked read"
		})
		at, _ := led.startedAt(sa, next)
		e, _ := ended.Load(hold)
		lat = append(lat, at.Sub(e.(time.Time)))
		t.Logf("round %d: B's job started %v after its XADD; A's backlog started %v after A got room (Block %v)",
			r, bAt.Sub(bAdded).Round(time.Millisecond), at.Sub(e.(time.Time)).Round(time.Millisecond), block)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for r := 0; r < rounds; r++ {
		for _, k := range [][2]string{{sa, fmt.Sprintf("hold-%d", r)}, {sa, fmt.Sprintf("next-%d", r)}, {sb, fmt.Sprintf("b-%d", r)}} {
			if n := led.doneCount(k[0], k[1]); n != 1 {
				t.Errorf("%s %s finished %d times, want 1", k[0], k[1], n)
			}
		}
	}
	return lat
}

func TestAttack16Shared_leftOutQueueLatency(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	lat := a16sLeftOut(t, rdb, 5)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("latency from room to the backlog's start (sorted): %v", lat)
}

// Without CLIENT permission the shared read must fall back to bounded
// blocks (docs: 100 ms), so the left-out queue's backlog still does not wait
// for Block.
func TestAttack16Shared_leftOutNoClientPermission(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "noclient", "on", ">pw", "~*", "&*", "+@all", "-client").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t, func(o *redis.Options) { o.Username, o.Password = "noclient", "pw" })
	if err := rdb.Do(ctx, "CLIENT", "ID").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("precondition: CLIENT ID as noclient: %v, want NOPERM", err)
	}
	lat := a16sLeftOut(t, rdb, 3)
	t.Logf("latency without CLIENT UNBLOCK: %v", lat)
}

// --- connections actually used ------------------------------------------

// Five queues of group g1 (one read group), two of g2 (another) and one of g1
// under another consumer name (a third): exactly three blocked connections.
// Killing the blocked connections (CLIENT KILL) must not lose or double a job,
// and the reads come back to three blocked connections.
func TestAttack16Shared_connectionsAndClientKill(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	rdb := srv.Client(t)
	name := redistest.Name(t)
	led := newA16sLedger()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 8, Logger: a16sQuiet()})
	var streams []string
	add := func(s, group, cons string) {
		streams = append(streams, s)
		p.Add(consumer.Config{Stream: s, Group: group, Consumer: cons, Block: 5 * time.Second}, consumer.QueueOptions{}).Handle(led.handler(s, nil))
	}
	for i := 0; i < 5; i++ {
		add(fmt.Sprintf("%s:g1-%d", name, i), "g1", "c")
	}
	add(name+":g2-0", "g2", "c")
	add(name+":g2-1", "g2", "c")
	add(name+":g1-other", "g1", "other")
	stop, _ := a16sRun(t, p)
	a16sWaitReady(t, p)

	want := 3
	poll.Until(t, 30*time.Second, func() (bool, string) {
		ids := a16sBlocked(t, admin)
		return len(ids) == want, fmt.Sprintf("%d blocked XREADGROUP connections, want %d (one per read group)", len(ids), want)
	})
	// It stays at three (no extra reads appear over a few Blocks' worth of idle time).
	for i := 0; i < 10; i++ {
		time.Sleep(100 * time.Millisecond)
		if ids := a16sBlocked(t, admin); len(ids) > want {
			t.Fatalf("%d blocked XREADGROUP connections (%v), want at most %d", len(ids), ids, want)
		}
	}
	n := 0
	for round := 0; round < 3; round++ {
		ids := a16sBlocked(t, admin)
		for _, id := range ids {
			if err := admin.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Logf("CLIENT KILL ID %s: %v", id, err)
			}
		}
		for _, s := range streams {
			a16sAdd(t, rdb, s, fmt.Sprintf("r%d", round))
			n++
		}
		poll.Until(t, 60*time.Second, func() (bool, string) {
			for _, s := range streams {
				if led.doneCount(s, fmt.Sprintf("r%d", round)) == 0 {
					return false, fmt.Sprintf("round %d: %s's job not done after CLIENT KILL of the blocked reads", round, s)
				}
			}
			return true, ""
		})
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		ids := a16sBlocked(t, admin)
		return len(ids) == want, fmt.Sprintf("after the kills: %d blocked XREADGROUP connections, want %d", len(ids), want)
	})
	list, _ := admin.ClientList(context.Background()).Result()
	t.Logf("connections on the server (admin included): %d", strings.Count(strings.TrimSpace(list), "\n")+1)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, s := range streams {
		for round := 0; round < 3; round++ {
			if c := led.doneCount(s, fmt.Sprintf("r%d", round)); c != 1 {
				t.Errorf("%s r%d done %d times, want 1", s, round, c)
			}
		}
	}
}

// --- PoolSize rule, before Redis is touched ------------------------------

func TestAttack16Shared_poolSizeRefusedBeforeRedis(t *testing.T) {
	t.Parallel()
	// A port that nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	h := func() consumer.Handler {
		return consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	}
	cases := []struct {
		name     string
		poolSize int
		queues   [][2]string // group, consumer
		refused  bool
	}{
		{"one group, PoolSize 1", 1, [][2]string{{"g", "c"}, {"g", "c"}, {"g", "c"}}, true},
		{"one group, PoolSize 2", 2, [][2]string{{"g", "c"}, {"g", "c"}, {"g", "c"}}, false},
		{"two groups, PoolSize 3", 3, [][2]string{{"g1", "c"}, {"g2", "c"}, {"g1", "c"}}, true},
		{"two consumer names, PoolSize 3", 3, [][2]string{{"g", "c1"}, {"g", "c2"}}, true},
		{"two groups, PoolSize 4", 4, [][2]string{{"g1", "c"}, {"g2", "c"}}, false},
		{"default consumer name, PoolSize 1", 1, [][2]string{{"g", ""}, {"g", ""}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var dials atomic.Int64
			rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: tc.poolSize, MaxRetries: -1,
				Dialer: func(ctx context.Context, network, a string) (net.Conn, error) {
					dials.Add(1)
					return (&net.Dialer{}).DialContext(ctx, network, a)
				}})
			defer rdb.Close()
			p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Logger: a16sQuiet()})
			for i, q := range tc.queues {
				p.Add(consumer.Config{Stream: fmt.Sprintf("s%d", i), Group: q[0], Consumer: q[1], StartTimeout: -1}, consumer.QueueOptions{}).Handle(h())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := p.Run(ctx)
			t.Logf("Run: %v (dials %d)", err, dials.Load())
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "PoolSize") {
					t.Fatalf("Run = %v, want an error naming PoolSize", err)
				}
				if d := dials.Load(); d != 0 {
					t.Fatalf("Run dialled Redis %d times before refusing the PoolSize", d)
				}
			} else if err != nil && strings.Contains(err.Error(), "PoolSize") {
				t.Fatalf("Run refused PoolSize %d for %d read groups: %v", tc.poolSize, len(tc.queues), err)
			}
		})
	}
}

// --- weights and strict priority with shared reads ------------------------

func TestAttack16Shared_weightedShared(t *testing.T) {
	t.Parallel()
	for _, small := range []bool{false, true} {
		t.Run(fmt.Sprintf("lowQueueNoPrefetch=%v", small), func(t *testing.T) {
			// Starts follow the weights only while every queue has jobs read
			// (the docs: a queue whose reads fall behind leaves gaps that the
			// others fill). On a loaded machine reads fall behind 5 ms jobs
			// (seen beside busy loops: 528/316/156, and 350/328/322 with the
			// default Prefetch): a run off the weights is run again with
			// jobs four times as long, up to 80 ms, where a read has a
			// hundred times longer to come back; wrong weights stay wrong.
			redistest.Widen(t, "job", 5*time.Millisecond, func(t *testing.T, job time.Duration) time.Duration {
				return a16sWeighted(t, small, job)
			})
		})
	}
}

func a16sWeighted(t *testing.T, small bool, job time.Duration) (wider time.Duration) {
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	weights := []int{6, 3, 1}
	led := newA16sLedger()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2, Logger: a16sQuiet()})
	var streams []string
	for i, w := range weights {
		s := fmt.Sprintf("%s:w%d", name, w)
		streams = append(streams, s)
		a16sAdd(t, rdb, s, a16sPayloads("j", 700)...)
		// An explicit Prefetch, as the docs advise for short jobs: the
		// default one holds only a few ms of jobs, and on a loaded
		// machine the queues' reads then fall behind and each start
		// goes to whichever queue has a job read (seen: 350/328/322
		// beside busy loops, with and without shared reads).
		cfg := consumer.Config{Stream: s, Group: "g", Prefetch: a16sPrefetch}
		opts := consumer.QueueOptions{Weight: w}
		if small && i == 2 {
			// The smallest room in the read: COUNT is the smallest room
			// of the queues read together.
			cfg.Prefetch = -1
			opts.Max = 1
		}
		p.Add(cfg, opts).Handle(led.handler(s, func(ctx context.Context, _ string) error {
			time.Sleep(job)
			return nil
		}))
	}
	a16sRunUntil(t, p, led, 1050)
	st := led.startList()[50:1050]
	count := map[string]int{}
	for _, s := range st {
		count[s.stream]++
	}
	t.Logf("starts 50..1050: w6 %d, w3 %d, w1 %d (want 600/300/100)", count[streams[0]], count[streams[1]], count[streams[2]])
	var off []string
	for i, w := range weights {
		want := 1000 * w / 10
		if got := count[streams[i]]; got < want*85/100 || got > want*115/100+5 {
			off = append(off, fmt.Sprintf("weight %d: %d of 1000 starts, want about %d", w, got, want))
		}
	}
	if len(off) > 0 && job < 80*time.Millisecond {
		t.Logf("off the weights with %v jobs: run again with longer jobs", job)
		return 4 * job
	}
	for _, e := range off {
		t.Error(e)
	}
	return 0
}

func TestAttack16Shared_strictShared(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			// A queue whose reads fall behind leaves gaps the docs allow: a
			// run in which the process or Redis stalled for longer than the
			// prefetched jobs last checked nothing, and runs again with
			// longer jobs.
			redistest.Widen(t, "job", 5*time.Millisecond, func(t *testing.T, job time.Duration) time.Duration {
				return a16sStrict(t, shared, job)
			})
		})
	}
}

// a16sPrefetch is explicit: with the default (adaptive) Prefetch, a queue
// whose jobs have not run yet reads a few entries at a time, and the docs
// allow the gaps that leaves ("give such a queue a larger Prefetch"). Measured
// with the default: 13 to 21 p1 starts while p2 was backlogged shared, 1
// unshared (one consumer name per queue).
var a16sPrefetch = 50

func a16sStrict(t *testing.T, shared bool, job time.Duration) (wider time.Duration) {
	rdb := redistest.Shared(t)
	watch := redistest.WatchStalls(rdb, 10*time.Millisecond)
	defer watch.Stop()
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	led := newA16sLedger()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2, Strict: true, Logger: a16sQuiet()})
	prio := []int{3, 2, 1}
	var streams []string
	for _, pr := range prio {
		s := fmt.Sprintf("%s:p%d", name, pr)
		streams = append(streams, s)
		a16sAdd(t, rdb, s, a16sPayloads("j", 300)...)
		cfg := consumer.Config{Stream: s, Group: "g", Consumer: "c", Prefetch: a16sPrefetch}
		if !shared {
			// A consumer name each: one read group per queue (the control).
			cfg.Consumer = fmt.Sprintf("c%d", pr)
		}
		p.Add(cfg, consumer.QueueOptions{Priority: pr}).Handle(led.handler(s, func(ctx context.Context, _ string) error {
			time.Sleep(job)
			return nil
		}))
	}
	a16sRunUntil(t, p, led, 900)
	st := led.startList()
	// Index of the last start of each queue.
	last := map[string]int{}
	for i, s := range st {
		last[s.stream] = i
	}
	lower := 0
	var topWhere []string
	for i := 20; i < last[streams[0]]; i++ {
		if st[i].stream != streams[0] {
			lower++
			topWhere = append(topWhere, fmt.Sprintf("%d:%s@%v", i, st[i].stream[len(st[i].stream)-2:], st[i].at.Sub(st[0].at).Round(time.Millisecond)))
		}
	}
	t.Logf("lower starts while p3 had a backlog: %v", topWhere)
	midLower := 0
	var where []int
	for i := last[streams[0]] + 2; i < last[streams[1]]; i++ {
		if st[i].stream == streams[2] {
			midLower++
			where = append(where, i)
		}
	}
	t.Logf("p1 starts at %v", where)
	t.Logf("lower-priority starts while p3 had a backlog: %d; p1 starts while p2 had one: %d; last starts: %v", lower, midLower, last)
	// Prefetch jobs of a queue last Prefetch*job/Concurrency: a stall of
	// half that can empty its queue before its next read answers.
	if budget := time.Duration(a16sPrefetch) * job / 2 / 2; (lower > 5 || midLower > 5) && watch.Longest() > budget {
		t.Logf("a stall of %v (over %v) broke the precondition: run again with longer jobs", watch.Longest(), budget)
		return 4 * job
	}
	if lower > 5 || midLower > 5 {
		t.Errorf("strict priority with shared reads: %d lower starts while the top queue was backlogged, %d p1 starts while p2 was", lower, midLower)
	}
	for _, s := range streams {
		for _, pl := range a16sPayloads("j", 300) {
			if c := led.doneCount(s, pl); c != 1 {
				t.Fatalf("%s %s done %d times, want 1", s, pl, c)
			}
		}
	}
	return 0
}

// --- hostile keys and entries under the shared read -----------------------

// A stream deleted, a group destroyed and hostile entries, while the shared
// read blocks: the other queues keep their jobs flowing, and the damaged
// queue resumes (its group recreated from 0).
func TestAttack16Shared_hostileUnderSharedRead(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	led := newA16sLedger()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Logger: a16sQuiet()})
	s := []string{name + ":a", name + ":b", name + ":c"}
	var qs []*consumer.Queue
	for _, st := range s {
		qs = append(qs, p.Add(consumer.Config{Stream: st, Group: "g", Block: 5 * time.Second}, consumer.QueueOptions{}).Handle(led.handler(st, nil)))
	}
	stop, _ := a16sRun(t, p)
	a16sWaitReady(t, p)
	waitDone := func(what string, keys ...[2]string) {
		t.Helper()
		poll.Until(t, 60*time.Second, func() (bool, string) {
			for _, k := range keys {
				if led.doneCount(k[0], k[1]) == 0 {
					return false, what + ": " + k[0] + " " + k[1] + " not done"
				}
			}
			return true, ""
		})
	}
	for _, st := range s {
		a16sAdd(t, rdb, st, "first")
	}
	waitDone("first", [2]string{s[0], "first"}, [2]string{s[1], "first"}, [2]string{s[2], "first"})
	time.Sleep(300 * time.Millisecond) // the shared read blocks again

	// 1. Stream a deleted under the blocked read.
	if err := rdb.Del(ctx, s[0]).Err(); err != nil {
		t.Fatal(err)
	}
	a16sAdd(t, rdb, s[1], "after-del")
	a16sAdd(t, rdb, s[2], "after-del")
	waitDone("other queues after DEL of a", [2]string{s[1], "after-del"}, [2]string{s[2], "after-del"})
	a16sAdd(t, rdb, s[0], "after-del")
	waitDone("a after its stream was deleted", [2]string{s[0], "after-del"})
	time.Sleep(300 * time.Millisecond)

	// 2. Group of b destroyed under the blocked read.
	if err := rdb.XGroupDestroy(ctx, s[1], "g").Err(); err != nil {
		t.Fatal(err)
	}
	a16sAdd(t, rdb, s[0], "after-destroy")
	a16sAdd(t, rdb, s[2], "after-destroy")
	waitDone("other queues after XGROUP DESTROY of b", [2]string{s[0], "after-destroy"}, [2]string{s[2], "after-destroy"})
	a16sAdd(t, rdb, s[1], "after-destroy")
	waitDone("b after its group was destroyed", [2]string{s[1], "after-destroy"})

	// 3. Hostile entries in c; a and b keep going, c's good jobs run once.
	hostile := [][]any{
		{"garbage", "x"},
		{"type", ""},
		{"v", "999", "type", "t", "payload", "vbad"},
		{"type", "t", "payload", "p", "attempt", "-5"},
		{"type", "t", "created_at", "not-a-time", "payload", "cbad"},
		{"type", strings.Repeat("T", 70000), "payload", "longtype"},
	}
	many := []any{"type", "t", "payload", "many"}
	for i := 0; i < 1500; i++ {
		many = append(many, fmt.Sprintf("f%d", i), "v")
	}
	hostile = append(hostile, many)
	for i, vals := range hostile {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s[2], Values: vals}).Err(); err != nil {
			t.Fatalf("hostile %d: %v", i, err)
		}
		a16sAdd(t, rdb, s[0], fmt.Sprintf("beside-%d", i))
	}
	a16sAdd(t, rdb, s[2], "good-after")
	a16sAdd(t, rdb, s[1], "good-after")
	waitDone("after hostile entries in c", [2]string{s[2], "good-after"}, [2]string{s[1], "good-after"}, [2]string{s[0], fmt.Sprintf("beside-%d", len(hostile)-1)})
	keys, _ := stream.KeysFor(s[2])
	poll.Until(t, 60*time.Second, func() (bool, string) {
		pend, err := rdb.XPending(ctx, s[2], "g").Result()
		if err != nil {
			return false, err.Error()
		}
		return pend.Count == 0, fmt.Sprintf("%d pending in c", pend.Count)
	})
	nDead, _ := rdb.XLen(ctx, keys.Dead).Result()
	st := qs[2].Stats()
	t.Logf("c: dead-letter stream %d entries; stats acked %d dead %d; done in c: %v", nDead, st.Acked, st.DeadLettered, led.done)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for k, n := range led.done {
		if n != 1 {
			t.Errorf("%s done %d times, want 1", k, n)
		}
	}
	for i := 0; i < len(hostile); i++ {
		if led.doneCount(s[0], fmt.Sprintf("beside-%d", i)) != 1 {
			t.Errorf("a beside-%d not done once", i)
		}
	}
	// Every hostile entry ended somewhere: run (decoded) or dead-lettered.
	ran := 0
	for _, pl := range []string{"vbad", "p", "cbad", "longtype", "many"} {
		ran += led.doneCount(s[2], pl)
	}
	if int(nDead)+ran < len(hostile) {
		t.Errorf("hostile entries in c: %d dead-lettered + %d run < %d written", nDead, ran, len(hostile))
	}
	for i, q := range qs {
		if e := q.Stats().ReadErrors; e > 0 {
			t.Logf("queue %d read errors: %d", i, e)
		}
	}
	// c's stream and group were never touched: the NOGROUPs of a and b are
	// theirs alone (docs/pool.md#reading).
	if e := qs[2].Stats().ReadErrors; e != 0 {
		t.Errorf("c (untouched) has %d read errors from the other queues' deleted stream and destroyed group", e)
	}
}

// A queue's stream key replaced by a key of another type (WRONGTYPE for the
// whole multi-stream XREADGROUP): the queue whose key is wrong may fail, but
// the other queues of its read group must not be starved silently while the
// pool runs on; if the pool stops, its error must name the wrong stream.
func TestAttack16Shared_wrongTypeKey(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	led := newA16sLedger()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Logger: a16sQuiet()})
	sa, sb := name+":a", name+":b"
	qa := p.Add(consumer.Config{Stream: sa, Group: "g", Block: 2 * time.Second}, consumer.QueueOptions{}).Handle(led.handler(sa, nil))
	qb := p.Add(consumer.Config{Stream: sb, Group: "g", Block: 2 * time.Second}, consumer.QueueOptions{}).Handle(led.handler(sb, nil))
	stop, done := a16sRun(t, p)
	a16sWaitReady(t, p)
	a16sAdd(t, rdb, sa, "first")
	a16sAdd(t, rdb, sb, "first")
	poll.Until(t, 30*time.Second, func() (bool, string) {
		return led.doneCount(sa, "first") == 1 && led.doneCount(sb, "first") == 1, "first jobs not done"
	})
	time.Sleep(300 * time.Millisecond)
	if err := rdb.Del(ctx, sa).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, sa, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	a16sAdd(t, rdb, sb, "after")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if led.doneCount(sb, "after") > 0 {
			// b keeps being served over several of a's failing reads.
			notReadyA, notReadyB, probes := 0, 0, 0
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				probes++
				if h := qa.Health(); !h.Ready {
					notReadyA++
				}
				if h := qb.Health(); !h.Ready {
					notReadyB++
				}
			}
			t.Logf("while a's key is a string: a not ready in %d of %d probes, b in %d", notReadyA, probes, notReadyB)
			a16sAdd(t, rdb, sb, "after2")
			poll.Until(t, 30*time.Second, func() (bool, string) {
				return led.doneCount(sb, "after2") == 1, "b's second job not done while a's key is a string"
			})
			t.Logf("b served while a's key is a string; pool problem %q, a's read errors %d, b's %d",
				p.Health().Problem, qa.Stats().ReadErrors, qb.Stats().ReadErrors)
			// a is repaired: its queue resumes.
			if err := rdb.Del(ctx, sa).Err(); err != nil {
				t.Fatal(err)
			}
			a16sAdd(t, rdb, sa, "repaired")
			poll.Until(t, 60*time.Second, func() (bool, string) {
				return led.doneCount(sa, "repaired") == 1, "a's job not done after its key was repaired"
			})
			if err := stop(); err != nil {
				t.Logf("Run: %v", err)
			}
			return
		}
		select {
		case err := <-done:
			t.Logf("pool Run returned: %v", err)
			if err == nil || !strings.Contains(err.Error(), sa) || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("pool stopped with %v: want an error naming %s and WRONGTYPE", err, sa)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	h := p.Health()
	t.Fatalf("30s after a's key became a string: b's job not run, pool still running (b read errors %d, problem %q)",
		qb.Stats().ReadErrors, h.Problem)
}

// --- Redis restarted -------------------------------------------------------

func TestAttack16Shared_redisRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	rdb := srv.Client(t)
	name := redistest.Name(t)
	led := newA16sLedger()
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Logger: a16sQuiet()})
	var streams []string
	for i := 0; i < 3; i++ {
		s := fmt.Sprintf("%s:%d", name, i)
		streams = append(streams, s)
		p.Add(consumer.Config{Stream: s, Group: "g", Block: 3 * time.Second}, consumer.QueueOptions{}).Handle(led.handler(s, nil))
	}
	stop, _ := a16sRun(t, p)
	a16sWaitReady(t, p)
	for round := 0; round < 2; round++ {
		tag := "r" + strconv.Itoa(round)
		for _, s := range streams {
			a16sAdd(t, rdb, s, tag)
		}
		poll.Until(t, 60*time.Second, func() (bool, string) {
			for _, s := range streams {
				if led.doneCount(s, tag) == 0 {
					return false, s + " " + tag + " not done"
				}
			}
			return true, ""
		})
		poll.Until(t, 30*time.Second, func() (bool, string) {
			n := len(a16sBlocked(t, admin))
			return n == 1, fmt.Sprintf("%d blocked reads, want 1", n)
		})
		srv.Kill9()
		srv.Restart()
	}
	for _, s := range streams {
		// XADD may meet a connection broken by the restart: retry.
		poll.Until(t, 30*time.Second, func() (bool, string) {
			err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: s, Values: []any{"type", "t", "payload", "final"}}).Err()
			return err == nil, fmt.Sprint(err)
		})
	}
	poll.Until(t, 60*time.Second, func() (bool, string) {
		for _, s := range streams {
			if led.doneCount(s, "final") == 0 {
				return false, s + " final not done after the restart"
			}
		}
		return true, ""
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for k, n := range led.done {
		if n != 1 {
			t.Errorf("%s done %d times, want 1", k, n)
		}
	}
}

// --- Redis Cluster: one tag, slot migrating, master killed ---------------

func a16sKeySlot(t testing.TB, c *redis.ClusterClient, key string) int64 {
	t.Helper()
	n, err := c.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// a16sOwner returns the address of the master owning slot.
func a16sOwner(t testing.TB, c *redis.ClusterClient, slot int64) string {
	t.Helper()
	slots, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			return s.Nodes[0].Addr
		}
	}
	t.Fatalf("no owner of slot %d", slot)
	return ""
}

func a16sCli(t testing.TB, addr string, args ...string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Three queues under one tag share a read on their slot's master; the slot
// is migrated key by key (MIGRATING/IMPORTING, ASK and TRYAGAIN in
// between) while jobs keep coming, then assigned to the new master: every job
// runs once, and the read ends up blocking on the new master.
func TestAttack16Shared_clusterSlotMigrates(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	ctx := context.Background()
	tag := "{" + redistest.Name(t) + "}"
	streams := []string{tag + ":a", tag + ":b", tag + ":c"}
	slot := a16sKeySlot(t, c, streams[0])
	src := a16sOwner(t, c, slot)
	var dst string
	for _, a := range cl.Addrs() {
		if a != src {
			dst = a
			break
		}
	}
	led := newA16sLedger()
	p := consumer.NewPool(c, consumer.PoolConfig{Concurrency: 4, Logger: a16sQuiet()})
	for _, s := range streams {
		p.Add(consumer.Config{Stream: s, Group: "g", Block: 3 * time.Second}, consumer.QueueOptions{}).Handle(led.handler(s, nil))
	}
	stop, _ := a16sRun(t, p)
	a16sWaitReady(t, p)
	var all [][2]string
	enqueue := func(tag string) {
		for _, s := range streams {
			poll.Until(t, 30*time.Second, func() (bool, string) {
				err := c.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "t", "payload", tag}}).Err()
				return err == nil, fmt.Sprintf("XADD %s: %v", s, err)
			})
			all = append(all, [2]string{s, tag})
		}
	}
	waitAll := func(what string) {
		poll.Until(t, 90*time.Second, func() (bool, string) {
			for _, k := range all {
				if led.doneCount(k[0], k[1]) == 0 {
					return false, what + ": " + k[0] + " " + k[1] + " not done"
				}
			}
			return true, ""
		})
	}
	enqueue("before")
	waitAll("before the migration")
	blockedOn := func(addr string) int {
		cli := redis.NewClient(&redis.Options{Addr: addr})
		defer cli.Close()
		return len(a16sBlocked(t, cli))
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := blockedOn(src)
		return n == 1, fmt.Sprintf("%d blocked reads on the source master, want 1", n)
	})
	srcID := a16sCli(t, src, "CLUSTER", "MYID")
	dstID := a16sCli(t, dst, "CLUSTER", "MYID")
	ss := strconv.FormatInt(slot, 10)
	a16sCli(t, dst, "CLUSTER", "SETSLOT", ss, "IMPORTING", srcID)
	a16sCli(t, src, "CLUSTER", "SETSLOT", ss, "MIGRATING", dstID)
	enqueue("migrating")
	host, port, _ := net.SplitHostPort(dst)
	keys := strings.Fields(a16sCli(t, src, "CLUSTER", "GETKEYSINSLOT", ss, "1000"))
	t.Logf("slot %d: %d keys to move from %s to %s", slot, len(keys), src, dst)
	for i, k := range keys {
		a16sCli(t, src, "MIGRATE", host, port, k, "0", "5000")
		enqueue(fmt.Sprintf("mid-%d", i))
		time.Sleep(300 * time.Millisecond)
	}
	// Keys created meanwhile on the source (ASK sends new keys to the target,
	// but check) are moved too.
	for _, k := range strings.Fields(a16sCli(t, src, "CLUSTER", "GETKEYSINSLOT", ss, "1000")) {
		a16sCli(t, src, "MIGRATE", host, port, k, "0", "5000")
	}
	for _, a := range cl.Addrs() {
		a16sCli(t, a, "CLUSTER", "SETSLOT", ss, "NODE", dstID)
	}
	enqueue("after")
	waitAll("after the migration")
	poll.Until(t, 30*time.Second, func() (bool, string) {
		n := blockedOn(dst)
		return n == 1, fmt.Sprintf("%d blocked reads on the new master, want 1", n)
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, k := range all {
		if n := led.doneCount(k[0], k[1]); n != 1 {
			t.Errorf("%s %s done %d times, want 1", k[0], k[1], n)
		}
	}
}

// The master of a tag's slot killed (a replica takes over): the queues under
// the tag resume on the new master; a queue on another master is not
// stopped by the other read group's failure.
func TestAttack16Shared_clusterMasterKilled(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterReplicas(t, 3, 1)
	c := cl.Client(t, func(o *redis.ClusterOptions) {
		o.ClusterStateReloadInterval = 500 * time.Millisecond
		o.MaxRetries = 1
		o.DialTimeout = time.Second
		o.ReadTimeout = 2 * time.Second
	})
	ctx := context.Background()
	base := redistest.Name(t)
	tag := "{" + base + "}"
	tagged := []string{tag + ":a", tag + ":b", tag + ":c"}
	slot := a16sKeySlot(t, c, tagged[0])
	owner := a16sOwner(t, c, slot)
	// A stream whose slot is on another master.
	var other string
	for i := 0; i < 1000; i++ {
		s := fmt.Sprintf("%s:other%d", base, i)
		if a16sOwner(t, c, a16sKeySlot(t, c, s)) != owner {
			other = s
			break
		}
	}
	led := newA16sLedger()
	p := consumer.NewPool(c, consumer.PoolConfig{Concurrency: 4, Logger: a16sQuiet()})
	for _, s := range append(append([]string(nil), tagged...), other) {
		p.Add(consumer.Config{Stream: s, Group: "g", Block: 2 * time.Second}, consumer.QueueOptions{}).Handle(led.handler(s, nil))
	}
	stop, _ := a16sRun(t, p)
	a16sWaitReady(t, p)
	add := func(s, pl string) {
		poll.Until(t, 60*time.Second, func() (bool, string) {
			err := c.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "t", "payload", pl}}).Err()
			return err == nil, fmt.Sprintf("XADD %s: %v", s, err)
		})
	}
	for _, s := range append(append([]string(nil), tagged...), other) {
		add(s, "before")
	}
	poll.Until(t, 60*time.Second, func() (bool, string) {
		for _, s := range append(append([]string(nil), tagged...), other) {
			if led.doneCount(s, "before") == 0 {
				return false, s + " before not done"
			}
		}
		return true, ""
	})
	var master *redistest.Server
	for _, m := range cl.Masters() {
		if m.Addr() == owner {
			master = m
		}
	}
	if master == nil {
		t.Fatalf("no server for %s", owner)
	}
	// While the failover runs, the other master's queue keeps working.
	stopOther := make(chan struct{})
	otherDone := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stopOther:
				otherDone <- n
				return
			default:
			}
			if c.XAdd(ctx, &redis.XAddArgs{Stream: other, Values: []any{"type", "t", "payload", fmt.Sprintf("during-%d", n)}}).Err() == nil {
				n++
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	cl.KillMaster(master)
	close(stopOther)
	nOther := <-otherDone
	for _, s := range tagged {
		add(s, "after")
	}
	add(other, "after")
	poll.Until(t, 90*time.Second, func() (bool, string) {
		for _, s := range append(append([]string(nil), tagged...), other) {
			if led.doneCount(s, "after") == 0 {
				return false, s + " after not done after the failover"
			}
		}
		for i := 0; i < nOther; i++ {
			if led.doneCount(other, fmt.Sprintf("during-%d", i)) == 0 {
				return false, fmt.Sprintf("other during-%d not done", i)
			}
		}
		return true, ""
	})
	if err := stop(); err != nil {
		t.Logf("Run: %v", err)
	}
	// Jobs settled before the kill may come back (replication is
	// asynchronous); those added after it must run once.
	for _, s := range append(append([]string(nil), tagged...), other) {
		if n := led.doneCount(s, "after"); n != 1 {
			t.Errorf("%s after done %d times, want 1", s, n)
		}
	}
	for k, n := range led.done {
		if n != 1 {
			t.Logf("%s done %d times", k, n)
		}
	}
	t.Logf("other master's queue: %d jobs enqueued during the failover, all done", nOther)
}

// a16sRunUntil runs p until led has recorded n starts, then stops it.
func a16sRunUntil(t *testing.T, p *consumer.Pool, led *a16sLedger, n int) {
	t.Helper()
	stop, _ := a16sRun(t, p)
	poll.Until(t, 300*time.Second, func() (bool, string) {
		got := len(led.startList())
		return got >= n, fmt.Sprintf("%d starts of %d", got, n)
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
