package integration

// Attack on the consumer's reads as the README documents them: the blocking
// XREADGROUP goes raw (go-redis DoRaw, the reply parsed by Pelican) when the
// client's ReadTimeout is at least Block plus a second or has none, and stays
// typed otherwise; claim.Entry keeps every field in order, so a reclaim and a
// re-read of a consumer's own pending entries see duplicates and binary
// values as the stream holds them. Written from the documentation alone
// (README.md, docs/wire-format.md, SECURITY.md, docs/deploy.md, go doc).
//
// Every scenario counts in and out: the job IDs enqueued against the job IDs
// that ran (at least once, and twice only where a fault could explain it),
// the entries that ended in the dead-letter stream, and what is left pending.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// ---------------------------------------------------------------------------
// Helpers

// r30Read is one XREADGROUP seen by r30Hook.
type r30Read struct {
	raw, block bool
	blockMS    int64     // the BLOCK argument, -1 without
	args       string    // the command, for failure messages
	start, end time.Time // end zero while in flight
	err        error
}

// r30Hook records every XREADGROUP a client sends: raw (*redis.RawCmd) or
// typed, with BLOCK or without, when it was sent and answered, and its error
// (redis.Nil, a typed read's empty reply, is not one).
type r30Hook struct {
	mu    sync.Mutex
	reads []*r30Read
}

func (h *r30Hook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *r30Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *r30Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !strings.EqualFold(cmd.Name(), "xreadgroup") {
			return next(ctx, cmd)
		}
		r := &r30Read{start: time.Now(), args: fmt.Sprint(cmd.Args()), blockMS: -1}
		_, r.raw = cmd.(*redis.RawCmd)
		args := cmd.Args()
		for i, a := range args {
			if s, ok := a.(string); ok && strings.EqualFold(s, "block") {
				r.block = true
				if i+1 < len(args) {
					if ms, err := strconv.ParseInt(fmt.Sprint(args[i+1]), 10, 64); err == nil {
						r.blockMS = ms
					}
				}
			}
		}
		h.mu.Lock()
		h.reads = append(h.reads, r)
		h.mu.Unlock()
		err := next(ctx, cmd)
		h.mu.Lock()
		r.end = time.Now()
		if err != nil && !errors.Is(err, redis.Nil) {
			r.err = err
		}
		h.mu.Unlock()
		return err
	}
}

// snapshot returns copies of the reads recorded so far.
func (h *r30Hook) snapshot() []r30Read {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]r30Read, len(h.reads))
	for i, r := range h.reads {
		out[i] = *r
	}
	return out
}

// blockingInFlight reports whether a blocking read has been in flight for
// at least age.
func (h *r30Hook) blockingInFlight(age time.Duration) bool {
	now := time.Now()
	for _, r := range h.snapshot() {
		if r.block && r.end.IsZero() && now.Sub(r.start) >= age {
			return true
		}
	}
	return false
}

// blockCounts counts the blocking reads: raw, typed, failed, and those
// that came back without an error after about their BLOCK (at least 200 ms):
// idle reads that waited and timed out in Redis.
func (h *r30Hook) blockCounts() (raw, typed, failed, waited int) {
	for _, r := range h.snapshot() {
		if !r.block {
			continue
		}
		if r.raw {
			raw++
		} else {
			typed++
		}
		if r.err != nil {
			failed++
		}
		wait := time.Duration(r.blockMS) * time.Millisecond
		if !r.end.IsZero() && r.err == nil && wait >= 200*time.Millisecond && r.end.Sub(r.start) >= wait*9/10 {
			waited++
		}
	}
	return
}

// r30RawOK reports whether a raw blocking read of BLOCK ms keeps go-redis's
// ReadTimeout rt (as given to redis.Options) out of its way: rt has none
// (-1, -2) or is at least the BLOCK plus a second (0 is go-redis's 5 s).
func r30RawOK(rt time.Duration, blockMS int64) bool {
	if rt == 0 {
		rt = 5 * time.Second
	}
	return rt < 0 || rt >= time.Duration(blockMS)*time.Millisecond+time.Second
}

// badRaw returns a raw blocking read whose BLOCK leaves less than a second
// to the client's ReadTimeout rt, "" if none does.
func (h *r30Hook) badRaw(rt time.Duration) string {
	for _, r := range h.snapshot() {
		if r.block && r.raw && !r30RawOK(rt, r.blockMS) {
			return r.args
		}
	}
	return ""
}

// badTyped returns a typed blocking read whose BLOCK would have left a
// second to the client's ReadTimeout rt (it should have gone raw), "" if
// none does.
func (h *r30Hook) badTyped(rt time.Duration) string {
	for _, r := range h.snapshot() {
		if r.block && !r.raw && r.blockMS > 0 && r30RawOK(rt, r.blockMS) {
			return r.args
		}
	}
	return ""
}

// r30BlockOver returns a blocking read whose BLOCK is over block, "" if
// none is.
func r30BlockOver(h *r30Hook, block time.Duration) string {
	for _, r := range h.snapshot() {
		f := strings.Fields(strings.Trim(r.args, "[]"))
		for i := 0; i+1 < len(f); i++ {
			if strings.EqualFold(f[i], "block") {
				if ms, err := strconv.ParseInt(f[i+1], 10, 64); err == nil && time.Duration(ms)*time.Millisecond > block {
					return r.args
				}
			}
		}
	}
	return ""
}

// r30Client returns a client of its own to addr with the given protocol and
// ReadTimeout (0: go-redis's default), closed when t ends.
func r30Client(t *testing.T, addr string, proto int, readTimeout time.Duration, more ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: addr, Protocol: proto, ReadTimeout: readTimeout}
	for _, f := range more {
		f(o)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// r30Cons is a consumer running in a goroutine.
type r30Cons struct {
	c     *consumer.Consumer
	ended chan struct{}
	err   error // Run's error, once ended is closed
	logs  *syncBuffer
}

// r30Start runs a consumer of cfg with handler h and shuts it down when t
// ends (a failure if Run has not returned 60 s after Shutdown was called).
// Warnings and errors it logs go to logs.
func r30Start(t *testing.T, rdb redis.UniversalClient, cfg consumer.Config, h consumer.Handler) *r30Cons {
	t.Helper()
	return r30StartCtx(t, context.Background(), rdb, cfg, h)
}

// r30StartCtx is r30Start with Run's context.
func r30StartCtx(t *testing.T, ctx context.Context, rdb redis.UniversalClient, cfg consumer.Config, h consumer.Handler) *r30Cons {
	t.Helper()
	rc := &r30Cons{ended: make(chan struct{}), logs: &syncBuffer{}}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(rc.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	rc.c = consumer.New(rdb, cfg).Handle(h)
	go func() {
		rc.err = rc.c.Run(ctx)
		close(rc.ended)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rc.c.Shutdown(ctx)
		select {
		case <-rc.ended:
		case <-time.After(60 * time.Second):
			t.Errorf("Run did not return within 60 s of Shutdown")
		}
		if t.Failed() {
			t.Logf("consumer log (tail):\n%s", tail(rc.logs.String(), 3000))
		}
	})
	return rc
}

// running fails the test if Run has returned.
func (rc *r30Cons) running(t *testing.T) {
	t.Helper()
	select {
	case <-rc.ended:
		t.Fatalf("Run returned: %v", rc.err)
	default:
	}
}

// waitReading waits until the consumer reads new entries.
func (rc *r30Cons) waitReading(t *testing.T) {
	t.Helper()
	select {
	case <-rc.c.Reading():
	case <-rc.ended:
		t.Fatalf("Run returned before reading: %v", rc.err)
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer did not start reading within 60 s")
	}
}

// r30Ledger records each job's runs that completed (the handler's work done,
// its context not cancelled).
type r30Ledger struct {
	mu   sync.Mutex
	runs map[string][]r30Run
}

type r30Run struct {
	entry      string
	start, end time.Time
}

func newA30Ledger() *r30Ledger { return &r30Ledger{runs: map[string][]r30Run{}} }

func (l *r30Ledger) handler(work time.Duration) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		start := time.Now()
		if work > 0 {
			tm := time.NewTimer(work)
			defer tm.Stop()
			select {
			case <-tm.C:
			case <-ctx.Done():
				return context.Cause(ctx) // no effect: the job is taken back
			}
		}
		l.mu.Lock()
		l.runs[j.ID] = append(l.runs[j.ID], r30Run{entry: j.EntryID, start: start, end: time.Now()})
		l.mu.Unlock()
		return nil
	})
}

