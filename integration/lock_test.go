package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// Subprocess programs of the lock tests:
//   - lock-mutex: 20 goroutines taking and releasing the lockx locks of 10
//     keys for a while, from a start signal on, and recording every
//     critical section in Redis;
//   - lock-worker: a consumer with the Lock middleware whose handler works
//     for a while (ignoring its context, as a handler stalled at the wrong
//     moment would), then writes to a fenced ledger in Redis with its lock's
//     fencing token.
func init() {
	subprocessModes["lock-mutex"] = lockMutexMain
	subprocessModes["lock-worker"] = lockWorkerMain
}

// lockEnv returns the environment variable k, exiting if it is missing.
func lockEnv(k string) string {
	v := os.Getenv(k)
	if v == "" {
		fmt.Fprintf(os.Stderr, "missing %s\n", k)
		os.Exit(2)
	}
	return v
}

func lockEnvDur(k string) time.Duration {
	d, err := time.ParseDuration(lockEnv(k))
	if err != nil {
		fmt.Fprintf(os.Stderr, "bad %s: %v\n", k, err)
		os.Exit(2)
	}
	return d
}

// Keys of the lock-mutex program under its prefix P:
//
//	P inside:<key>  holders of key right now, by INCR on entry, DECR on exit
//	P fences:<key>  list of the fencing tokens of key's critical sections,
//	                in the order they ran
//	P overlaps      list of the critical sections that found another holder
//	P ready         processes ready (INCR), waiting for
//	P go            their start signal (a BLPOP each)
const lockMutexKeys = 10

// lockMutexMin is how many acquisitions and conflicts each lock-mutex
// process reaches before it stops (after LK_FOR): fewer would not mean much.
const lockMutexMin = 100

