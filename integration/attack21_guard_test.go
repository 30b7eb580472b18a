package integration

// Outside attacks on middleware.Lock, middleware.Idempotency and lockx across
// worker processes (README "Locks and idempotency"), written from the docs.
// Workers are this test binary in mode "a21guard": a consumer with
// crashOuter → Lock → Idempotency (optional) → handler, whose handler records
// every run in a ledger file and in Redis (a set of the fences running per
// lock key: the shared overlap counter).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func init() {
	subprocessModes["a21guard"] = a21gGuardMain
	subprocessModes["a21acquire"] = a21gAcquireMain
}

// a21gBehaviour is a job's payload.
type a21gBehaviour struct {
	WorkMS int    `json:"work_ms,omitempty"`
	Hold   bool   `json:"hold,omitempty"`  // work until the context ends
	Crash  string `json:"crash,omitempty"` // before | after (the effect) | post (Lock returned nil)
}

var a21gActive = redis.NewScript(`
redis.call('SADD', KEYS[1], ARGV[1])
local m = redis.call('SMEMBERS', KEYS[1])
return table.concat(m, ',')`)

func a21gGuardMain() int {
	env := os.Getenv
	me, pid := env("PW_CONSUMER"), os.Getpid()
	ledger, err := os.OpenFile(env("PW_LEDGER"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rec := func(ev string, job *stream.Job, fence int64, extra string) {
		if extra == "" {
			extra = "-"
		}
		fmt.Fprintf(ledger, "%s %s %s %d %s %s %d %s\n", ev, job.ID, me, pid, job.LockKey, job.IdempotencyKey, fence, extra)
	}
	ttl, _ := time.ParseDuration(env("A21_TTL"))
	vis, _ := time.ParseDuration(env("A21_VIS"))
	conc, _ := strconv.Atoi(env("A21_CONC"))
	rdb := redis.NewClient(&redis.Options{Addr: env("PW_ADDR"), MaxRetries: -1})
	defer rdb.Close()
	ns := "a21:" + env("PW_STREAM") + ":"
	stalls := redistest.WatchStalls(rdb, 2*redistest.StallInterval)
	defer stalls.Stop()
	crashOnce := func(job *stream.Job, where string) {
		if ok, _ := rdb.SetNX(context.Background(), ns+"crashed:"+job.ID+":"+where, me, 0).Result(); ok {
			rec("crash", job, 0, where)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		var b a21gBehaviour
		if err := job.Decode(&b); err != nil {
			return err
		}
		l, ok := lockx.FromContext(ctx)
		if !ok {
			rec("nolock", job, 0, "")
			return errors.New("no lock in context")
		}
		f := l.Fence()
		bg := context.Background()
		members, err := a21gActive.Run(bg, rdb, []string{ns + "active:" + job.LockKey}, f).Text()
		if err != nil {
			return err
		}
		began := time.Now()
		rec("start", job, f, members)
		if b.Crash == "before" {
			crashOnce(job, "before")
		}
		d := time.Duration(b.WorkMS) * time.Millisecond
		if b.Hold {
			d = 5 * time.Minute
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			c := context.Cause(ctx)
			rec("cancelled", job, f, fmt.Sprintf("lost=%v,notowner=%v", errors.Is(c, lockx.ErrLockLost), errors.Is(c, idem.ErrNotOwner)))
			rdb.SRem(bg, ns+"active:"+job.LockKey, f)
			return c
		}
		rec("effect", job, f, "") // before the effect: the ledger counts at least every effect
		if err := rdb.Incr(bg, ns+"effects:"+job.IdempotencyKey).Err(); err != nil {
			// The harness's own write failed (no retries): the effect may
			// not have been counted. Say so, for the check.
			rec("incrfail", job, f, "")
		}
		if b.Crash == "after" {
			crashOnce(job, "after")
		}
		// Leave the set first, then check the lock: a newer holder that saw
		// this fence in the set took the lock before this check.
		rdb.SRem(bg, ns+"active:"+job.LockKey, f)
		_, err = l.TTL(bg)
		if err == nil {
			rec("end", job, f, "held=true")
		} else {
			// How long this process (or Redis) stalled during the run, and before it.
			rec("end", job, f, fmt.Sprintf("held=false/stall=%dms/longest=%dms", stalls.Within(began.Add(-ttl), time.Now()).Milliseconds(), stalls.Longest().Milliseconds()))
		}
		return nil
	})
	outer := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			err := next.Process(ctx, job)
			if err == nil {
				rec("ok", job, 0, "")
				var b a21gBehaviour
				if job.Decode(&b) == nil && b.Crash == "post" {
					crashOnce(job, "post")
				}
			}
			return err
		})
	}
	mw := []consumer.Middleware{outer, middleware.Lock(rdb, middleware.LockConfig{
		TTL: ttl, ConflictDelay: 20 * time.Millisecond,
		OnConflict: func(k string) { fmt.Fprintf(ledger, "conflict - %s %d %s - 0 -\n", me, pid, k) },
	})}
	if env("A21_IDEM") == "1" {
		mw = append(mw, middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}),
			middleware.IdempotencyConfig{Lease: ttl, InProgressDelay: 50 * time.Millisecond}))
	}
	c := consumer.New(rdb, consumer.Config{
		Stream: env("PW_STREAM"), Group: "g", Consumer: me,
		VisibilityTimeout: vis, Block: 100 * time.Millisecond, SweepInterval: 100 * time.Millisecond,
		PromoteInterval: 30 * time.Millisecond, Concurrency: conc, MaxAttempts: 1000, MaxCrashes: 50,
		Backoff: consumer.Backoff{Base: 30 * time.Millisecond, Cap: 60 * time.Millisecond},
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}).Use(mw...).Handle(h)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "PW_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

