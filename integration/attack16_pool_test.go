package integration

// Outside tests of consumer.Pool across processes (attack16): a pool process
// SIGKILLed, SIGSTOPped past the visibility timeout, or SIGTERMed, and a
// second pool process that takes its streams over. Written from the README,
// docs/pool.md and the godoc only.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func init() { subprocessModes["attack16pool"] = a16PoolMain }

// a16PoolMain runs one consumer.Pool over the streams in A16_STREAMS
// (comma-separated, weights in A16_WEIGHTS) with the harness's behaviour
// handler and ledger (the ledger's consumer column is A16_CONSUMER).
func a16PoolMain() int {
	env := os.Getenv
	dur := func(k string) time.Duration { d, _ := time.ParseDuration(env(k)); return d }
	num := func(k string) int { n, _ := strconv.Atoi(env(k)); return n }
	me := env("A16_CONSUMER")
	ledger, err := os.OpenFile(env("A16_LEDGER"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	record := func(event string, job *stream.Job) {
		fmt.Fprintf(ledger, "%s %s %s %s %d %d %d\n", event, job.ID, job.EntryID, me, job.Deliveries, job.Attempt, time.Now().UnixNano())
	}
	rdb := redis.NewClient(&redis.Options{Addr: env("A16_ADDR"), MaxRetries: -1, PoolSize: 40})
	defer rdb.Close()
	handler := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		var b behaviour
		if err := job.Decode(&b); err != nil {
			return err
		}
		record("start", job)
		if b.SleepMS > 0 {
			t := time.NewTimer(time.Duration(b.SleepMS) * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				record("cancelled", job)
				return context.Cause(ctx)
			}
		}
		if b.Crash == "before" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		record("effect", job)
		return nil
	})
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: num("A16_CONC"), Logger: log})
	weights := strings.Split(env("A16_WEIGHTS"), ",")
	maxCrashes := 10
	if n := num("A16_MAXCRASHES"); n > 0 {
		maxCrashes = n
	}
	var queues []*consumer.Queue
	for i, s := range strings.Split(env("A16_STREAMS"), ",") {
		w, _ := strconv.Atoi(weights[i])
		queues = append(queues, p.Add(consumer.Config{
			Stream: s, Group: "g", Consumer: me,
			VisibilityTimeout: dur("A16_VIS"),
			SweepInterval:     dur("A16_SWEEP"),
			HeartbeatInterval: dur("A16_VIS") / 4,
			Block:             100 * time.Millisecond,
			ShutdownTimeout:   dur("A16_SHUTDOWN"),
			Prefetch:          num("A16_PREFETCH"),
			MaxCrashes:        maxCrashes,
			PromoteInterval:   50 * time.Millisecond,
		}, consumer.QueueOptions{Weight: w}).Handle(handler))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = p.Run(ctx)
	for _, q := range queues {
		st, _ := json.Marshal(q.Stats())
		fmt.Fprintf(os.Stderr, "A16_STATS %s %s\n", q.Stream(), st)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "A16_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

// a16Streams makes n streams of the test's own on rdb, each with jobs jobs
// of behaviour b, and returns their names and every job ID.
func a16Streams(t *testing.T, rdb *redis.Client, n, jobs int, b behaviour) (names []string, ids []string) {
	t.Helper()
	base := redistest.Name(t)
	for i := 0; i < n; i++ {
		s := fmt.Sprintf("%s-%d", base, i)
		names = append(names, s)
		keys, _ := stream.KeysFor(s)
		t.Cleanup(func() {
			rdb.Del(context.Background(), keys.Stream)
			redistest.DeleteKeys(rdb, "{"+s+"}:*")
		})
		sc := &scenario{t: t, rdb: rdb, stream: s, keys: keys}
		ids = append(ids, sc.enqueue(jobs, b)...)
	}
	return names, ids
}

type a16PoolOpts struct {
	addr, ledger, name string
	streams            []string
	weights            []int
	conc, prefetch     int
	maxCrashes         int
	vis, sweep, shut   time.Duration
}

func a16StartPool(t *testing.T, o a16PoolOpts) *worker {
	t.Helper()
	ws := make([]string, len(o.streams))
	for i := range ws {
		ws[i] = "1"
		if i < len(o.weights) {
			ws[i] = strconv.Itoa(o.weights[i])
		}
	}
	w := startSubprocess(t, "attack16pool",
		"A16_ADDR="+o.addr, "A16_LEDGER="+o.ledger, "A16_CONSUMER="+o.name,
		"A16_STREAMS="+strings.Join(o.streams, ","), "A16_WEIGHTS="+strings.Join(ws, ","),
		"A16_CONC="+strconv.Itoa(o.conc), "A16_PREFETCH="+strconv.Itoa(o.prefetch),
		"A16_MAXCRASHES="+strconv.Itoa(o.maxCrashes),
		"A16_VIS="+o.vis.String(), "A16_SWEEP="+o.sweep.String(), "A16_SHUTDOWN="+o.shut.String())
	w.name = o.name
	return w
}

// a16Settled reports whether every stream's group has read everything and
// holds nothing pending.
func a16Settled(rdb *redis.Client, streams []string) (bool, string) {
	ctx := context.Background()
	for _, s := range streams {
		gs, err := rdb.XInfoGroups(ctx, s).Result()
		if err != nil || len(gs) != 1 {
			return false, fmt.Sprintf("%s: groups %v %v", s, gs, err)
		}
		if gs[0].Pending != 0 || gs[0].Lag != 0 {
			return false, fmt.Sprintf("%s: pending %d lag %d", s, gs[0].Pending, gs[0].Lag)
		}
	}
	return true, ""
}

// a16Dead returns the number of dead-lettered entries of the streams.
func a16Dead(t *testing.T, rdb *redis.Client, streams []string) int64 {
	n := int64(0)
	for _, s := range streams {
		keys, _ := stream.KeysFor(s)
		l, _ := rdb.XLen(context.Background(), keys.Dead).Result()
		n += l
	}
	return n
}

// TestAttack16Pool_sigkillTakeover: a pool process over three streams is
// SIGKILLed mid-run; a second pool process (under another name, and in a
// second run under the same name) takes over. Every job of every stream is
// done, none runs twice in the second pool, the only jobs done twice are
// ones the first pool had started, and every group ends with nothing
// pending and nothing dead.
func TestAttack16Pool_sigkillTakeover(t *testing.T) {
	t.Parallel()
	for _, same := range []bool{false, true} {
		t.Run(fmt.Sprintf("sameName=%v", same), func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			names, ids := a16Streams(t, rdb, 3, 150, behaviour{SleepMS: 15})
			ledger := t.TempDir() + "/ledger"
			o := a16PoolOpts{addr: redistest.Addr(), ledger: ledger, name: "p1", streams: names, weights: []int{3, 2, 1},
				conc: 6, prefetch: 20, vis: 1500 * time.Millisecond, sweep: 100 * time.Millisecond, shut: 3 * time.Second}
			p1 := a16StartPool(t, o)
			eventually(t, 15*time.Second, func() (bool, string) {
				n := len(countEvents(readLedger(t, ledger), "effect"))
				return n >= len(ids)/4, fmt.Sprintf("%d effects", n)
			})
			p1.kill()
			killedAt := time.Now() // p1 is dead: every line it wrote is older
			o.name = "p2"
			if same {
				o.name = "p1"
			}
			p2 := a16StartPool(t, o)
			eventually(t, 18*time.Second, func() (bool, string) { return a16Settled(rdb, names) })
			p2.term()
			if err := p2.wait(10 * time.Second); err != nil {
				t.Errorf("second pool exited: %v\n%s", err, tail(p2.stderr.String(), 2000))
			}
			entries := readLedger(t, ledger)
			var first, second []ledgerEntry
			for _, e := range entries {
				if e.Event != "effect" && e.Event != "start" {
					continue
				}
				// Both may be named p1: the first pool was dead at killedAt.
				if e.At.After(killedAt) {
					second = append(second, e)
				} else {
					first = append(first, e)
				}
			}
			eff1, eff2 := countEvents(first, "effect"), countEvents(second, "effect")
			start1 := countEvents(first, "start")
			doubles := 0
			for _, id := range ids {
				switch {
				case eff1[id]+eff2[id] == 0:
					t.Errorf("job %s never done", id)
				case eff2[id] > 1:
					t.Errorf("job %s done %d times by the second pool", id, eff2[id])
				case eff1[id] > 1:
					t.Errorf("job %s done %d times by the first pool", id, eff1[id])
				case eff1[id] == 1 && eff2[id] == 1:
					doubles++
				}
				if eff1[id] == 1 && eff2[id] == 1 && start1[id] == 0 {
					t.Errorf("job %s done by both pools without a start in the first", id)
				}
			}
			if n := a16Dead(t, rdb, names); n != 0 {
				t.Errorf("%d jobs dead-lettered", n)
			}
			t.Logf("%d jobs, %d done by the first pool, %d by the second, %d done by both (in flight or unacknowledged at the kill)",
				len(ids), len(eff1), len(eff2), doubles)
		})
	}
}

// a16PendingOf returns how many entries of the streams are pending under
// consumer name.
func a16PendingOf(rdb *redis.Client, streams []string, name string) (int, error) {
	n := 0
	for _, s := range streams {
		ps, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: s, Group: "g", Start: "-", End: "+", Count: 10000, Consumer: name}).Result()
		if err != nil {
			return 0, err
		}
		n += len(ps)
	}
	return n, nil
}