func lockMutexMain() int {
	addr, prefix, name := lockEnv("LK_ADDR"), lockEnv("LK_PREFIX"), lockEnv("LK_NAME")
	runFor := lockEnvDur("LK_FOR")
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 32})
	defer rdb.Close()
	locks := lockx.New(rdb, lockx.Config{Prefix: prefix + "lock:"})
	ctx := context.Background()
	if err := rdb.Incr(ctx, prefix+"ready").Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := rdb.BLPop(ctx, 5*time.Minute, prefix+"go").Err(); err != nil {
		fmt.Fprintln(os.Stderr, "waiting for the go signal:", err)
		return 2
	}
	// Run for LK_FOR, and on (a busy machine) until both counts reach
	// lockMutexMin, within a bound.
	end, bound := time.Now().Add(runFor), time.Now().Add(runFor+2*time.Minute)
	var acquired, conflicts atomic.Int64
	more := func() bool {
		now := time.Now()
		return now.Before(end) ||
			now.Before(bound) && (acquired.Load() < lockMutexMin || conflicts.Load() < lockMutexMin)
	}
	var failed atomic.Bool
	fail := func(format string, args ...any) {
		failed.Store(true)
		fmt.Fprintf(os.Stderr, name+": "+format+"\n", args...)
	}
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for more() {
				key := "k" + strconv.Itoa(rand.N(lockMutexKeys))
				var l *lockx.Lock
				var err error
				if g%2 == 0 {
					l, err = locks.TryAcquire(ctx, key, 5*time.Second)
				} else {
					l, err = locks.Acquire(ctx, key, 5*time.Second, lockx.AcquireOptions{Wait: 50 * time.Millisecond})
				}
				if errors.Is(err, lockx.ErrNotObtained) {
					conflicts.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					fail("acquire %s: %v", key, err)
					return
				}
				acquired.Add(1)
				if n, err := rdb.Incr(ctx, prefix+"inside:"+key).Result(); err != nil || n != 1 {
					rdb.RPush(ctx, prefix+"overlaps", fmt.Sprintf("%s %s fence %d: %d holders (%v)", name, key, l.Fence(), n, err))
				}
				rdb.RPush(ctx, prefix+"fences:"+key, l.Fence())
				time.Sleep(time.Duration(rand.N(1000)) * time.Microsecond)
				if err := rdb.Decr(ctx, prefix+"inside:"+key).Err(); err != nil {
					fail("decr: %v", err)
				}
				if err := l.Release(ctx); err != nil {
					fail("release %s fence %d: %v", key, l.Fence(), err)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("LK_DONE %d %d\n", acquired.Load(), conflicts.Load())
	if failed.Load() {
		return 1
	}
	return 0
}

// Two processes of 20 goroutines each take the locks of 10 keys for 2 s,
// started together, and on (a busy machine) until each has made 100
// acquisitions and met 100 conflicts; no critical section ever finds
// another holder of its key inside, and each key's fencing tokens, in the
// order the critical sections ran, strictly increase: one per acquisition,
// none shared (the two processes share one Redis clock, and fences of
// acquisitions within one microsecond of each other follow the previous
// fence of the key).
func TestLock_mutualExclusion(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	prefix := redistest.Name(t) + ":"
	t.Cleanup(func() { lockCleanup(rdb, prefix) })
	env := []string{"LK_ADDR=" + redistest.Addr(), "LK_PREFIX=" + prefix, "LK_FOR=2s"}
	ps := []*worker{
		startSubprocess(t, "lock-mutex", append(env, "LK_NAME=p1")...),
		startSubprocess(t, "lock-mutex", append(env, "LK_NAME=p2")...),
	}
	ctx := t.Context()
	eventually(t, time.Minute, func() (bool, string) {
		n, _ := rdb.Get(ctx, prefix+"ready").Int()
		return n == len(ps), fmt.Sprintf("%d of %d processes ready", n, len(ps))
	})
	for range ps {
		if err := rdb.RPush(ctx, prefix+"go", "go").Err(); err != nil {
			t.Fatal(err)
		}
	}
	var total int64
	for _, p := range ps {
		if err := p.wait(3 * time.Minute); err != nil {
			t.Fatalf("%s: %v\n%s", p.name, err, p.stderr.String())
		}
		var acquired, conflicts int64
		if _, err := fmt.Sscanf(p.stderr.String(), "LK_DONE %d %d", &acquired, &conflicts); err != nil {
			t.Fatalf("%s printed %q", p.name, p.stderr.String())
		}
		t.Logf("process: %d acquisitions, %d conflicts", acquired, conflicts)
		if acquired < lockMutexMin || conflicts < lockMutexMin {
			t.Errorf("process acquired %d times and met %d conflicts; want both ≥ %d for the test to mean anything", acquired, conflicts, lockMutexMin)
		}
		total += acquired
	}
	if o, _ := rdb.LRange(ctx, prefix+"overlaps", 0, -1).Result(); len(o) > 0 {
		t.Errorf("%d overlapping holders, e.g. %v", len(o), o[:min(len(o), 5)])
	}
	var seen int64
	for k := range lockMutexKeys {
		key := "k" + strconv.Itoa(k)
		fences, err := rdb.LRange(ctx, prefix+"fences:"+key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		var last int64
		for i, f := range fences {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil || n <= last {
				t.Errorf("key %s: critical section %d has fencing token %s, not above the previous %d", key, i+1, f, last)
				break
			}
			last = n
		}
		seen += int64(len(fences))
	}
	if seen != total {
		t.Errorf("%d critical sections recorded, want %d", seen, total)
	}
}

// lockLedgerScript is the fenced store of the lock-worker tests: it accepts
// a write only if its fencing token is above every one it has accepted, as
// a store that checks fencing tokens would.
//
// KEYS[1] the highest fencing token accepted; KEYS[2] the list of accepted
// writes ("writer:token"); ARGV[1] the token; ARGV[2] the writer.
// Returns 1 when the write is accepted, 0 when it is refused.
var lockLedgerScript = redis.NewScript(`
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2] .. ':' .. ARGV[1])
return 1
`)

// lockWorkerMain runs a consumer with the Lock middleware. Its handler
// records "start <consumer> <deliveries> <fence>" in the list P events,
// works for LW_SLEEP whatever its context says, writes to the fenced ledger
// ("write <consumer> <fence> accepted|refused"), and, when refused, waits
// for the lock to be reported lost ("lost <consumer>: <cause>" or
// "notlost <consumer>"); a handler that ends with its lock still held
// records "held <consumer>".
func lockWorkerMain() int {
	prefix, me := lockEnv("LW_PREFIX"), lockEnv("LW_CONSUMER")
	rdb := redis.NewClient(&redis.Options{Addr: lockEnv("LW_ADDR"), MaxRetries: -1})
	defer rdb.Close()
	sleep := lockEnvDur("LW_SLEEP")
	event := func(ctx context.Context, format string, args ...any) {
		if err := rdb.RPush(context.WithoutCancel(ctx), prefix+"events", fmt.Sprintf(format, args...)).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "event:", err)
		}
	}
	handler := consumer.HandlerFunc(func(hctx context.Context, job *stream.Job) error {
		// Events are recorded even after the handler's context ends (the
		// consumer cancels it when the job's lease ends during a stall):
		// the test reads what the handler did, not whether it could log it.
		ctx := context.WithoutCancel(hctx)
		l, ok := lockx.FromContext(ctx)
		if !ok {
			return consumer.Dead(consumer.ReasonPermanent, errors.New("no lock in the context"))
		}
		event(ctx, "start %s %d %d", me, job.Deliveries, l.Fence())
		if c, ok := idem.ClaimFromContext(ctx); ok {
			if err := rdb.Set(ctx, prefix+"owner:"+me, c.Owner, 0).Err(); err != nil {
				return err
			}
		}
		<-time.After(sleep)
		ok2, err := lockLedgerScript.Run(context.WithoutCancel(ctx), rdb,
			[]string{prefix + "{ledger}:last", prefix + "{ledger}:log"}, l.Fence(), me).Bool()
		if err != nil {
			return err
		}
		if ok2 {
			event(ctx, "write %s %d accepted", me, l.Fence())
		} else {
			event(ctx, "write %s %d refused", me, l.Fence())
			select {
			case <-l.Lost():
				// The middleware cancels the context on the loss (unless
				// the consumer did first, having lost the job's lease).
				<-hctx.Done()
				event(ctx, "lost %s: %v; context: %v", me, l.Err(), context.Cause(hctx))
			case <-time.After(2 * time.Second):
				event(ctx, "notlost %s", me)
			}
		}
		if l.Err() == nil {
			event(ctx, "held %s", me)
		}
		return nil
	})
	vis := lockEnvDur("LW_VIS")
	c := consumer.New(rdb, consumer.Config{
		Stream:            lockEnv("LW_STREAM"),
		Group:             "g",
		Consumer:          me,
		VisibilityTimeout: vis,
		SweepInterval:     100 * time.Millisecond,
		HeartbeatInterval: vis / 4,
		Block:             200 * time.Millisecond,
		ShutdownTimeout:   5 * time.Second,
		Concurrency:       4,
		PromoteInterval:   50 * time.Millisecond,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}).Use(middleware.Lock(rdb, middleware.LockConfig{ // locks in the queue's namespace
		TTL:           lockEnvDur("LW_TTL"),
		ConflictDelay: 100 * time.Millisecond,
	}))
	if os.Getenv("LW_IDEM") == "true" { // fused with the lock: records in the queue's namespace
		c.Use(middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{
			Lease: lockEnvDur("LW_TTL"), Missing: middleware.MissingUseJobID, InProgressDelay: 100 * time.Millisecond}))
	}
	c.Handle(handler)
	_, report := watchStalls(rdb)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := c.Run(ctx)
	report()
	st, _ := json.Marshal(c.Stats())
	fmt.Fprintf(os.Stderr, "PW_STATS %s\n", st)
	if err != nil {
		fmt.Fprintf(os.Stderr, "PW_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

// lockScenario is a stream with group "g" (its locks are in its namespace),
// a key prefix for the ledger, and lock-worker processes.
type lockScenario struct {
	idem   bool // workers run Idempotency (Redis store, record per job) inside Lock: fused
	t      *testing.T
	rdb    *redis.Client
	stream string
	prefix string // of the ledger and events
	locks  string // the lockx prefix of the queue's locks
}

func newLockScenario(t *testing.T) *lockScenario {
	t.Helper()
	rdb := redistest.Shared(t)
	s := &lockScenario{t: t, rdb: rdb, stream: redistest.Name(t), prefix: redistest.Name(t) + ":"}
	keys, err := stream.KeysFor(s.stream)
	if err != nil {
		t.Fatal(err)
	}
	s.locks = keys.Lock
	t.Cleanup(func() {
		rdb.Del(context.Background(), keys.Stream)
		redistest.DeleteKeys(rdb, "{"+s.stream+"}:*") // dead letters, delayed jobs, locks
		lockCleanup(rdb, s.prefix)
	})
	if err := rdb.XGroupCreateMkStream(t.Context(), s.stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// worker starts a lock-worker named name with lock TTL ttl, visibility
// timeout vis and handler duration sleep.
func (s *lockScenario) worker(name string, ttl, vis, sleep time.Duration) *worker {
	w := startSubprocess(s.t, "lock-worker", "LW_ADDR="+redistest.Addr(), "LW_PREFIX="+s.prefix,
		"LW_STREAM="+s.stream, "LW_CONSUMER="+name, "LW_TTL="+ttl.String(), "LW_VIS="+vis.String(),
		"LW_SLEEP="+sleep.String(), "LW_IDEM="+strconv.FormatBool(s.idem))
	w.name = name
	return w
}

// enqueue adds one job with lock key key.
func (s *lockScenario) enqueue(key string) {
	s.t.Helper()
	j, err := stream.NewJSONJob("locked", struct{}{})
	if err != nil {
		s.t.Fatal(err)
	}
	j.LockKey = key
	if _, err := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream}).Enqueue(s.t.Context(), j); err != nil {
		s.t.Fatal(err)
	}
}

// events returns the handlers' events so far.
func (s *lockScenario) events() []string {
	s.t.Helper()
	ev, err := s.rdb.LRange(context.Background(), s.prefix+"events", 0, -1).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return ev
}

// waitEvent waits for an event starting with prefix and returns it.
func (s *lockScenario) waitEvent(prefix string, timeout time.Duration) string {
	s.t.Helper()
	var got string
	eventually(s.t, timeout, func() (bool, string) {
		for _, e := range s.events() {
			if strings.HasPrefix(e, prefix) {
				got = e
				return true, ""
			}
		}
		return false, fmt.Sprintf("no event %q; events %q", prefix, s.events())
	})
	return got
}

// ledger returns the ledger's accepted writes.
func (s *lockScenario) ledger() []string {
	s.t.Helper()
	l, err := s.rdb.LRange(context.Background(), s.prefix+"{ledger}:log", 0, -1).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return l
}

// lockStop stops w gracefully and returns the stats it printed.
func lockStop(t *testing.T, w *worker) consumer.Stats {
	t.Helper()
	w.term()
	if err := w.wait(10 * time.Second); err != nil {
		t.Errorf("worker %s exit: %v", w.name, err)
	}
	st, ok := w.stats()
	if !ok {
		t.Errorf("worker %s printed no stats", w.name)
	}
	return st
}

// A handler running five times its lock's TTL keeps the lock throughout:
// nobody else can take it, it is not reported lost, and the handler's
// fenced write is accepted.
//
// Renewal every TTL/3 keeps a lock only if the holder's process and Redis
// run within the TTL. A run in which the worker went TTL/3 or longer
// without a Redis reply (a busy machine), or the test could not probe for
// three TTLs of the handler's run, checked nothing and is repeated with a
// wider TTL; a lost lock without such a stall is a failure.
func TestLock_renewal(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "ttl", 300*time.Millisecond, func(t *testing.T, ttl time.Duration) time.Duration {
		s := newLockScenario(t)
		a := s.worker("a", ttl, 2*ttl, 5*ttl)
		s.enqueue("K")
		fa := strings.TrimPrefix(s.waitEvent("start a 1 ", time.Minute), "start a 1 ")
		probe := lockx.New(s.rdb, lockx.Config{Prefix: s.locks})
		wrote := func() bool {
			return slices.ContainsFunc(s.events(), func(e string) bool { return strings.HasPrefix(e, "write a") })
		}
		var first, last time.Time // the first and the latest probe that found the lock held
		var taken string          // a probe that took the lock while the handler held it
		for !wrote() {
			at := time.Now()
			l, err := probe.TryAcquire(t.Context(), "K", time.Minute)
			if errors.Is(err, lockx.ErrNotObtained) {
				if first.IsZero() {
					first = at
				}
				last = at
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			l.Release(context.Background())
			// The handler may have written and released the lock since the
			// loop looked; until it records "held a" it has not.
			if ev := s.events(); !slices.Contains(ev, "held a") {
				taken = fmt.Sprintf("another holder took the lock %v after the first probe; events %q", at.Sub(first), ev)
			}
			break
		}
		s.waitEvent("write a", time.Minute)
		st := lockStop(t, a)
		ev := s.events()
		stall, ok := a.longestStall()
		if !ok {
			t.Fatalf("worker a reported no stall measure")
		}
		t.Logf("probes found the lock held for %v of the handler's %v; the worker's longest stall %v; events %q",
			last.Sub(first), 5*ttl, stall, ev)
		held := taken == "" && slices.Equal(ev, []string{"start a 1 " + fa, "write a " + fa + " accepted", "held a"}) &&
			st.Acked == 1 && st.LeaseLost == 0 && st.Stale == 0
		switch {
		case !held && stall >= ttl/3:
			t.Logf("the run checked nothing: the worker went %v without a Redis reply, TTL/3 = %v (%s; stats %+v)", stall, ttl/3, taken, st)
			return 4 * stall
		case !held:
			if taken != "" {
				t.Error(taken)
			}
			t.Errorf("events %q, worker stats %+v; want the write accepted, the lock held, Acked 1 (the worker's longest stall was %v, under TTL/3)",
				ev, st, stall)
		case last.Sub(first) < 3*ttl:
			t.Logf("the run checked nothing: the probes covered only %v of the handler's %v", last.Sub(first), 5*ttl)
			return 2 * ttl
		}
		return 0
	})
}

// F4: the worker holding a job's lock is frozen (SIGSTOP) past the lock's
// TTL and the job's visibility timeout. Another worker takes the job over
// and its lock, with a higher fencing token, and writes to the ledger.
// Thawed, the first worker's write, with the old token, is refused by the
// ledger; its renewal reports the lock lost; its ack is refused (the entry
// is no longer its own).
//
// The second worker must keep its own lock through its handler: a run in
// which it went TTL/3 or longer without a Redis reply (a busy machine) and
// lost it checked nothing of that and is repeated with a wider TTL.
//
// With Idempotency inside the Lock (fused: one script locks and begins the
// record, one completes it and releases the lock), the record's lease
// passes too: b takes it over and completes it, and a's completion and
// release, thawed, change neither b's record nor b's lock.
func TestLock_fencingAfterStall(t *testing.T) {
	t.Parallel()
	for _, withIdem := range []bool{false, true} {
		t.Run("idempotency="+strconv.FormatBool(withIdem), func(t *testing.T) {
			t.Parallel()
			lockFencingAfterStall(t, withIdem)
		})
	}
}

func lockFencingAfterStall(t *testing.T, withIdem bool) {
	redistest.Widen(t, "ttl", 300*time.Millisecond, func(t *testing.T, ttl time.Duration) time.Duration {
		s := newLockScenario(t)
		s.idem = withIdem
		vis, sleep := 2*ttl, ttl*10/3
		a := s.worker("a", ttl, vis, sleep)
		s.enqueue("K")
		startA := s.waitEvent("start a 1 ", time.Minute)
		a.stop()
		b := s.worker("b", ttl, vis, sleep)
		startB := s.waitEvent("start b 2 ", time.Minute)
		fa, fb := strings.TrimPrefix(startA, "start a 1 "), strings.TrimPrefix(startB, "start b 2 ")
		if na, nb := lockFenceOf(t, fa), lockFenceOf(t, fb); nb <= na {
			t.Fatalf("b's fence %d is not above a's %d", nb, na)
		}
		s.waitEvent("write b ", time.Minute)
		a.cont()
		s.waitEvent("write a ", time.Minute)
		s.waitEvent("lost a", time.Minute)
		sb := lockStop(t, b)
		ev := s.events()
		// Each worker's events in order; b's write comes before a's (a
		// was thawed after it).
		var evA, evB []string
		for _, e := range ev {
			if f := strings.Fields(e); len(f) > 1 && strings.TrimSuffix(f[1], ":") == "a" {
				evA = append(evA, e)
			} else {
				evB = append(evB, e)
			}
		}
		stallB, _ := b.longestStall()
		if !slices.Contains(evB, "held b") && stallB >= ttl/3 {
			t.Logf("the run checked nothing: worker b went %v without a Redis reply, TTL/3 = %v, and lost its lock; events %q", stallB, ttl/3, ev)
			return 4 * stallB
		}
		wantA := []string{"start a 1 " + fa, "write a " + fa + " refused"}
		if len(evA) != 3 || !slices.Equal(evA[:2], wantA) || !strings.HasPrefix(evA[2], "lost a: "+lockx.ErrLockLost.Error()) {
			t.Errorf("worker a's events %q; want %q then its lock reported lost", evA, wantA)
		}
		if wantB := []string{"start b 2 " + fb, "write b " + fb + " accepted", "held b"}; !slices.Equal(evB, wantB) {
			t.Errorf("worker b's events %q, want %q (b's longest stall %v)", evB, wantB, stallB)
		}
		if slices.Index(ev, "write b "+fb+" accepted") > slices.Index(ev, "write a "+fa+" refused") {
			t.Errorf("events %q: a wrote before b", ev)
		}
		if l := s.ledger(); !slices.Equal(l, []string{"b:" + fb}) {
			t.Errorf("ledger %q, want only b's write with fencing token %s", l, fb)
		}
		if withIdem {
			// b's completed record, "c<n>:<b's owner>" (no result), and b's
			// released lock (its fence alone, until it expires) are b's:
			// a, thawed, changed neither.
			ctx := t.Context()
			ownerB := s.rdb.Get(ctx, s.prefix+"owner:b").Val()
			keys, _ := stream.KeysFor(s.stream)
			recs, _ := s.rdb.Keys(ctx, keys.Idem+"*").Result()
			if len(recs) != 1 {
				t.Fatalf("records %q, want the job's", recs)
			}
			if v := s.rdb.Get(ctx, recs[0]).Val(); v != "c"+strconv.Itoa(len(ownerB))+":"+ownerB {
				t.Errorf("record %q holds %q, want completed by b (%s)", recs[0], v, ownerB)
			}
			if v, err := s.rdb.Get(ctx, keys.Lock+"{K}").Result(); err == nil && v != fb {
				t.Errorf("lock holds %q after b released it, want b's fence %s alone", v, fb)
			}
		}
		sa := lockStop(t, a)
		if sa.Acked != 0 || sa.Stale+sa.LeaseLost == 0 {
			t.Errorf("worker a stats %+v: want Acked 0 and its ack refused or its lease lost", sa)
		}
		t.Logf("stale worker a: stats %+v; events %q", sa, ev)
		if sb.Acked != 1 || sb.Reclaimed != 1 {
			t.Errorf("worker b stats %+v: want Acked 1, Reclaimed 1", sb)
		}
		if p, _ := s.rdb.XPending(t.Context(), s.stream, "g").Result(); p == nil || p.Count != 0 {
			t.Errorf("pending %+v, want none", p)
		}
		return 0
	})
}

// lockFenceOf parses a fencing token of an event.
func lockFenceOf(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("fencing token %q: %v", s, err)
	}
	return n
}

// lockCleanup deletes every key under prefix.
func lockCleanup(rdb *redis.Client, prefix string) { redistest.DeleteKeys(rdb, prefix+"*") }