// a21gAcquireMain takes the lock of A21_KEY (prefix A21_PREFIX) with TryAcquire,
// prints its fence, releases it unless A21_KEEP, and exits.
func a21gAcquireMain() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("PW_ADDR")})
	defer rdb.Close()
	l, err := lockx.New(rdb, lockx.Config{Prefix: os.Getenv("A21_PREFIX")}).TryAcquire(context.Background(), os.Getenv("A21_KEY"), 10*time.Second)
	if err != nil {
		fmt.Printf("A21 ERR %v\n", err)
		return 0
	}
	fmt.Printf("A21 FENCE %d\n", l.Fence())
	if os.Getenv("A21_KEEP") == "" {
		if err := l.Release(context.Background()); err != nil {
			fmt.Printf("A21 RELEASE %v\n", err)
		}
	}
	return 0
}

// a21gKeyLedger returns the ledger lines of idempotency key k, for a
// failure message.
func a21gKeyLedger(entries []a21gEntry, k string) string {
	var b strings.Builder
	for _, en := range entries {
		if en.IdemKey == k {
			fmt.Fprintf(&b, "\t%d %s %s %s pid %d lock %s fence %d %s\n", en.Line, en.Ev, en.JobID, en.Consumer, en.PID, en.LockKey, en.Fence, en.Extra)
		}
	}
	return b.String()
}

type a21gEntry struct {
	Ev, JobID, Consumer string
	PID                 int
	LockKey, IdemKey    string
	Fence               int64
	Extra               string
	Line                int
}

func a21gLedger(t *testing.T, path string) []a21gEntry {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []a21gEntry
	sc := bufio.NewScanner(f)
	for i := 0; sc.Scan(); i++ {
		p := strings.Fields(sc.Text())
		if len(p) != 8 {
			continue // cut short by SIGKILL
		}
		e := a21gEntry{Ev: p[0], JobID: p[1], Consumer: p[2], LockKey: p[4], IdemKey: p[5], Extra: p[7], Line: i}
		e.PID, _ = strconv.Atoi(p[3])
		e.Fence, _ = strconv.ParseInt(p[6], 10, 64)
		out = append(out, e)
	}
	return out
}

type a21gEnv struct {
	t      *testing.T
	srv    *redistest.Server
	rdb    *redis.Client
	name   string
	keys   stream.Keys
	ledger string
}

func newA21g(t *testing.T) *a21gEnv {
	srv := redistest.Start(t, redistest.Options{})
	name := "a21q"
	keys, _ := stream.KeysFor(name)
	return &a21gEnv{t: t, srv: srv, rdb: srv.Client(t), name: name, keys: keys, ledger: filepath.Join(t.TempDir(), "ledger")}
}