func (l *r30Ledger) copyRuns() map[string][]r30Run {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]r30Run, len(l.runs))
	for k, v := range l.runs {
		out[k] = slices.Clone(v)
	}
	return out
}

// r30Producer enqueues a job every interval with a client that never
// retries a command, so that a job ID reaches the stream at most once:
// an XADD that returned an ID is confirmed, one that failed is maybe
// enqueued.
type r30Producer struct {
	rdb      *redis.Client
	q        string
	interval time.Duration
	paused   atomic.Bool

	mu        sync.Mutex
	confirmed map[string]time.Time // job ID: when XADD returned
	maybe     map[string]bool
	attempted map[string]bool

	cancel context.CancelFunc
	done   chan struct{}
}

func startA30Producer(rdb *redis.Client, q string, interval time.Duration) *r30Producer {
	p := &r30Producer{rdb: rdb, q: q, interval: interval, confirmed: map[string]time.Time{},
		maybe: map[string]bool{}, attempted: map[string]bool{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() {
		defer close(p.done)
		tk := time.NewTicker(interval)
		defer tk.Stop()
		for n := 0; ; {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			if p.paused.Load() {
				continue
			}
			id := fmt.Sprintf("j%06d", n)
			n++
			p.mu.Lock()
			p.attempted[id] = true
			p.mu.Unlock()
			err := p.rdb.Do(ctx, "XADD", q, "*", "type", "t", "job_id", id, "payload", "{}").Err()
			p.mu.Lock()
			if err == nil {
				p.confirmed[id] = time.Now()
			} else {
				p.maybe[id] = true
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *r30Producer) stop() {
	p.cancel()
	<-p.done
}

func (p *r30Producer) state() (confirmed map[string]time.Time, maybe, attempted map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.confirmed), maps.Clone(p.maybe), maps.Clone(p.attempted)
}

// r30Pending returns the group's pending count, -1 on an error.
func r30Pending(rdb redis.UniversalClient, q, group string) int64 {
	p, err := rdb.XPending(context.Background(), q, group).Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// ---------------------------------------------------------------------------
// (1) Outages during idle blocking reads and live traffic.

type r30Outage struct {
	name  string
	fault string        // stop, kill, blackhole, delay
	rt    time.Duration // the consumer client's ReadTimeout (0: go-redis's default)
	proto int
	idle  bool // the fault hits a consumer with nothing to do (no traffic meanwhile, nothing pending)
	raw   bool // the blocking reads go raw (README)
}

// Redis frozen (SIGSTOP) past the client's ReadTimeout, killed with SIGKILL
// and restarted (appendfsync always, so the kill loses nothing enqueued), or
// cut off by a proxy (replies held or delayed past ReadTimeout) while the
// consumer waits in a blocking read, idle or under live traffic: every job
// whose XADD returned runs, none runs twice unless its first run was caught
// by the fault (an idle consumer has no such run: none runs twice), nothing
// stays pending, the consumer keeps running jobs, is Ready again, and its
// read errors stop once Redis is back (README, Lifecycle: "resumes within
// seconds of Redis coming back"; Guarantees: at-least-once, bounded
// recovery).
func TestAttack30Read_outage(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	// One case per fault and kind of ReadTimeout (its author ran 12; the
	// rest were cut to keep the suite's time: each costs about 20 s).
	for _, c := range []r30Outage{
		{name: "stop/rt2s/resp2/idle", fault: "stop", rt: 2 * time.Second, proto: 2, idle: true, raw: true},
		{name: "stop/rt-2/resp2/live", fault: "stop", rt: -2, proto: 2, raw: true},
		{name: "stop/rt1.5s-typed/resp2/live", fault: "stop", rt: 1500 * time.Millisecond, proto: 2},
		{name: "kill/rt2s/resp3/idle", fault: "kill", rt: 2 * time.Second, proto: 3, idle: true, raw: true},
		{name: "kill/rt-1/resp2/live", fault: "kill", rt: -1, proto: 2, raw: true},
		{name: "blackhole/rt2s/resp3/idle", fault: "blackhole", rt: 2 * time.Second, proto: 3, idle: true, raw: true},
		{name: "blackhole/rt-1/resp3/live", fault: "blackhole", rt: -1, proto: 3, raw: true},
		{name: "delay/rt2s/resp3/live", fault: "delay", rt: 2 * time.Second, proto: 3, raw: true},
	} {
		idle.Run(c.name, func(t *testing.T) {
			for attempt := 1; ; attempt++ {
				if r30OutageOnce(t, c, attempt) {
					return
				}
				if attempt == 3 {
					t.Skipf("in %d runs the fault never caught a blocking read in flight: nothing was checked about the blocking read", attempt)
				}
				t.Logf("run %d: the fault caught no blocking read in flight; running the scenario again", attempt)
			}
		})
	}
}

// r30OutageOnce runs one outage scenario on a server of its own and reports
// whether the fault caught a blocking read in flight. Its checks fail t
// whatever it returns.
func r30OutageOnce(t *testing.T, c r30Outage, attempt int) (hit bool) {
	const (
		block      = time.Second
		visibility = 4 * time.Second
		sweep      = time.Second
	)
	outage := time.Duration(attempt+4) * time.Second // past ReadTimeout (2 s) and the visibility timeout
	srv := redistest.Start(t, redistest.Options{AOF: "always"})
	target := srv.Addr()
	var proxy *faultproxy.Proxy
	if c.fault == "blackhole" || c.fault == "delay" {
		p, err := faultproxy.Start(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxy, target = p, p.Addr()
	}
	crdb := r30Client(t, target, c.proto, c.rt)
	hook := &r30Hook{}
	crdb.AddHook(hook)
	// The producer and the test's own client go to Redis directly: under
	// a proxy fault the traffic goes on while the consumer is cut off.
	prdb := r30Client(t, srv.Addr(), c.proto, 30*time.Second, func(o *redis.Options) { o.MaxRetries = -1 })
	rdb := r30Client(t, srv.Addr(), 2, 0)
	const q = "q"
	ledger := newA30Ledger()
	rc := r30Start(t, crdb, consumer.Config{Stream: q, Group: "g", Consumer: "c", Block: block, Concurrency: 4,
		VisibilityTimeout: visibility, SweepInterval: sweep}, ledger.handler(2*time.Millisecond))
	rc.waitReading(t)

	prod := startA30Producer(prdb, q, 40*time.Millisecond)
	producing := true
	defer func() {
		if producing {
			prod.stop()
		}
	}()
	time.Sleep(1500 * time.Millisecond) // live traffic before the fault
	minAge := time.Duration(0)
	if c.idle {
		prod.paused.Store(true)
		eventually(t, 60*time.Second, func() (bool, string) {
			conf, maybe, _ := prod.state()
			runs := ledger.copyRuns()
			for id := range conf {
				if len(runs[id]) == 0 {
					return false, fmt.Sprintf("job %s has not run before the fault", id)
				}
			}
			n := r30Pending(rdb, q, "g")
			return n == 0 && len(maybe) == 0, fmt.Sprintf("%d pending, %d maybe enqueued before the fault", n, len(maybe))
		})
		minAge = 100 * time.Millisecond
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		return hook.blockingInFlight(minAge), "no blocking read in flight"
	})

	faultStart := time.Now()
	// Health during the outage: not Ready within Block plus half the rest of
	// the visibility timeout (docs/deploy.md), whether the blocked read
	// has a deadline or not.
	var notReadyAt atomic.Int64
	probeDone := make(chan struct{})
	probeStop := make(chan struct{})
	go func() {
		defer close(probeDone)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-probeStop:
				return
			case <-tk.C:
			}
			if !rc.c.Health().Ready && notReadyAt.Load() == 0 {
				notReadyAt.Store(int64(time.Since(faultStart)))
			}
		}
	}()
	switch c.fault {
	case "stop":
		srv.Stop()
		time.Sleep(outage) // the outage itself
		srv.Cont()
	case "kill":
		srv.Kill9()
		time.Sleep(outage) // the outage itself
		srv.Restart()
	case "blackhole":
		proxy.Blackhole()
		time.Sleep(outage) // the outage itself
		proxy.Pass()
	case "delay":
		proxy.Delay(faultproxy.Latency{}, faultproxy.Latency{Fixed: 3 * time.Second})
		time.Sleep(outage) // the outage itself
		proxy.Pass()
	}
	close(probeStop)
	<-probeDone
	if d := time.Duration(notReadyAt.Load()); d == 0 {
		t.Errorf("Health stayed Ready through a %v outage (ReadTimeout %v); docs/deploy.md: not ready after Block + (VisibilityTimeout - Block)/2 = %v without an answer to a read",
			outage, c.rt, block+(visibility-block)/2)
	} else {
		t.Logf("not Ready %v into the outage", d.Round(time.Millisecond))
	}
	faultEnd := time.Now()
	prod.paused.Store(false)
	for _, r := range hook.snapshot() {
		if r.block && r.start.Before(faultStart) && (r.end.IsZero() || r.end.After(faultStart)) {
			hit = true
		}
	}
	time.Sleep(6 * time.Second) // live traffic after the fault
	prod.stop()
	producing = false
	rc.running(t)

	// In and out: every confirmed job ran; nothing is left pending; the
	// consumer is idle (a read found nothing new).
	eventually(t, 60*time.Second, func() (bool, string) {
		conf, _, _ := prod.state()
		runs := ledger.copyRuns()
		missing := 0
		example := ""
		for id := range conf {
			if len(runs[id]) == 0 {
				missing++
				example = id
			}
		}
		n := r30Pending(rdb, q, "g")
		return missing == 0 && n == 0, fmt.Sprintf("%d of %d confirmed jobs never ran (e.g. %s), %d pending", missing, len(conf), example, n)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := rc.c.WaitIdle(ctx); err != nil {
		t.Errorf("WaitIdle after the outage: %v", err)
	}
	cancel()
	rc.running(t)
	eventually(t, 30*time.Second, func() (bool, string) {
		h := rc.c.Health()
		return h.Ready, "not Ready after the outage: " + h.Problem
	})

	conf, maybe, attempted := prod.state()
	runs := ledger.copyRuns()
	var unexplained, explained []string
	maybeRan := 0
	var lateMax time.Duration
	for id, rs := range runs {
		if !attempted[id] {
			t.Errorf("job %s ran but was never enqueued", id)
			continue
		}
		if maybe[id] {
			maybeRan++
		}
		if at, ok := conf[id]; ok && at.After(faultEnd.Add(4*time.Second)) {
			lateMax = max(lateMax, rs[0].end.Sub(at))
		}
		if len(rs) < 2 {
			continue
		}
		d := fmt.Sprintf("%s ran %d times (first ended %v after the fault began, entries %v)", id, len(rs),
			rs[0].end.Sub(faultStart).Round(time.Millisecond), func() []string {
				var e []string
				for _, r := range rs {
					e = append(e, r.entry)
				}
				return e
			}())
		// A run that completed and was then run again must have lost its
		// settlement or lease to the fault: it ended around it.
		if !c.idle && rs[0].end.After(faultStart.Add(-6*time.Second)) && rs[0].end.Before(faultEnd.Add(10*time.Second)) {
			explained = append(explained, d)
		} else {
			unexplained = append(unexplained, d)
		}
	}
	sort.Strings(unexplained)
	for _, d := range unexplained[:min(len(unexplained), 5)] {
		t.Errorf("doubled: %s", d)
	}
	if len(unexplained) > 0 {
		t.Errorf("%d jobs ran twice that the fault cannot explain (idle: %v)", len(unexplained), c.idle)
	}
	for _, d := range explained {
		t.Logf("ran again, explained by the fault: %s", d)
	}
	if lateMax > 30*time.Second {
		t.Errorf("a job enqueued 4 s after Redis came back waited %v to run; want the consumer running jobs again", lateMax)
	}

	// Read errors stop once Redis is back: a few idle blocking reads add
	// none (unless the machine stalled, which the watch tells).
	watch := redistest.WatchStalls(rdb, 300*time.Millisecond)
	before := rc.c.Stats().ReadErrors
	time.Sleep(4 * block) // idle blocking reads
	after := rc.c.Stats().ReadErrors
	longest := watch.Longest()
	watch.Stop()
	if after != before {
		if longest > block/2 {
			t.Logf("read errors grew %d -> %d while idle after the outage, during a %v stall of this machine", before, after, longest)
		} else {
			t.Errorf("read errors grew %d -> %d while idle after the outage (no stall over %v): idle blocking reads fail", before, after, longest)
		}
	}

	raw, typed, failed, waited := hook.blockCounts()
	// The reads blocking for the whole of Block go the documented way
	// (shorter ones: TestAttack30Read_typedBlockingRead); a raw one leaves
	// ReadTimeout a second past its BLOCK, or has none.
	for _, r := range hook.snapshot() {
		if r.block && time.Duration(r.blockMS)*time.Millisecond == block && r.raw != c.raw {
			t.Errorf("ReadTimeout %v, Block %v: a read blocking for Block went raw: %v; want raw: %v (README): %s", c.rt, block, r.raw, c.raw, r.args)
			break
		}
	}
	if r := hook.badRaw(c.rt); r != "" {
		t.Errorf("ReadTimeout %v: a raw blocking read leaves the read deadline less than a second past its BLOCK: %s", c.rt, r)
	}
	if waited == 0 {
		t.Errorf("no blocking read waited Block and came back empty without error")
	}
	st := rc.c.Stats()
	t.Logf("run %d: outage %v (hit a blocking read: %v); %d confirmed, %d maybe enqueued (%d of them ran), %d jobs ran, %d explained doubles; blocking reads %d raw, %d typed, %d failed; a job enqueued after Redis was back waited at most %v; stats %+v",
		attempt, faultEnd.Sub(faultStart).Round(time.Millisecond), hit, len(conf), len(maybe), maybeRan, len(runs), len(explained), raw, typed, failed, lateMax.Round(time.Millisecond), st)
	return hit
}

// ---------------------------------------------------------------------------
// (2) ReadTimeout and Block near the margin.

type r30Margin struct {
	name  string
	rt    time.Duration
	block time.Duration // 0: the default (1 s)
	proto int
	raw   bool
}

// Idle consumers with ReadTimeout and Block near the documented margin
// (raw when ReadTimeout >= Block + 1 s or none: -1, -2; go-redis's default
// is 5 s): the blocking reads go the documented way, wait Block and come
// back empty without a read error, the jobs added now and then run (each
// once), and the read loop does not spin.
func TestAttack30Read_margin(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, c := range []r30Margin{
		{name: "rt2s-block1s/resp2", rt: 2 * time.Second, block: time.Second, proto: 2, raw: true},
		{name: "rt1.9s-block1s/resp3", rt: 1900 * time.Millisecond, block: time.Second, proto: 3, raw: false},
		{name: "rt1.999s-block1s/resp2", rt: 1999 * time.Millisecond, block: time.Second, proto: 2, raw: false},
		{name: "rt-1-block1s/resp2", rt: -1, block: time.Second, proto: 2, raw: true},
		{name: "rt-2-block1s/resp3", rt: -2, block: time.Second, proto: 3, raw: true},
		{name: "defaults/resp3", proto: 3, raw: true},
		{name: "rtdefault5s-block4.5s/resp2", block: 4500 * time.Millisecond, proto: 2, raw: false},
		{name: "rt5.5s-block4.5s/resp3", rt: 5500 * time.Millisecond, block: 4500 * time.Millisecond, proto: 3, raw: true},
	} {
		idle.Run(c.name, func(t *testing.T) {
			for attempt := 1; ; attempt++ {
				if r30MarginOnce(t, c) {
					return
				}
				if attempt == 3 {
					t.Skipf("the machine stalled in each of %d runs: the idle reads' errors could not be judged", attempt)
				}
			}
		})
	}
}

// r30MarginOnce runs one margin scenario and reports whether it could judge
// the read errors (false: errors came with a stall of the machine).
func r30MarginOnce(t *testing.T, c r30Margin) bool {
	block := c.block
	if block == 0 {
		block = consumer.DefaultBlock
	}
	crdb := r30Client(t, redistest.Addr(), c.proto, c.rt)
	hook := &r30Hook{}
	crdb.AddHook(hook)
	rdb := redistest.Shared(t)
	q := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, q+"*"); redistest.DeleteKeys(rdb, "{"+q+"}*") })
	ledger := newA30Ledger()
	watch := redistest.WatchStalls(rdb, 300*time.Millisecond)
	defer watch.Stop()
	rc := r30Start(t, crdb, consumer.Config{Stream: q, Group: "g", Consumer: "c", Block: c.block}, ledger.handler(0))
	rc.waitReading(t)

	// Cycles of one timed-out idle read and one read woken by a job.
	cycles := 5
	if block > 2*time.Second {
		cycles = 3
	}
	var ids []string
	start := time.Now()
	for i := range cycles {
		time.Sleep(block * 16 / 10) // idle
		id := fmt.Sprintf("m%d", i)
		rawXADD(t, rdb, q, "*", "type", "decoy", "type", "t", "job_id", id, "payload", "\x00\r\n")
		ids = append(ids, id)
	}
	time.Sleep(block * 12 / 10) // idle
	elapsed := time.Since(start)
	eventually(t, 60*time.Second, func() (bool, string) {
		runs := ledger.copyRuns()
		n := 0
		for _, id := range ids {
			if len(runs[id]) > 0 {
				n++
			}
		}
		return n == len(ids), fmt.Sprintf("%d of %d jobs ran", n, len(ids))
	})
	rc.running(t)
	runs := ledger.copyRuns()
	for id, rs := range runs {
		if len(rs) != 1 || !slices.Contains(ids, id) {
			t.Errorf("job %s ran %d times; want each job added once, once", id, len(rs))
		}
	}
	if p := r30Pending(rdb, q, "g"); p > 0 {
		eventually(t, 30*time.Second, func() (bool, string) {
			p := r30Pending(rdb, q, "g")
			return p == 0, fmt.Sprintf("%d pending", p)
		})
	}

	raw, typed, failed, waited := hook.blockCounts()
	st := rc.c.Stats()
	longest := watch.Longest()
	t.Logf("ReadTimeout %v, Block %v, RESP%d: %d raw and %d typed blocking reads in %v (%d failed, %d waited Block); read errors %d; longest stall %v",
		c.rt, block, c.proto, raw, typed, elapsed.Round(time.Millisecond), failed, waited, st.ReadErrors, longest)
	// The reads that block for the whole of Block go the documented way
	// (shorter ones: TestAttack30Read_typedBlockingRead); every raw one
	// leaves ReadTimeout a second past its BLOCK, or has none.
	fullRaw, fullTyped := 0, 0
	for _, r := range hook.snapshot() {
		if r.block && time.Duration(r.blockMS)*time.Millisecond == block {
			if r.raw {
				fullRaw++
			} else {
				fullTyped++
			}
		}
	}
	t.Logf("reads with BLOCK = Block: %d raw, %d typed", fullRaw, fullTyped)
	if c.raw && (fullRaw == 0 || fullTyped != 0) || !c.raw && (fullTyped == 0 || fullRaw != 0) {
		t.Errorf("ReadTimeout %v, Block %v: %d raw and %d typed reads blocking for Block; want them all raw: %v (README: raw when ReadTimeout is at least Block plus a second, or has none)",
			c.rt, block, fullRaw, fullTyped, c.raw)
	}
	if r := hook.badRaw(c.rt); r != "" {
		t.Errorf("ReadTimeout %v: a raw blocking read leaves the read deadline less than a second past its BLOCK: %s", c.rt, r)
	}
	if waited == 0 {
		t.Errorf("no idle blocking read waited its BLOCK and came back without an error")
	}
	if over := r30BlockOver(hook, block); over != "" {
		t.Errorf("a read blocks longer than Config.Block %v: %s", block, over)
	}
	// A spinning loop would read far more often than once per Block.
	if limit := int(elapsed/block)*2 + 2*len(ids) + 10; raw+typed > limit {
		t.Errorf("%d blocking reads in %v with Block %v; want at most %d (no hot loop)", raw+typed, elapsed.Round(time.Millisecond), block, limit)
	}
	if st.ReadErrors != 0 || failed != 0 {
		if longest > block/2 {
			t.Logf("%d read errors (%d failed blocking reads) beside a %v stall of the machine: running again", st.ReadErrors, failed, longest)
			return false
		}
		t.Errorf("ReadTimeout %v, Block %v: %d read errors, %d failed blocking reads while idle (longest stall %v); want none",
			c.rt, block, st.ReadErrors, failed, longest)
	}
	return true
}

// Each blocking read goes raw when the client's ReadTimeout leaves a second
// past that read's BLOCK, else typed (README): the consumer blocks for less
// than Config.Block when it wakes early for a sweep, so with a ReadTimeout
// under Block plus a second its short reads may go raw, its full ones stay
// typed. (This outside test found the README saying Config.Block decides;
// the rule is the read's own BLOCK.)
func TestAttack30Read_typedBlockingRead(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, c := range []struct {
		name      string
		rt, block time.Duration
		sweep     time.Duration
		proto     int
	}{
		{"rt1.9s-block1s/resp2", 1900 * time.Millisecond, time.Second, 700 * time.Millisecond, 2},
		{"rtdefault5s-block4.5s/resp3", 0, 4500 * time.Millisecond, 2 * time.Second, 3},
		{"rt1.5s-block1s/resp3", 1500 * time.Millisecond, time.Second, 0, 3},
	} {
		idle.Run(c.name, func(t *testing.T) {
			crdb := r30Client(t, redistest.Addr(), c.proto, c.rt)
			hook := &r30Hook{}
			crdb.AddHook(hook)
			rdb := redistest.Shared(t)
			q := redistest.Name(t)
			t.Cleanup(func() { redistest.DeleteKeys(rdb, q+"*"); redistest.DeleteKeys(rdb, "{"+q+"}*") })
			ledger := newA30Ledger()
			rc := r30Start(t, crdb, consumer.Config{Stream: q, Group: "g", Consumer: "c", Block: c.block, SweepInterval: c.sweep},
				ledger.handler(0))
			rc.waitReading(t)
			idle := 2 * max(c.sweep, c.block)
			time.Sleep(idle)
			rawXADD(t, rdb, q, "*", "type", "t", "job_id", "one", "payload", "{}")
			eventually(t, 60*time.Second, func() (bool, string) {
				return len(ledger.copyRuns()["one"]) == 1, "the job did not run"
			})
			time.Sleep(idle)
			rc.running(t)
			raw, typed, failed, _ := hook.blockCounts()
			t.Logf("ReadTimeout %v, Block %v, SweepInterval %v: %d raw and %d typed blocking reads, %d failed, read errors %d",
				c.rt, c.block, c.sweep, raw, typed, failed, rc.c.Stats().ReadErrors)
			if raw+typed == 0 {
				t.Errorf("no blocking read in %v idle", 2*idle)
			}
			if r := hook.badRaw(c.rt); r != "" {
				t.Errorf("a raw blocking read leaves the read deadline less than a second past its BLOCK: %s", r)
			}
			if r := hook.badTyped(c.rt); r != "" {
				t.Errorf("a typed blocking read whose BLOCK leaves a second to ReadTimeout %v (README: it goes raw): %s", c.rt, r)
			}
			if failed > 0 || rc.c.Stats().ReadErrors > 0 {
				t.Errorf("%d blocking reads failed, %d read errors", failed, rc.c.Stats().ReadErrors)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// (3) Shutdown of an idle consumer.

type r30Shutdown struct {
	name       string
	rt         time.Duration
	proto      int
	ctxTimeout bool // ContextTimeoutEnabled
	cancel     bool // cancel Run's context instead of calling Shutdown
}

// Shutdown (or cancelling Run's context) of a consumer idle in a blocking
// read returns within about Block (README: "Config.Block (1 s) bounds how
// long shutdown waits for a blocked read unless the client has
// ContextTimeoutEnabled"), whichever way the read goes and however long the
// client's ReadTimeout. Block is 3 s; the bound allowed is Block + 5 s.
func TestAttack30Read_shutdownIdle(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	const block = 3 * time.Second
	for _, c := range []r30Shutdown{
		{name: "rtdefault/resp3", proto: 3},
		{name: "rt3.9s-typed/resp2", rt: 3900 * time.Millisecond, proto: 2},
		{name: "rt60s/resp2", rt: 60 * time.Second, proto: 2},
		{name: "rt-1/resp3", rt: -1, proto: 3},
		{name: "rt-2/resp2", rt: -2, proto: 2},
		{name: "rt-1-ctxtimeout/resp2", rt: -1, proto: 2, ctxTimeout: true},
		{name: "rt60s-cancel/resp3", rt: 60 * time.Second, proto: 3, cancel: true},
		{name: "rt-2-cancel/resp2", rt: -2, proto: 2, cancel: true},
	} {
		idle.Run(c.name, func(t *testing.T) {
			crdb := r30Client(t, redistest.Addr(), c.proto, c.rt, func(o *redis.Options) { o.ContextTimeoutEnabled = c.ctxTimeout })
			hook := &r30Hook{}
			crdb.AddHook(hook)
			rdb := redistest.Shared(t)
			q := redistest.Name(t)
			t.Cleanup(func() { redistest.DeleteKeys(rdb, q+"*"); redistest.DeleteKeys(rdb, "{"+q+"}*") })
			for round := range 2 {
				ledger := newA30Ledger()
				cfg := consumer.Config{Stream: q, Group: "g", Consumer: fmt.Sprintf("c%d", round), Block: block}
				ctx, cancelRun := context.WithCancel(context.Background())
				t.Cleanup(cancelRun)
				rc := r30StartCtx(t, ctx, crdb, cfg, ledger.handler(0))
				rc.waitReading(t)
				// A job first, so that the consumer has worked, then idle.
				id := fmt.Sprintf("s%d", round)
				rawXADD(t, rdb, q, "*", "type", "t", "job_id", id, "payload", "{}")
				eventually(t, 60*time.Second, func() (bool, string) {
					return len(ledger.copyRuns()[id]) == 1, "the job did not run"
				})
				eventually(t, 30*time.Second, func() (bool, string) {
					return hook.blockingInFlight(300 * time.Millisecond), "no blocking read in flight"
				})
				start := time.Now()
				var serr error
				if c.cancel {
					cancelRun()
				} else {
					sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
					serr = rc.c.Shutdown(sctx)
					scancel()
				}
				select {
				case <-rc.ended:
				case <-time.After(90 * time.Second):
					t.Fatalf("Run did not return within 90 s")
				}
				rerr := rc.err
				took := time.Since(start)
				cancelRun()
				raw, typed, _, _ := hook.blockCounts()
				t.Logf("round %d: stopped in %v (Block %v); Shutdown %v, Run %v; blocking reads %d raw, %d typed", round,
					took.Round(time.Millisecond), block, serr, rerr, raw, typed)
				if serr != nil || rerr != nil {
					t.Errorf("Shutdown returned %v and Run %v; want nil for an idle consumer", serr, rerr)
				}
				if took > block+5*time.Second {
					t.Errorf("an idle consumer took %v to stop with Block %v, ReadTimeout %v; want about Block at most (README, Lifecycle)",
						took.Round(time.Millisecond), block, c.rt)
				}
				if n := len(ledger.copyRuns()); n != 1 {
					t.Errorf("%d jobs ran; want 1", n)
				}
			}
		})
	}
}

// Shutdown of an idle consumer while Redis is frozen (SIGSTOP) in the middle
// of its blocking read: Shutdown returns within its deadline plus about a
// second (README, Guarantees: "Bounded shutdown"), and Run returns once
// Redis answers again, with no job lost.
func TestAttack30Read_shutdownFrozen(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, c := range []struct {
		name  string
		rt    time.Duration
		proto int
	}{
		{"rt2s/resp3", 2 * time.Second, 3},
		{"rt-1/resp2", -1, 2},
		{"rt1.5s-typed/resp3", 1500 * time.Millisecond, 3},
	} {
		idle.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{})
			crdb := r30Client(t, srv.Addr(), c.proto, c.rt)
			hook := &r30Hook{}
			crdb.AddHook(hook)
			rdb := r30Client(t, srv.Addr(), 2, 0)
			ledger := newA30Ledger()
			const q = "q"
			rc := r30Start(t, crdb, consumer.Config{Stream: q, Group: "g", Consumer: "c"}, ledger.handler(0))
			frozen := false
			t.Cleanup(func() { // before rc's cleanup
				if frozen {
					srv.Cont()
				}
			})
			rc.waitReading(t)
			for i := range 20 {
				rawXADD(t, rdb, q, "*", "type", "t", "job_id", fmt.Sprintf("f%d", i), "payload", "{}")
			}
			eventually(t, 60*time.Second, func() (bool, string) {
				n := len(ledger.copyRuns())
				return n == 20 && r30Pending(rdb, q, "g") == 0, fmt.Sprintf("%d of 20 jobs ran", n)
			})
			eventually(t, 30*time.Second, func() (bool, string) {
				return hook.blockingInFlight(100 * time.Millisecond), "no blocking read in flight"
			})
			srv.Stop()
			frozen = true
			const deadline = 2 * time.Second
			start := time.Now()
			sctx, scancel := context.WithTimeout(context.Background(), deadline)
			serr := rc.c.Shutdown(sctx)
			scancel()
			took := time.Since(start)
			time.Sleep(time.Second) // still frozen: Run may be waiting for the read
			srv.Cont()
			frozen = false
			select {
			case <-rc.ended:
			case <-time.After(60 * time.Second):
				t.Fatal("Run did not return within 60 s of Redis answering again")
			}
			rerr := rc.err
			runEnd := time.Since(start)
			t.Logf("Shutdown returned %v after %v (deadline %v); Run returned %v after %v", serr, took.Round(time.Millisecond), deadline, rerr, runEnd.Round(time.Millisecond))
			if took > deadline+5*time.Second {
				t.Errorf("Shutdown with a %v deadline took %v while Redis was frozen; want its deadline plus about a second (README, Bounded shutdown)", deadline, took.Round(time.Millisecond))
			}
			runs := ledger.copyRuns()
			for i := range 20 {
				if n := len(runs[fmt.Sprintf("f%d", i)]); n != 1 {
					t.Errorf("job f%d ran %d times; want once", i, n)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------
// (5) Duplicate names and binary values on every read path.

// r30Seen is what a handler saw of one run.
type r30Seen struct {
	entry, typ string
	payload    string
	headers    map[string]string
	extra      map[string]string
	attempt    int
}

// r30Bin returns n pseudo-random bytes led by RESP markers, seeded by seed.
func r30Bin(seed uint64, n int) string {
	const markers = "\r\n$-1\r\n*2\r\n_\r\n%1\r\n>3\r\n:1\r\n+OK\r\n-ERR x\r\n\x00\xff"
	r := rand.New(rand.NewPCG(seed, 30))
	b := []byte(markers)
	for len(b) < n {
		b = append(b, byte(r.Uint32()))
	}
	return string(b[:n])
}

// r30Size is the size the decoder counts: the names and last values of the
// entry's distinct names (docs/wire-format.md).
func r30Size(fields []string) int {
	last := map[string]string{}
	for i := 0; i+1 < len(fields); i += 2 {
		last[fields[i]] = fields[i+1]
	}
	n := 0
	for k, v := range last {
		n += len(k) + len(v)
	}
	return n
}

// r30Cut cuts each value to its first KiB, as an oversize entry's dead letter
// keeps it (SECURITY.md).
func r30Cut(fields []string) []string {
	out := slices.Clone(fields)
	for i := 1; i < len(out); i += 2 {
		if len(out[i]) > 1024 {
			out[i] = out[i][:1024]
		}
	}
	return out
}

// r30Merged is fields as go-redis's typed read keeps them: the last value of
// each name, in name order, values cut to 1 KiB.
func r30Merged(fields []string) []string {
	last := map[string]string{}
	for i := 0; i+1 < len(fields); i += 2 {
		last[fields[i]] = fields[i+1]
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(last)) {
		out = append(out, k, last[k])
	}
	return r30Cut(out)
}

var r30SizeRE = regexp.MustCompile(`field "([^"]*)": entry is (\d+) bytes, over the limit of (\d+)`)

// An entry with duplicate names and binary values runs with the last value of
// each name, whichever path delivered it (a backlog read, a raw or typed
// blocking read, the re-read of the consumer's own pending entries, a
// reclaim after the visibility timeout), and on RESP2 and RESP3; a retry
// carries those values over; only the last values count toward the size
// limit (an entry whose earlier payload is huge but last is small runs);
// a malformed entry's dead letter is the stream's fields, every one, in
// order; an oversize entry's dead letter keeps the stream's order and
// duplicates, each value cut to 1 KiB (name order with one value a name only
// after a typed blocking read, docs/wire-format.md), and names the size
// counted from the last values. Every entry ends once: run or dead-lettered.
func TestAttack30Read_fields(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"backlog", "blocking-raw", "blocking-typed", "own", "reclaim"} {
		for _, proto := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/resp%d", path, proto), func(t *testing.T) {
				t.Parallel()
				r30Fields(t, path, proto)
			})
		}
	}
}

func r30Fields(t *testing.T, path string, proto int) {
	const maxBytes = 64 << 10
	ctx := context.Background()
	rt := time.Duration(0) // go-redis's 5 s: raw blocking reads
	block := 200 * time.Millisecond
	if path == "blocking-typed" {
		rt = time.Second // under Block plus a second: typed blocking reads
	}
	crdb := r30Client(t, redistest.Addr(), proto, rt)
	hook := &r30Hook{}
	crdb.AddHook(hook)
	rdb := redistest.Shared(t)
	q := redistest.Name(t)
	keys, _ := stream.KeysFor(q)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, q+"*"); redistest.DeleteKeys(rdb, "{"+q+"}*") })
	if err := rdb.XGroupCreateMkStream(ctx, q, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}

	binName := "\x00\xff\r\n$1"
	bin1, bin2, bin3 := r30Bin(1, 300), r30Bin(2, 5000), r30Bin(3, 77)
	big70, big60 := r30Bin(4, 70<<10), r30Bin(5, 60<<10)
	zbin := r30Bin(6, 2000)
	type entry struct {
		name   string   // what it is
		fields []string // as added
		dead   bool     // dead-lettered (malformed)
		over   bool     // oversize
	}
	dup := func(typ, id string) []string {
		return []string{"type", "decoy", "payload", bin1, "job_id", "decoy", "h.k", "1", "type", typ, "origin", "a",
			"job_id", id, "h." + binName, "x", "payload", bin2, "origin", "b", "h.k", bin3}
	}
	entries := []entry{
		{name: "dup", fields: dup("t", "D")},
		{name: "failonce", fields: dup("f", "F")},
		{name: "bigdup", fields: []string{"type", "t", "payload", big70, "job_id", "B", "payload", big60}},
		{name: "emptyid", fields: []string{"type", "t", "job_id", "X", "payload", "p", "job_id", ""}},
		{name: "attfix", fields: []string{"type", "t", "attempt", "x", "job_id", "A", "attempt", "0"}},
		{name: "attbad", fields: []string{"type", "t", "job_id", "M", "attempt", "0", "h.k", "v1", "payload", bin1, "h.k", "v2", "attempt", "x"}, dead: true},
		{name: "over", fields: []string{"type", "t", "zeta", "z1", "payload", "small", "zeta", zbin, "job_id", "O", "payload", big70, "alpha", "a"}, dead: true, over: true},
	}
	fillers := 120
	if strings.HasPrefix(path, "blocking") {
		fillers = 20
	}
	for i := range fillers {
		entries = append(entries, entry{name: "filler", fields: []string{"type", "x", "job_id", "N" + strconv.Itoa(i), "type", "t", "payload", r30Bin(uint64(100+i), 40+i)}})
	}

	var mu sync.Mutex
	seen := map[string][]r30Seen{} // job ID: runs
	handler := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		seen[j.ID] = append(seen[j.ID], r30Seen{entry: j.EntryID, typ: j.Type, payload: string(j.Payload),
			headers: maps.Clone(j.Headers), extra: maps.Clone(j.Extra), attempt: j.Attempt})
		n := len(seen[j.ID])
		mu.Unlock()
		if j.Type == "f" && n == 1 {
			return errors.New("once")
		}
		return nil
	})
	processed := func() int { // runs plus dead letters
		mu.Lock()
		n := 0
		for _, s := range seen {
			n += len(s)
		}
		mu.Unlock()
		return n + int(rdb.XLen(ctx, keys.Dead).Val())
	}
	cfg := consumer.Config{Stream: q, Group: "g", Consumer: "c", Concurrency: 4, MaxEntryBytes: maxBytes, Block: block,
		PromoteInterval: 20 * time.Millisecond, Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 10 * time.Millisecond}}

	entryIDs := make([]string, len(entries))
	add := func(i int) { entryIDs[i] = rawXADD(t, rdb, q, "*", entries[i].fields...) }
	var rc *r30Cons
	switch path {
	case "backlog", "own", "reclaim":
		for i := range entries {
			add(i)
		}
		if path != "backlog" {
			reader := map[string]string{"own": "c", "reclaim": "gone"}[path]
			if err := rdb.Do(ctx, "XREADGROUP", "GROUP", "g", reader, "COUNT", len(entries), "STREAMS", q, ">").Err(); err != nil {
				t.Fatal(err)
			}
			cfg.VisibilityTimeout, cfg.SweepInterval = time.Second, 100*time.Millisecond
		}
		rc = r30Start(t, crdb, cfg, handler)
	default: // each entry added while the consumer waits in a blocking read
		rc = r30Start(t, crdb, cfg, handler)
		rc.waitReading(t)
		for i := range entries {
			eventually(t, 30*time.Second, func() (bool, string) {
				return hook.blockingInFlight(20 * time.Millisecond), "no blocking read in flight"
			})
			before := processed()
			add(i)
			eventually(t, 30*time.Second, func() (bool, string) {
				return processed() > before, fmt.Sprintf("entry %d (%s) not processed", i, entries[i].name)
			})
		}
	}

	// In and out: every good job ran to completion, every bad entry is one
	// dead letter, nothing pending.
	wantRuns := func(e entry) int {
		if e.dead {
			return 0
		}
		if e.name == "failonce" {
			return 2
		}
		return 1
	}
	jobID := func(i int) string {
		e := entries[i]
		if e.name == "emptyid" {
			return entryIDs[i] // an empty job_id is an absent one
		}
		last := ""
		for k := 0; k+1 < len(e.fields); k += 2 {
			if e.fields[k] == "job_id" {
				last = e.fields[k+1]
			}
		}
		return last
	}
	nDead := 0
	for _, e := range entries {
		if e.dead {
			nDead++
		}
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for i, e := range entries {
			if len(seen[jobID(i)]) < wantRuns(e) {
				return false, fmt.Sprintf("%s (%s) ran %d times, want %d", jobID(i), e.name, len(seen[jobID(i)]), wantRuns(e))
			}
		}
		d := rdb.XLen(ctx, keys.Dead).Val()
		p := r30Pending(rdb, q, "g")
		return d >= int64(nDead) && p == 0, fmt.Sprintf("%d dead letters (want %d), %d pending", d, nDead, p)
	})
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	if err := rc.c.WaitIdle(wctx); err != nil {
		t.Errorf("WaitIdle: %v", err)
	}
	wcancel()
	rc.running(t)

	mu.Lock()
	got := maps.Clone(seen)
	mu.Unlock()
	known := map[string]bool{}
	for i, e := range entries {
		id := jobID(i)
		known[id] = true
		rs := got[id]
		if len(rs) != wantRuns(e) {
			t.Errorf("%s (%s): ran %d times; want %d", id, e.name, len(rs), wantRuns(e))
			continue
		}
		for k, r := range rs {
			switch e.name {
			case "dup", "failonce":
				wantType := map[string]string{"dup": "t", "failonce": "f"}[e.name]
				wantH := map[string]string{"k": bin3, binName: "x"}
				if r.typ != wantType || r.payload != bin2 || !maps.Equal(r.headers, wantH) || !maps.Equal(r.extra, map[string]string{"origin": "b"}) {
					t.Errorf("%s run %d: type %q, payload of %d bytes (want the last, %d bytes: equal %v), headers %q, extra %q; want the last value of each name",
						id, k+1, r.typ, len(r.payload), len(bin2), r.payload == bin2, r.headers, r.extra)
				}
				if r.attempt != k {
					t.Errorf("%s run %d: attempt %d; want %d", id, k+1, r.attempt, k)
				}
			case "bigdup":
				if r.payload != big60 {
					t.Errorf("bigdup: payload of %d bytes, equal to the last (%d bytes): %v; want the last", len(r.payload), len(big60), r.payload == big60)
				}
			case "emptyid":
				if r.entry != entryIDs[i] || r.payload != "p" {
					t.Errorf("emptyid: ran as entry %s with payload %q; want job ID = entry ID %s", r.entry, r.payload, entryIDs[i])
				}
			case "attfix":
				if r.attempt != 0 {
					t.Errorf("attfix: attempt %d; want 0 (the last value)", r.attempt)
				}
			case "filler":
				if r.typ != "t" || r.payload != e.fields[7] {
					t.Errorf("%s: type %q, payload %q; want t, %q", id, r.typ, r.payload, e.fields[7])
				}
			}
		}
	}
	for id, rs := range got {
		if !known[id] {
			t.Errorf("a job %q ran %d times that no entry holds", id, len(rs))
		}
	}
	if st := rc.c.Stats(); st.DeadLettered != uint64(nDead) {
		t.Errorf("Stats().DeadLettered = %d; want %d", st.DeadLettered, nDead)
	}

	// The dead letters, read raw to see their order.
	res, err := rdb.Do(ctx, "XRANGE", keys.Dead, "-", "+").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != nDead {
		t.Errorf("%d dead letters; want %d", len(res), nDead)
	}
	for _, d := range res {
		var fields []string
		for _, v := range d.([]any)[1].([]any) {
			fields = append(fields, fmt.Sprint(v))
		}
		var job []string
		meta := map[string]string{}
		for i := 0; i+1 < len(fields); i += 2 {
			if strings.HasPrefix(fields[i], "dead_") {
				meta[fields[i]] = fields[i+1]
				continue
			}
			job = append(job, fields[i], fields[i+1])
		}
		jid := ""
		for i := 0; i+1 < len(job); i += 2 {
			if job[i] == "job_id" {
				jid = job[i+1]
			}
		}
		var e entry
		for _, x := range entries {
			if x.name == map[string]string{"M": "attbad", "O": "over"}[jid] {
				e = x
			}
		}
		if e.name == "" {
			t.Errorf("a dead letter of no bad entry: %.200q", job)
			continue
		}
		if meta["dead_reason"] != consumer.ReasonMalformed {
			t.Errorf("%s: dead_reason %q; want malformed", e.name, meta["dead_reason"])
		}
		switch {
		case !e.over:
			if !slices.Equal(job, e.fields) {
				t.Errorf("%s: dead letter fields %.300q; want the stream's, every one in order, %.300q (docs/wire-format.md: made from the stream itself)", e.name, job, e.fields)
			}
			if !strings.Contains(meta["dead_error"], `field "attempt"`) {
				t.Errorf("%s: dead_error %q; want it to name attempt", e.name, meta["dead_error"])
			}
		default:
			inOrder, merged := r30Cut(e.fields), r30Merged(e.fields)
			switch {
			case slices.Equal(job, inOrder):
			case path == "blocking-typed" && slices.Equal(job, merged):
				t.Logf("over: merged by the typed blocking read, as documented")
			default:
				t.Errorf("%s (%s): oversize dead letter fields %d long, first names %q; want the stream's order and duplicates, values cut to 1 KiB (%d long)",
					e.name, path, len(job), r30Names(job), len(inOrder))
			}
			m := r30SizeRE.FindStringSubmatch(meta["dead_error"])
			if m == nil {
				t.Errorf("over: dead_error %q; want the size error", meta["dead_error"])
			} else if want := strconv.Itoa(r30Size(e.fields)); m[1] != "payload" || m[2] != want {
				t.Errorf("over: dead_error names field %q and %s bytes; want payload and %s (the last value of each name counts)", m[1], m[2], want)
			}
		}
	}

	raw, typed, failed, _ := hook.blockCounts()
	t.Logf("%s, RESP%d: blocking reads %d raw, %d typed, %d failed; stats %+v", path, proto, raw, typed, failed, rc.c.Stats())
	if path == "blocking-raw" && (raw == 0 || typed != 0) || path == "blocking-typed" && (typed == 0 || raw != 0) {
		t.Errorf("%s: %d raw and %d typed blocking reads", path, raw, typed)
	}
}