// TestAttack16Pool_sigstopPastLease: a pool process frozen (SIGSTOP) past
// its visibility timeout loses every job it held, running or prefetched,
// to a second pool. Resumed, it must not start any job it held (a queued
// job "is not started once its lease has ended") nor settle any it lost,
// and every job of both streams ends done, none dead, nothing pending.
func TestAttack16Pool_sigstopPastLease(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	names, ids := a16Streams(t, rdb, 2, 80, behaviour{SleepMS: 150})
	ledger := t.TempDir() + "/ledger"
	o := a16PoolOpts{addr: redistest.Addr(), ledger: ledger, name: "p1", streams: names, weights: []int{1, 1},
		conc: 4, prefetch: 20, vis: time.Second, sweep: 100 * time.Millisecond, shut: 3 * time.Second}
	p1 := a16StartPool(t, o)
	eventually(t, 15*time.Second, func() (bool, string) {
		n := len(countEvents(readLedger(t, ledger), "effect"))
		held, _ := a16PendingOf(rdb, names, "p1")
		return n >= 8 && held >= 10, fmt.Sprintf("%d effects, %d held", n, held)
	})
	p1.stop()
	// The deliveries count of each entry p1 held at the stop: a start of
	// one of them by the resumed p1 on that delivery is what the README
	// forbids; a later delivery (p1 reclaiming it after p2 in turn lost its
	// lease, which a loaded machine causes at vis 1s) is a new lease.
	heldAt := map[string]int64{}
	for _, st := range names {
		ps, err := rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: st, Group: "g", Start: "-", End: "+", Count: 10000, Consumer: "p1"}).Result()
		if err != nil {
			t.Fatalf("XPENDING: %v", err)
		}
		for _, pe := range ps {
			heldAt[pe.ID] = pe.RetryCount
		}
	}
	held := len(heldAt)
	o.name = "p2"
	p2 := a16StartPool(t, o)
	eventually(t, 15*time.Second, func() (bool, string) {
		n, err := a16PendingOf(rdb, names, "p1")
		return err == nil && n == 0, fmt.Sprintf("%d still pending under the frozen pool (%v)", n, err)
	})
	p1.cont()
	contAt := time.Now()
	eventually(t, 18*time.Second, func() (bool, string) { return a16Settled(rdb, names) })
	p1.term()
	p2.term()
	err1, err2 := p1.wait(10*time.Second), p2.wait(10*time.Second)
	if err2 != nil {
		t.Errorf("second pool: %v", err2)
	}
	t.Logf("frozen pool held %d entries; its exit: %v", held, err1)
	entries := readLedger(t, ledger)
	by := map[string]map[string][]ledgerEntry{"p1": {}, "p2": {}}
	p2Deliveries := map[string]int{} // entry ID: the latest delivery p2 logged
	for _, e := range entries {
		by[e.Consumer][e.JobID] = append(by[e.Consumer][e.JobID], e)
		if e.Consumer == "p2" {
			p2Deliveries[e.EntryID] = max(p2Deliveries[e.EntryID], e.Deliveries)
		}
	}
	eff := countEvents(entries, "effect")
	lateStarts, lateEffects, retaken := 0, 0, 0
	for _, id := range ids {
		if eff[id] == 0 {
			t.Errorf("job %s never done", id)
		}
		if len(by["p2"][id]) == 0 {
			continue
		}
		for _, e := range by["p1"][id] {
			if e.At.Before(contAt.Add(200 * time.Millisecond)) {
				continue
			}
			switch e.Event {
			case "start":
				if d, ok := heldAt[e.EntryID]; ok && int64(e.Deliveries) == d || e.Deliveries <= p2Deliveries[e.EntryID] {
					lateStarts++
					t.Errorf("job %s taken over by the second pool was started again by the resumed first pool %v after SIGCONT (delivery %d; held at the stop: %v, p2's latest delivery %d)",
						id, e.At.Sub(contAt), e.Deliveries, ok, p2Deliveries[e.EntryID])
				} else {
					retaken++
				}
			case "effect":
				lateEffects++
			}
		}
	}
	if retaken > 0 {
		t.Logf("the resumed first pool reclaimed %d jobs from the second (a later delivery: the second lost their leases)", retaken)
	}
	if n := a16Dead(t, rdb, names); n != 0 {
		t.Errorf("%d jobs dead-lettered", n)
	}
	for _, l := range strings.Split(p1.stderr.String(), "\n") {
		if strings.HasPrefix(l, "A16_STATS") || strings.HasPrefix(l, "A16_RUN_ERROR") {
			t.Log("first pool: " + l)
		}
	}
	t.Logf("late starts %d, late effects (a handler past its lease finishing after SIGCONT) %d", lateStarts, lateEffects)
}