func (e *a21gEnv) worker(name string, conc int, ttl, vis time.Duration, withIdem bool) *worker {
	idemFlag := "0"
	if withIdem {
		idemFlag = "1"
	}
	return startSubprocess(e.t, "a21guard", "PW_ADDR="+e.srv.Addr(), "PW_STREAM="+e.name, "PW_CONSUMER="+name,
		"PW_LEDGER="+e.ledger, "A21_TTL="+ttl.String(), "A21_VIS="+vis.String(), "A21_CONC="+strconv.Itoa(conc), "A21_IDEM="+idemFlag)
}

func (e *a21gEnv) enqueue(lockKey, idemKey string, b a21gBehaviour) string {
	e.t.Helper()
	j, err := stream.NewJSONJob("a21", b)
	if err != nil {
		e.t.Fatal(err)
	}
	j.LockKey, j.IdempotencyKey = lockKey, idemKey
	if _, err := stream.NewProducer(e.rdb, stream.ProducerConfig{Stream: e.name}).Enqueue(context.Background(), j); err != nil {
		e.t.Fatal(err)
	}
	return j.ID
}

// started waits for the ledger's start entry of job jobID and returns it.
func (e *a21gEnv) started(jobID string) a21gEntry {
	var start a21gEntry
	eventually(e.t, 60*time.Second, func() (bool, string) {
		for _, en := range a21gLedger(e.t, e.ledger) {
			if en.Ev == "start" && en.JobID == jobID {
				start = en
				return true, ""
			}
		}
		return false, "job " + jobID + " not started"
	})
	return start
}

func (e *a21gEnv) settled() (bool, string) {
	ctx := context.Background()
	pe, err := e.rdb.XPending(ctx, e.name, "g").Result()
	if err != nil {
		return false, err.Error()
	}
	dl, _ := e.rdb.ZCard(ctx, e.keys.Delayed).Result()
	xl, _ := e.rdb.XLen(ctx, e.name).Result()
	info, _ := e.rdb.XInfoGroups(ctx, e.name).Result()
	lag := int64(-1)
	if len(info) == 1 {
		lag = info[0].Lag
	}
	return pe.Count == 0 && dl == 0 && lag == 0, fmt.Sprintf("pending %d delayed %d lag %d xlen %d", pe.Count, dl, lag, xl)
}

// checkExclusion: from the ledger, every start that found another fence of
// its key running must have overlapped a holder that had lost its lock (its
// end reports held=false, or it was cancelled/killed); fences per key are
// distinct. Returns the number of overlaps seen.
func a21gCheckExclusion(t *testing.T, entries []a21gEntry) int {
	t.Helper()
	ends := map[string]a21gEntry{} // key+fence → end
	for _, e := range entries {
		if e.Ev == "end" {
			ends[e.LockKey+" "+strconv.FormatInt(e.Fence, 10)] = e
		}
	}
	overlaps := 0
	fences := map[string]map[int64]string{}
	for _, e := range entries {
		if e.Ev != "start" {
			continue
		}
		if fences[e.LockKey] == nil {
			fences[e.LockKey] = map[int64]string{}
		}
		if prev, dup := fences[e.LockKey][e.Fence]; dup && prev != e.JobID {
			t.Errorf("key %s: fence %d given to jobs %s and %s", e.LockKey, e.Fence, prev, e.JobID)
		}
		fences[e.LockKey][e.Fence] = e.JobID
		for _, m := range strings.Split(e.Extra, ",") {
			f, _ := strconv.ParseInt(m, 10, 64)
			if f == e.Fence {
				continue
			}
			overlaps++
			// The pair ran at once: the holder with the smaller fence had lost
			// its lock (it expired while that process stalled), so it must not
			// report its lock held at its end. The newer one may, either way
			// round (a stalled holder may start its handler late).
			older, newer := f, e.Fence
			if f > e.Fence {
				older, newer = e.Fence, f
			}
			if end, ok := ends[e.LockKey+" "+strconv.FormatInt(older, 10)]; ok && end.Extra == "held=true" {
				t.Errorf("key %s: fences %d and %d ran at once, and the older one's holder (%s, job %s) still held its lock at its end: two holders at once",
					e.LockKey, older, newer, end.Consumer, end.JobID)
			}
		}
	}
	// Fence order: if A ended before B started and B held its lock to its
	// end, B acquired after A did, so B's fence is larger.
	type run struct {
		start, end int
		fence      int64
		held       bool
		job        string
	}
	runs := map[string]map[int64]*run{}
	for _, e := range entries {
		if e.Ev != "start" && e.Ev != "end" {
			continue
		}
		if runs[e.LockKey] == nil {
			runs[e.LockKey] = map[int64]*run{}
		}
		r := runs[e.LockKey][e.Fence]
		if r == nil {
			r = &run{start: -1, end: -1, fence: e.Fence, job: e.JobID}
			runs[e.LockKey][e.Fence] = r
		}
		if e.Ev == "start" {
			r.start = e.Line
		} else {
			r.end, r.held = e.Line, e.Extra == "held=true"
		}
	}
	for k, rs := range runs {
		var ended []*run
		for _, r := range rs {
			if r.start >= 0 && r.end >= 0 {
				ended = append(ended, r)
			}
		}
		sort.Slice(ended, func(i, j int) bool { return ended[i].start < ended[j].start })
		for i, b := range ended {
			if !b.held {
				continue
			}
			for _, a := range ended[:i] {
				if a.end < b.start && a.fence >= b.fence {
					t.Errorf("key %s: job %s (fence %d) ran after job %s ended (fence %d) and held its lock throughout, with a fence not above", k, b.job, b.fence, a.job, a.fence)
				}
			}
		}
	}
	return overlaps
}