// r30Names returns the names of fields (name, value, ...).
func r30Names(fields []string) []string {
	var out []string
	for i := 0; i < len(fields); i += 2 {
		out = append(out, fields[i])
	}
	return out
}

// ---------------------------------------------------------------------------
// Lost replies, vanished groups, shared reads.

// r30ReadCases are the clients lostReply and pool run against: raw blocking
// reads (ReadTimeout default and none) on RESP2 and RESP3, and typed ones
// (ReadTimeout 1.5 s).
var r30ReadCases = []struct {
	name  string
	rt    time.Duration
	proto int
}{
	{"raw/resp2", 0, 2},
	{"raw/resp3", 0, 3},
	{"rt-1/resp3", -1, 3},
	{"typed/resp2", 1500 * time.Millisecond, 2},
}

// The reply to a blocking read that delivered entries is lost (the proxy
// drops it and closes the connection: "command applied, reply lost"): the
// entries are pending under the consumer without having reached it, so they
// run once, after the visibility timeout, by the consumer's own sweep
// (README, Guarantees: "Bounded recovery"), and the consumer goes on
// reading; none runs twice, none is lost.
func TestAttack30Read_lostReply(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, c := range r30ReadCases {
		idle.Run(c.name, func(t *testing.T) {
			for attempt := 1; ; attempt++ {
				if r30LostReplyOnce(t, c.rt, c.proto) {
					return
				}
				if attempt == 3 {
					t.Skipf("in %d runs no blocking read's reply with entries was dropped", attempt)
				}
			}
		})
	}
}