// TestAttack16Pool_sigtermGiveBack: SIGTERM to a pool process with jobs
// read but not started in every queue: running handlers finish, the queued
// jobs of every queue are given back unstarted, and a second pool runs them
// at once, long before the 30s visibility timeout; each job is done exactly
// once.
func TestAttack16Pool_sigtermGiveBack(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	names, ids := a16Streams(t, rdb, 3, 40, behaviour{SleepMS: 100})
	ledger := t.TempDir() + "/ledger"
	o := a16PoolOpts{addr: redistest.Addr(), ledger: ledger, name: "p1", streams: names, weights: []int{1, 1, 1},
		conc: 2, prefetch: 30, vis: 30 * time.Second, sweep: 200 * time.Millisecond, shut: 5 * time.Second}
	p1 := a16StartPool(t, o)
	eventually(t, 15*time.Second, func() (bool, string) {
		n := len(countEvents(readLedger(t, ledger), "effect"))
		var held []int
		ok := n >= 3
		for _, s := range names {
			h, _ := a16PendingOf(rdb, []string{s}, "p1")
			held = append(held, h)
			ok = ok && h >= 5
		}
		return ok, fmt.Sprintf("%d effects, held per stream %v", n, held)
	})
	p1.term()
	if err := p1.wait(10 * time.Second); err != nil {
		t.Fatalf("first pool's exit after SIGTERM: %v\n%s", err, tail(p1.stderr.String(), 2000))
	}
	termDone := time.Now()
	// Given back means reclaimable at once: each entry still pending under
	// the first pool is idle for at least the visibility timeout, so the
	// next sweep takes it (checked on the entries, not on how fast this
	// machine runs the second pool).
	left := 0
	for _, s := range names {
		ps, err := rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: s, Group: "g", Start: "-", End: "+", Count: 10000, Consumer: "p1"}).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Idle < o.vis {
				t.Errorf("entry %s of %s pending under the exited pool, idle %v: not given back (visibility timeout %v)", p.ID, s, p.Idle, o.vis)
			}
		}
		left += len(ps)
	}
	if left == 0 {
		t.Errorf("the first pool left nothing to give back (it held at least 5 jobs of each stream before SIGTERM)")
	}
	o.name = "p2"
	a16StartPool(t, o)
	eventually(t, 2*time.Minute, func() (bool, string) { return a16Settled(rdb, names) })
	eff := countEvents(readLedger(t, ledger), "effect")
	for _, id := range ids {
		if eff[id] != 1 {
			t.Errorf("job %s done %d times", id, eff[id])
		}
	}
	t.Logf("still pending under the first pool after its exit: %d entries; all settled %v after", left, time.Since(termDone))
}