// Promise: two jobs of one lock key never run at once across processes while
// their holders hold the lock; fences are distinct per key and a newer holder
// never runs beside... an older one that still holds it. Many keys, three
// worker processes, short TTLs; with and without Idempotency (the fused path).
// Catches: locks that do not exclude across processes, a fused take that
// skips the lock, fences reused.
func TestAttack21GuardExclusionAcrossProcesses(t *testing.T) {
	t.Parallel() // its own redis-server (or cluster) and subprocesses
	for _, v := range []struct {
		idem, stops bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		withIdem := v.idem
		t.Run(fmt.Sprintf("idem=%v,stops=%v", v.idem, v.stops), func(t *testing.T) {
			e := newA21g(t)
			var ws []*worker
			for i := 0; i < 3; i++ {
				ws = append(ws, e.worker(fmt.Sprintf("w%d", i), 6, 300*time.Millisecond, 20*time.Second, withIdem))
			}
			const jobs = 240
			work := 30
			if v.stops {
				work = 150
			}
			for i := 0; i < jobs; i++ {
				e.enqueue(fmt.Sprintf("acct-%d", i%8), fmt.Sprintf("op-%d", i), a21gBehaviour{WorkMS: 5 + rand.Intn(work)})
			}
			stops := 0
			var stopped *worker
			stoppedNames := map[string]bool{} // consumers SIGSTOPped at some point
			var stoppedAt time.Time
			eventually(t, 300*time.Second, func() (bool, string) {
				if v.stops {
					// SIGSTOP a worker for about 1 s (over 3 TTLs) now and then.
					if stopped != nil && time.Since(stoppedAt) > time.Second {
						stopped.cont()
						stopped = nil
					} else if stopped == nil && stops < 5 && rand.Intn(20) == 0 {
						w := rand.Intn(3)
						stopped, stoppedAt = ws[w], time.Now()
						stoppedNames[fmt.Sprintf("w%d", w)] = true
						stopped.stop()
						stops++
					}
				}
				ok, s := e.settled()
				return ok && stopped == nil, s
			})
			entries := a21gLedger(t, e.ledger)
			n := map[string]int{}
			for _, en := range entries {
				n[en.Ev]++
				if en.Ev == "nolock" {
					t.Errorf("job %s ran without a lock in its context", en.JobID)
				}
			}
			if n["end"] < jobs {
				t.Errorf("%d jobs ended, want %d (%v)", n["end"], jobs, n)
			}
			ov := a21gCheckExclusion(t, entries)
			if !v.stops {
				for _, en := range entries {
					if en.Ev == "end" && strings.HasPrefix(en.Extra, "held=false") {
						t.Logf("lock lost without SIGSTOP: job %s on %s: %s", en.JobID, en.Consumer, en.Extra)
					}
				}
			}
			t.Logf("events %v, overlaps %d", n, ov)
			if withIdem {
				// One effect per key, except where a stalled holder's lease passed
				// (its run ended with its lock lost, or it ran on a worker that was
				// SIGSTOPped: stopped after its handler returned and before the
				// record was completed, its record lease passes unnoticed): the
				// docs allow a repeat then.
				lostRun := map[string]bool{}
				for _, en := range entries {
					if en.Ev == "end" && (strings.HasPrefix(en.Extra, "held=false") || stoppedNames[en.Consumer]) {
						lostRun[en.IdemKey] = true
					}
				}
				// The same holds for a worker that was not stopped but stalled
				// past the 300 ms record lease on a loaded machine: it says so
				// when it finds its record taken over.
				for k := range a21gTakenOver(ws) {
					lostRun[k] = true
				}
				incrFailed := map[string]bool{}
				for _, en := range entries {
					if en.Ev == "incrfail" {
						incrFailed[en.IdemKey] = true
					}
				}
				for i := 0; i < jobs; i++ {
					k := "op-" + strconv.Itoa(i)
					v, _ := e.rdb.Get(context.Background(), "a21:"+e.name+":effects:"+k).Int()
					if v == 0 && incrFailed[k] {
						t.Logf("%s: 0 effects counted, but the harness's INCR failed after its effect began", k)
						continue
					}
					if v == 0 || (v > 1 && !lostRun[k]) {
						t.Errorf("%s: %d effects (a run that lost its lock: %v); its ledger:\n%s", k, v, lostRun[k], a21gKeyLedger(entries, k))
					}
				}
			}
		})
	}
}