// r30LostReplyOnce reports whether a blocking read's reply carrying entries
// was dropped (the scenario's precondition).
func r30LostReplyOnce(t *testing.T, rt time.Duration, proto int) bool {
	const (
		block      = time.Second
		visibility = 3 * time.Second
		sweep      = 500 * time.Millisecond
	)
	srv := redistest.Start(t, redistest.Options{})
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	crdb := r30Client(t, p.Addr(), proto, rt)
	hook := &r30Hook{}
	crdb.AddHook(hook)
	rdb := r30Client(t, srv.Addr(), 2, 0)
	const q = "q"
	ledger := newA30Ledger()
	rc := r30Start(t, crdb, consumer.Config{Stream: q, Group: "g", Consumer: "c", Block: block,
		VisibilityTimeout: visibility, SweepInterval: sweep}, ledger.handler(0))
	rc.waitReading(t)
	rawXADD(t, rdb, q, "*", "type", "t", "job_id", "warm", "payload", "{}")
	eventually(t, 30*time.Second, func() (bool, string) { return len(ledger.copyRuns()["warm"]) == 1, "warm-up job did not run" })

	// Arm the drop, wait for a blocking read sent after it, then add jobs:
	// the first wakes that read, whose reply is dropped.
	armed := time.Now()
	p.DropReplies(1, "xreadgroup")
	eventually(t, 30*time.Second, func() (bool, string) {
		for _, r := range hook.snapshot() {
			if r.block && r.start.After(armed) && r.end.IsZero() {
				return true, ""
			}
		}
		return false, "no blocking read sent after the drop was armed"
	})
	const n = 10
	ids := []string{"warm"}
	added := time.Now()
	for i := range n {
		id := fmt.Sprintf("l%d", i)
		rawXADD(t, rdb, q, "*", "type", "dup", "type", "t", "job_id", id, "payload", r30Bin(uint64(i), 100))
		ids = append(ids, id)
	}
	dropped := p.DropsLeft() == 0
	p.DropReplies(0, "")
	eventually(t, 60*time.Second, func() (bool, string) {
		runs := ledger.copyRuns()
		for _, id := range ids {
			if len(runs[id]) == 0 {
				return false, fmt.Sprintf("job %s has not run (%d pending)", id, r30Pending(rdb, q, "g"))
			}
		}
		n := r30Pending(rdb, q, "g")
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	took := time.Since(added)
	// Still reading: a job added now runs.
	rawXADD(t, rdb, q, "*", "type", "t", "job_id", "after", "payload", "{}")
	ids = append(ids, "after")
	eventually(t, 30*time.Second, func() (bool, string) {
		return len(ledger.copyRuns()["after"]) == 1, "a job added afterwards did not run"
	})
	rc.running(t)
	runs := ledger.copyRuns()
	for id, rs := range runs {
		if len(rs) != 1 || !slices.Contains(ids, id) {
			t.Errorf("job %s ran %d times; want once", id, len(rs))
		}
	}
	if len(runs) != len(ids) {
		t.Errorf("%d jobs ran; want %d", len(runs), len(ids))
	}
	st := rc.c.Stats()
	t.Logf("reply dropped: %v; all %d jobs ran within %v (visibility %v, sweep %v); stats %+v", dropped, n, took.Round(time.Millisecond), visibility, sweep, st)
	if dropped && took > visibility+sweep+block+20*time.Second {
		t.Errorf("the jobs of a lost read reply took %v to run; want about VisibilityTimeout + SweepInterval (+ Block)", took.Round(time.Millisecond))
	}
	return dropped && st.Reclaimed > 0
}

// The consumer group destroyed, or the stream deleted, under an idle
// consumer's blocking read (README, Lifecycle: "A consumer group that
// vanished ... is recreated from the first entry"): the consumer recreates
// it and runs every job added afterwards, once, on RESP2 and RESP3, with
// raw and typed blocking reads.
func TestAttack30Read_groupGone(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, how := range []string{"destroy", "del"} {
		for _, c := range []struct {
			name  string
			rt    time.Duration
			proto int
		}{
			{"raw/resp2", 0, 2},
			{"raw/resp3", 0, 3},
			{"typed/resp3", 1500 * time.Millisecond, 3},
		} {
			idle.Run(how+"/"+c.name, func(t *testing.T) {
				crdb := r30Client(t, redistest.Addr(), c.proto, c.rt)
				hook := &r30Hook{}
				crdb.AddHook(hook)
				rdb := redistest.Shared(t)
				q := redistest.Name(t)
				t.Cleanup(func() { redistest.DeleteKeys(rdb, q+"*"); redistest.DeleteKeys(rdb, "{"+q+"}*") })
				ctx := context.Background()
				ledger := newA30Ledger()
				rc := r30Start(t, crdb, consumer.Config{Stream: q, Group: "g", Consumer: "c"}, ledger.handler(0))
				rc.waitReading(t)
				var ids []string
				for i := range 5 {
					id := fmt.Sprintf("b%d", i)
					rawXADD(t, rdb, q, "*", "type", "t", "job_id", id, "payload", "{}")
					ids = append(ids, id)
				}
				// Settled and deleted, so that a group recreated from the
				// first entry has nothing to run again.
				eventually(t, 60*time.Second, func() (bool, string) {
					n := len(ledger.copyRuns())
					l := rdb.XLen(ctx, q).Val()
					return n == 5 && l == 0, fmt.Sprintf("%d of 5 jobs ran, stream length %d", n, l)
				})
				eventually(t, 30*time.Second, func() (bool, string) {
					return hook.blockingInFlight(100 * time.Millisecond), "no blocking read in flight"
				})
				if how == "destroy" {
					if err := rdb.XGroupDestroy(ctx, q, "g").Err(); err != nil {
						t.Fatal(err)
					}
				} else if err := rdb.Del(ctx, q).Err(); err != nil {
					t.Fatal(err)
				}
				gone := time.Now()
				for i := range 20 {
					id := fmt.Sprintf("a%d", i)
					rawXADD(t, rdb, q, "*", "type", "x", "type", "t", "job_id", id, "payload", r30Bin(uint64(i), 64))
					ids = append(ids, id)
					time.Sleep(50 * time.Millisecond) // traffic
				}
				eventually(t, 60*time.Second, func() (bool, string) {
					runs := ledger.copyRuns()
					for _, id := range ids {
						if len(runs[id]) == 0 {
							return false, fmt.Sprintf("job %s did not run after the group vanished", id)
						}
					}
					n := r30Pending(rdb, q, "g")
					return n == 0, fmt.Sprintf("%d pending", n)
				})
				took := time.Since(gone)
				rc.running(t)
				runs := ledger.copyRuns()
				for id, rs := range runs {
					if len(rs) != 1 {
						t.Errorf("job %s ran %d times; want once", id, len(rs))
					}
				}
				if len(runs) != len(ids) {
					t.Errorf("%d jobs ran; want %d", len(runs), len(ids))
				}
				raw, typed, failed, _ := hook.blockCounts()
				t.Logf("all jobs ran %v after the group vanished; blocking reads %d raw, %d typed, %d failed; stats %+v",
					took.Round(time.Millisecond), raw, typed, failed, rc.c.Stats())
				if st := rc.c.Stats(); st.ReadErrors > 10 {
					t.Errorf("%d read errors after one vanished group; want the consumer to recreate it, not to loop", st.ReadErrors)
				}
			})
		}
	}
}

// A Pool's shared blocking read (one XREADGROUP for the queues of one group
// and consumer name, ended with CLIENT UNBLOCK when a left-out queue gets
// room; docs/pool.md) on RESP2 and RESP3, raw and typed: with little room per
// queue (Max 1, no prefetch) the read is interrupted often while the queues
// are fed now and then; every job runs once, no queue counts a read error
// for an interrupted read, and a group destroyed under the read costs the
// other queue no read error and its own queue no job.
func TestAttack30Read_pool(t *testing.T) {
	t.Parallel()
	idle := runIdle(t)
	defer idle.Wait()
	for _, c := range r30ReadCases {
		idle.Run(c.name, func(t *testing.T) {
			crdb := r30Client(t, redistest.Addr(), c.proto, c.rt, func(o *redis.Options) { o.PoolSize = 10 })
			hook := &r30Hook{}
			crdb.AddHook(hook)
			rdb := redistest.Shared(t)
			tag := redistest.Name(t)
			t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+tag+"}*") })
			ctx := context.Background()
			qa, qb := "{"+tag+"}:a", "{"+tag+"}:b"
			ledger := newA30Ledger()
			logs := &syncBuffer{}
			pool := consumer.NewPool(crdb, consumer.PoolConfig{Concurrency: 2,
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			cfg := func(s string) consumer.Config {
				return consumer.Config{Stream: s, Group: "g", Consumer: "c", Prefetch: -1}
			}
			h := ledger.handler(20 * time.Millisecond)
			queueA := pool.Add(cfg(qa), consumer.QueueOptions{Max: 1}).Handle(h)
			queueB := pool.Add(cfg(qb), consumer.QueueOptions{Max: 1}).Handle(h)
			ended := make(chan struct{})
			var runErr error
			go func() { runErr = pool.Run(ctx); close(ended) }()
			t.Cleanup(func() {
				sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = pool.Shutdown(sctx)
				select {
				case <-ended:
				case <-time.After(60 * time.Second):
					t.Errorf("the pool's Run did not return within 60 s of Shutdown")
				}
				if t.Failed() {
					t.Logf("pool log (tail):\n%s", tail(logs.String(), 3000))
				}
			})
			running := func() {
				t.Helper()
				select {
				case <-ended:
					t.Fatalf("the pool's Run returned: %v", runErr)
				default:
				}
			}
			var ids []string
			add := func(q, id string) {
				rawXADD(t, rdb, q, "*", "type", "p", "type", "t", "job_id", id, "payload", r30Bin(uint64(len(ids)), 50))
				ids = append(ids, id)
			}
			waitAll := func(what string) {
				t.Helper()
				eventually(t, 60*time.Second, func() (bool, string) {
					runs := ledger.copyRuns()
					for _, id := range ids {
						if len(runs[id]) == 0 {
							return false, fmt.Sprintf("%s: job %s did not run", what, id)
						}
					}
					pa, pb := r30Pending(rdb, qa, "g"), r30Pending(rdb, qb, "g")
					return pa == 0 && pb == 0, fmt.Sprintf("%s: pending %d and %d", what, pa, pb)
				})
			}
			// Bursts into one queue at a time and into both, idle between.
			for round := range 6 {
				for i := range 4 {
					if round%3 != 1 {
						add(qa, fmt.Sprintf("a%d-%d", round, i))
					}
					if round%3 != 0 {
						add(qb, fmt.Sprintf("b%d-%d", round, i))
					}
				}
				time.Sleep(700 * time.Millisecond) // the jobs run, then idle
			}
			waitAll("bursts")
			running()
			stA, stB := queueA.Stats(), queueB.Stats()
			if stA.ReadErrors != 0 || stB.ReadErrors != 0 {
				t.Errorf("read errors %d and %d after interrupted shared reads; want none", stA.ReadErrors, stB.ReadErrors)
			}

			// Queue a's group destroyed under the shared read.
			eventually(t, 30*time.Second, func() (bool, string) {
				return hook.blockingInFlight(100 * time.Millisecond), "no shared blocking read in flight"
			})
			if err := rdb.XGroupDestroy(ctx, qa, "g").Err(); err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				add(qa, fmt.Sprintf("ga%d", i))
				add(qb, fmt.Sprintf("gb%d", i))
				time.Sleep(100 * time.Millisecond) // traffic
			}
			waitAll("after the group was destroyed")
			running()
			runs := ledger.copyRuns()
			for id, rs := range runs {
				if len(rs) != 1 || !slices.Contains(ids, id) {
					t.Errorf("job %s ran %d times; want once", id, len(rs))
				}
			}
			if len(runs) != len(ids) {
				t.Errorf("%d jobs ran; want %d", len(runs), len(ids))
			}
			stA2, stB2 := queueA.Stats(), queueB.Stats()
			raw, typed, failed, _ := hook.blockCounts()
			t.Logf("%d jobs; blocking reads %d raw, %d typed, %d failed; read errors a %d, b %d", len(ids), raw, typed, failed, stA2.ReadErrors, stB2.ReadErrors)
			if stB2.ReadErrors != stB.ReadErrors {
				t.Errorf("queue b counted %d read errors when queue a's group was destroyed; docs/pool.md: the other queue sees no read error", stB2.ReadErrors-stB.ReadErrors)
			}
		})
	}
}