// TestAttack16Pool_crashCollateralAcrossQueues: a job of stream A SIGKILLs
// the pool process every time it runs; the pool is restarted (same name, so
// it re-reads its own pending jobs at once) until that job is dead-lettered.
// The jobs of stream B that were merely running beside it in the same
// process must not be dead-lettered with it: "a job that crashes its worker
// takes no other job to the dead-letter stream with it (MaxCrashes counts
// only runs it can be blamed for)". In a single consumer that holds because
// a suspect's later runs are alone on the consumer; in a pool the other
// queues' jobs share the process.
func TestAttack16Pool_crashCollateralAcrossQueues(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	base := redistest.Name(t)
	names := []string{base + "-poison", base + "-innocent"}
	var innocent []string
	for i, s := range names {
		keys, _ := stream.KeysFor(s)
		t.Cleanup(func() {
			rdb.Del(context.Background(), keys.Stream)
			redistest.DeleteKeys(rdb, "{"+s+"}:*")
		})
		sc := &scenario{t: t, rdb: rdb, stream: s, keys: keys}
		if i == 0 {
			sc.enqueue(1, behaviour{SleepMS: 300, Crash: "before"})
		} else {
			innocent = sc.enqueue(1, behaviour{SleepMS: 800})
		}
	}
	ledger := t.TempDir() + "/ledger"
	o := a16PoolOpts{addr: redistest.Addr(), ledger: ledger, name: "p1", streams: names, weights: []int{1, 1},
		conc: 4, prefetch: 4, maxCrashes: 3, vis: 5 * time.Second, sweep: 200 * time.Millisecond, shut: 3 * time.Second}
	poisonKeys, _ := stream.KeysFor(names[0])
	restarts := 0
	for ; restarts < 8; restarts++ {
		w := a16StartPool(t, o)
		select {
		case <-w.done:
		case <-time.After(8 * time.Second):
		}
		if n, _ := rdb.XLen(context.Background(), poisonKeys.Dead).Result(); n == 1 {
			break
		}
		w.kill()
	}
	// Let the last pool finish stream B.
	w := a16StartPool(t, o)
	eventually(t, 15*time.Second, func() (bool, string) { return a16Settled(rdb, names) })
	w.term()
	_ = w.wait(10 * time.Second)
	innocentKeys, _ := stream.KeysFor(names[1])
	dead, _ := rdb.XRange(context.Background(), innocentKeys.Dead, "-", "+").Result()
	if n, _ := rdb.XLen(context.Background(), poisonKeys.Dead).Result(); n != 1 {
		t.Fatalf("the poison job was not dead-lettered after %d restarts", restarts)
	}
	t.Logf("%d pool runs killed by the poison job; %d of %d innocent jobs dead-lettered", restarts+1, len(dead), len(innocent))
	for _, d := range dead {
		t.Errorf("innocent job of the other queue dead-lettered: reason %v, error %v", d.Values["dead_reason"], d.Values["dead_error"])
	}
	if t.Failed() {
		for _, l := range ledgerLines(t, ledger) {
			t.Log("ledger: " + l)
		}
	}
}