// Promise: a holder SIGSTOPped past its lock's TTL loses the lock; another
// process takes it (with a larger fence), and when the holder runs again the
// loss is noticed and its handler context cancelled with lockx.ErrLockLost.
// Catches: a watchdog that does not notice the loss after a stall, a lost
// lock renewed anyway (resurrected over the new holder's), a fence not above.
func TestAttack21GuardStoppedHolderLosesLock(t *testing.T) {
	t.Parallel() // its own redis-server (or cluster) and subprocesses
	for _, withIdem := range []bool{false, true} {
		t.Run(fmt.Sprintf("idem=%v", withIdem), func(t *testing.T) {
			redistest.Widen(t, "ttl", 400*time.Millisecond, func(t *testing.T, ttl time.Duration) time.Duration {
				return a21gStoppedHolder(t, ttl, withIdem)
			})
		})
	}
}

// a21gStoppedHolder runs TestAttack21GuardStoppedHolderLosesLock once with
// lock TTL ttl; it returns a wider TTL if the new holder lost its lock
// while its own process (or Redis) stalled past a renewal (TTL/3) plus
// the TTL's rest, which is what a loaded machine does to a 400 ms lock.
func a21gStoppedHolder(t *testing.T, ttl time.Duration, withIdem bool) (wider time.Duration) {
	e := newA21g(t)
	w1 := e.worker("w1", 2, ttl, 60*time.Second, withIdem)
	j1 := e.enqueue("acct", "op-1", a21gBehaviour{Hold: true})
	start1 := e.started(j1)
	w1.stop()
	rk := e.keys.Lock + "{acct}"
	eventually(t, 60*time.Second, func() (bool, string) {
		v, err := e.rdb.Get(context.Background(), rk).Result()
		return err == redis.Nil || !strings.Contains(v, " "), fmt.Sprintf("lock %s = %q", rk, v)
	})
	e.worker("w2", 2, ttl, 60*time.Second, withIdem)
	j2 := e.enqueue("acct", "op-2", a21gBehaviour{WorkMS: 3000})
	start2 := e.started(j2)
	if start2.Fence <= start1.Fence {
		t.Errorf("fence of the new holder %d not above the stalled one's %d", start2.Fence, start1.Fence)
	}
	w1.cont()
	eventually(t, 60*time.Second, func() (bool, string) {
		for _, en := range a21gLedger(t, e.ledger) {
			if en.Ev == "cancelled" && en.JobID == j1 && en.Fence == start1.Fence {
				if !strings.Contains(en.Extra, "=true") || (!withIdem && !strings.HasPrefix(en.Extra, "lost=true")) {
					t.Errorf("stalled holder's handler cancelled with %s, want a cause matching ErrLockLost", en.Extra)
				}
				return true, ""
			}
		}
		return false, "stalled holder's handler not cancelled"
	})
	// The new holder keeps its lock: the woken holder must not have renewed or released it.
	eventually(t, 60*time.Second, func() (bool, string) {
		for _, en := range a21gLedger(t, e.ledger) {
			if en.Ev == "end" && en.JobID == j2 {
				var stallMS, longestMS int64
				switch _, err := fmt.Sscanf(en.Extra, "held=false/stall=%dms/longest=%dms", &stallMS, &longestMS); {
				case en.Extra == "held=true":
				case err == nil && time.Duration(stallMS)*time.Millisecond >= 2*ttl/3:
					t.Logf("the new holder stalled %dms during its run, past its renewals of a %v lock: %s", stallMS, ttl, en.Extra)
					wider = 2 * time.Duration(stallMS) * time.Millisecond
				default:
					t.Errorf("new holder lost its lock after the stalled holder woke: %s", en.Extra)
				}
				return true, ""
			}
			if en.Ev == "cancelled" && en.JobID == j2 {
				t.Errorf("new holder's handler cancelled (%s) after the stalled one woke", en.Extra)
				return true, ""
			}
		}
		return false, "job 2 not ended"
	})
	return wider
}

// Promise: under Idempotency a completed record's job is acknowledged
// without running again, and a crash between completion and ack makes the
// redelivery a hit; a crash before the effect runs it once; an effect is
// repeated only when the worker that made it died before the record
// completed. Workers are SIGKILLed by the crash points and at random moments.
// Afterwards every key is enqueued again: nothing may run. Catches: an
// effect run after its record completed, a job lost, a dead letter, a
// processing record or lock left behind.
func TestAttack21GuardIdempotencyUnderKills(t *testing.T) {
	t.Parallel() // its own redis-server (or cluster) and subprocesses
	e := newA21g(t)
	ttl, vis := 600*time.Millisecond, 1500*time.Millisecond
	workers := map[string]*worker{}
	gen := 0
	start := func(slot int) {
		gen++
		workers[fmt.Sprintf("w%d", slot)] = e.worker(fmt.Sprintf("w%d-%d", slot, gen), 4, ttl, vis, true)
	}
	for i := 0; i < 3; i++ {
		start(i)
	}
	crashes := []string{"", "before", "after", "post"}
	const keys = 80
	for i := 0; i < keys; i++ {
		b := a21gBehaviour{WorkMS: 10 + rand.Intn(60), Crash: crashes[i%4]}
		// Each key enqueued twice (a duplicate enqueue, another job ID).
		e.enqueue(fmt.Sprintf("acct-%d", i%10), fmt.Sprintf("op-%d", i), b)
		e.enqueue(fmt.Sprintf("acct-%d", i%10), fmt.Sprintf("op-%d", i), a21gBehaviour{WorkMS: 10})
	}
	killedPIDs := map[int]bool{}
	chaos := 0
	eventually(t, 300*time.Second, func() (bool, string) {
		// Restart workers that crashed themselves; kill one at random now and then.
		for slot := 0; slot < 3; slot++ {
			w := workers[fmt.Sprintf("w%d", slot)]
			select {
			case <-w.done:
				killedPIDs[w.cmd.Process.Pid] = true
				start(slot)
			default:
			}
		}
		if chaos < 12 && rand.Intn(25) == 0 {
			w := workers[fmt.Sprintf("w%d", rand.Intn(3))]
			killedPIDs[w.cmd.Process.Pid] = true
			w.kill()
			chaos++
		}
		ok, s := e.settled()
		return ok && chaos >= 6, fmt.Sprintf("%s chaos %d", s, chaos)
	})
	entries := a21gLedger(t, e.ledger)
	a21gCheckIdem(t, e, entries, killedPIDs, keys)
	// Everything again: every record is complete, nothing may run.
	before := len(entries)
	for i := 0; i < keys; i++ {
		e.enqueue(fmt.Sprintf("acct-%d", i%10), fmt.Sprintf("op-%d", i), a21gBehaviour{WorkMS: 10})
	}
	eventually(t, 120*time.Second, func() (bool, string) { return e.settled() })
	for _, en := range a21gLedger(t, e.ledger)[before:] {
		if en.Ev == "start" || en.Ev == "effect" {
			t.Errorf("completed key %s ran again: %s by %s", en.IdemKey, en.Ev, en.Consumer)
		}
	}
	// Dead letters, and what is left per lock key and record.
	ctx := context.Background()
	if n, _ := e.rdb.XLen(ctx, e.keys.Dead).Result(); n != 0 {
		msgs, _ := e.rdb.XRange(ctx, e.keys.Dead, "-", "+").Result()
		t.Errorf("%d dead letters: %v", n, msgs)
	}
	a21gCheckLeftovers(t, e, ttl, keys)
}

func a21gCheckIdem(t *testing.T, e *a21gEnv, entries []a21gEntry, killed map[int]bool, keys int) {
	t.Helper()
	okAt := map[string]int{} // idem key → ledger line of the first "ok"
	effects := map[string][]a21gEntry{}
	for _, en := range entries {
		switch en.Ev {
		case "ok":
			if _, seen := okAt[en.IdemKey]; !seen {
				okAt[en.IdemKey] = en.Line
			}
		case "start":
			if l, seen := okAt[en.IdemKey]; seen {
				t.Errorf("%s: job %s started on %s (line %d) after the record completed (ok at line %d)", en.IdemKey, en.JobID, en.Consumer, en.Line, l)
			}
		case "effect":
			effects[en.IdemKey] = append(effects[en.IdemKey], en)
			if l, seen := okAt[en.IdemKey]; seen {
				t.Errorf("%s: effect by %s (line %d) after the record completed (ok at line %d)", en.IdemKey, en.Consumer, en.Line, l)
			}
		}
	}
	dups := 0
	for i := 0; i < keys; i++ {
		k := fmt.Sprintf("op-%d", i)
		ef := effects[k]
		if len(ef) == 0 {
			t.Errorf("%s: no effect (lost)", k)
			continue
		}
		if v, _ := e.rdb.Get(context.Background(), "a21:"+e.name+":effects:"+k).Int(); v > len(ef) || v == 0 {
			t.Errorf("%s: Redis counts %d effects, ledger %d", k, v, len(ef))
		}
		for _, prev := range ef[:len(ef)-1] {
			dups++
			if !killed[prev.PID] {
				t.Errorf("%s: effect repeated although the worker %s that made it first was never killed", k, prev.Consumer)
			}
		}
	}
	t.Logf("%d keys, %d repeated effects, %d killed processes", keys, dups, len(killed))
}

// a21gTakenOver returns the idempotency keys whose record a worker of ws
// reported taken over before its run completed (its lease passed during
// the run), from the workers' output.
func a21gTakenOver(ws []*worker) map[string]bool {
	keys := map[string]bool{}
	for _, w := range ws {
		for _, line := range strings.Split(w.stderr.String(), "\n") {
			if !strings.Contains(line, "record taken over before completion") {
				continue
			}
			if _, rest, ok := strings.Cut(line, "idempotency_key="); ok {
				k, _, _ := strings.Cut(rest, " ")
				keys[k] = true
			}
		}
	}
	return keys
}

func a21gCheckLeftovers(t *testing.T, e *a21gEnv, ttl time.Duration, keys int) {
	t.Helper()
	ctx := context.Background()
	all, _ := e.rdb.Keys(ctx, "{"+e.name+"}:*").Result()
	records := 0
	for _, k := range all {
		pttl, _ := e.rdb.PTTL(ctx, k).Result()
		switch {
		case strings.HasPrefix(k, e.keys.Idem):
			records++
			v, _ := e.rdb.Get(ctx, k).Result()
			if !strings.HasPrefix(v, "c") {
				t.Errorf("record %s = %q after every job completed", k, v)
			}
			if pttl < 0 || pttl > idem.DefaultRetention {
				t.Errorf("record %s TTL %v", k, pttl)
			}
		case strings.HasPrefix(k, e.keys.Lock):
			if pttl == -2*time.Nanosecond {
				continue // expired since KEYS listed it
			}
			if pttl < 0 || pttl > ttl {
				t.Errorf("lock key %s TTL %v (lock TTL %v)", k, pttl, ttl)
			}
		default:
			if pttl < 0 {
				t.Errorf("key %s left without a TTL", k)
			}
		}
	}
	if records != keys {
		t.Errorf("%d records for %d idempotency keys", records, keys)
	}
	// The lock keys go away after their TTL.
	eventually(t, 30*time.Second, func() (bool, string) {
		ks, _ := e.rdb.Keys(ctx, e.keys.Lock+"*").Result()
		return len(ks) == 0, fmt.Sprintf("lock keys left: %v", ks)
	})
	t.Logf("keys in the queue namespace: %d", len(all))
}

// Promise: a lock released by a finished job can be taken at once by the next
// job of the key in another process (and in the same process); lockx fences
// increase across process restarts and a Redis restart without persistence.
// Catches: a tombstone or unreleased lock that blocks the next job for the
// TTL (10 s here, conflicts recorded), fences that go back.
func TestAttack21GuardNextJobTakesReleasedLock(t *testing.T) {
	t.Parallel() // its own redis-server (or cluster) and subprocesses
	e := newA21g(t)
	ttl := 10 * time.Second
	w1 := e.worker("w1", 2, ttl, 30*time.Second, true)
	wait := func(id string) a21gEntry {
		var got a21gEntry
		eventually(t, 120*time.Second, func() (bool, string) {
			for _, en := range a21gLedger(t, e.ledger) {
				if en.Ev == "ok" && en.JobID == id {
					got = en
					return true, ""
				}
			}
			b, _ := os.ReadFile(e.ledger)
			return false, "job " + id + " not done (its lock blocked?); ledger:\n" + tail(string(b), 2000)
		})
		return got
	}
	wait(e.enqueue("acct", "op-1", a21gBehaviour{WorkMS: 10}))
	wait(e.enqueue("acct", "op-2", a21gBehaviour{WorkMS: 10})) // same process
	w2 := e.worker("w2", 2, ttl, 30*time.Second, true)
	w1.term() // only w2 reads now
	_ = w1.wait(60 * time.Second)
	got := wait(e.enqueue("acct", "op-3", a21gBehaviour{WorkMS: 10}))
	if got.Consumer != "w2" {
		t.Errorf("op-3 ran on %s", got.Consumer)
	}
	wait(e.enqueue("acct", "op-4", a21gBehaviour{WorkMS: 10}))
	_ = w2
	for _, en := range a21gLedger(t, e.ledger) {
		if en.Ev == "conflict" {
			t.Errorf("conflict on a released lock: %+v", en)
		}
	}
	// lockx across processes: each child takes and releases; the parent then takes at once.
	child := func(keep bool) (int64, string) {
		env := []string{"PW_MODE=a21acquire", "PW_ADDR=" + e.srv.Addr(), "A21_KEY=x", "A21_PREFIX=a21:"}
		if keep {
			env = append(env, "A21_KEEP=1")
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(line, "A21 FENCE "); ok {
				f, _ := strconv.ParseInt(s, 10, 64)
				return f, ""
			}
			if s, ok := strings.CutPrefix(line, "A21 "); ok {
				return 0, s
			}
		}
		return 0, string(out)
	}
	lc := lockx.New(e.rdb, lockx.Config{Prefix: "a21:"})
	ctx := context.Background()
	var fences []int64
	for i := 0; i < 6; i++ {
		if i == 3 {
			e.srv.Kill9()
			e.srv.Restart()
		}
		f, msg := child(false)
		if msg != "" {
			t.Fatalf("round %d: child could not take the free lock: %s", i, msg)
		}
		l, err := lc.TryAcquire(ctx, "x", 10*time.Second)
		if err != nil {
			t.Fatalf("round %d: parent could not take the lock the child released: %v", i, err)
		}
		fences = append(fences, f, l.Fence())
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, msg := child(true); msg != "" {
		t.Fatalf("child: %s", msg)
	}
	if _, err := lc.TryAcquire(ctx, "x", time.Second); !errors.Is(err, lockx.ErrNotObtained) {
		t.Errorf("parent took a lock a dead child still holds: %v", err)
	}
	if !sort.SliceIsSorted(fences, func(i, j int) bool { return fences[i] < fences[j] }) {
		t.Errorf("fences not increasing across processes and a Redis restart: %v", fences)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Errorf("fence #%d %d not above %d", i, fences[i], fences[i-1])
		}
	}
}
