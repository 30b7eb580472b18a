package guard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/internal/redistest"
)

// gate counts the script calls of a client and holds the first one until
// release is closed.
type gate struct {
	calls   atomic.Int64
	release chan struct{}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := strings.ToLower(cmd.Name()); n == "evalsha" || n == "eval" {
			if g.calls.Add(1) == 1 {
				<-g.release
			}
		}
		return next(ctx, cmd)
	}
}
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Callers that arrive while a call is in flight are sent together, in one
// script call, by the first of them, as soon as the reply comes back; each
// gets its own reply.
func TestRunner_Do_batchesConcurrentCallers(t *testing.T) {
	t.Parallel()
	rdb, prefix := scriptClient(t)
	g := &gate{release: make(chan struct{})}
	rdb.AddHook(g)
	r := newRunner(rdb)
	const n = 64
	replies := make([]any, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Go(func() { replies[0], errs[0] = r.Do(t.Context(), LockAcquire(prefix+"k0", "t", time.Minute)) })
	for g.calls.Load() == 0 { // the first caller is sending
		time.Sleep(time.Millisecond)
	}
	for i := 1; i < n; i++ {
		wg.Go(func() {
			replies[i], errs[i] = r.Do(t.Context(), LockAcquire(prefix+"k"+strconv.Itoa(i), "t", time.Minute))
		})
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r.mu.Lock()
		queued := len(r.queue)
		r.mu.Unlock()
		if queued == n-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers queued, want %d", queued, n-1)
		}
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	wg.Wait()
	for i := range n {
		if f, ok := replies[i].(string); errs[i] != nil || !ok || f == "" {
			t.Fatalf("caller %d: reply %v, %v; want its fence", i, replies[i], errs[i])
		}
	}
	if c := g.calls.Load(); c != 2 {
		t.Errorf("%d script calls for %d callers, want 2: the first alone, the %d that queued meanwhile together", c, n, n-1)
	}
}

// A fence is above the fence the key still holds, even one ahead of the
// Redis clock, and refused past 2^53 (where doubles are no longer exact).
func TestOps_fenceAboveTombstone(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, shared) + "}:"
	defer redistest.DeleteKeys(shared, prefix+"*")
	r := newRunner(shared)
	for _, c := range []struct{ tomb, want string }{
		{"9000000000000000", "9000000000000001"},
		{"9007199254740990", "9007199254740991"},
		{"9007199254740991", ""},
	} {
		k := prefix + c.tomb
		shared.Set(t.Context(), k, c.tomb, time.Minute)
		v, err := r.Do(t.Context(), LockAcquire(k, "t", time.Minute))
		if c.want == "" {
			if err == nil || !strings.Contains(err.Error(), "fence out of range") {
				t.Errorf("after %s: %v, %v; want fence out of range", c.tomb, v, err)
			}
			continue
		}
		if err != nil || v != c.want {
			t.Errorf("after %s: %v, %v; want %s", c.tomb, v, err, c.want)
		}
	}
}

// Over maxmemory (noeviction), the operations that finish or release still
// apply, even the first write of their call (ops.lua primes it), while one
// that takes is refused with OOM and writes nothing.
func TestOps_releaseAndFinishWhenFull(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	ctx := t.Context()
	r := newRunner(rdb)
	lv, err := r.Do(ctx, LockAcquire("{q}:lock:a", "t", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	gv, err := r.Do(ctx, LockBegin("{q}:lock:b", "t", time.Minute, "{q}:idem:b", "o", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	hv, err := r.Do(ctx, LockBegin("{q}:lock:h", "t", time.Minute, "{q}:idem:h", "o", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"{q}:idem:c", "{q}:idem:d", "{q}:idem:i"} {
		if _, err := r.Do(ctx, RecordBegin(k, "o", time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	filled := 0
	fill := func(size int) {
		v := strings.Repeat("x", size)
		for i := 0; ; i++ {
			filled++
			err := rdb.Set(ctx, "fill:"+strconv.Itoa(filled), v, 0).Err()
			if err != nil && strings.HasPrefix(err.Error(), "OOM") {
				return
			}
			if err != nil || i > 100000 {
				t.Fatalf("filling: %v after %d", err, i)
			}
		}
	}
	fill(64 << 10)
	fill(64) // as close to the limit as a small write gets
	fence := func(v any) string { return v.(string) }
	result := []byte(strings.Repeat("r", 1024)) // the record grows
	for _, c := range []struct {
		name string
		op   *Op
	}{
		{"release", LockRelease("{q}:lock:a", LockValue(fence(lv), "t"), time.Minute)},
		{"finish", RecordFinish("{q}:idem:c", "o", "c", result, time.Hour)},
		{"release record", RecordRelease("{q}:idem:d", "o")},
		{"finish and release", FinishRelease("{q}:lock:b", LockValue(fence(gv), "t"), time.Minute, "{q}:idem:b", "c", "o", result, time.Hour)},
	} {
		// Each alone in its call: its write is the call's first.
		replies, errs := r.Send(ctx, []*Op{c.op})
		want := any(int64(1))
		if c.op.argv[0] == "gf" {
			want = int64(3) // record finished + 2 * lock released
		}
		if errs[0] != nil || fmt.Sprint(replies[0]) != fmt.Sprint(want) {
			t.Errorf("%s when full: %v, %v; want %v", c.name, replies[0], errs[0], want)
		}
	}
	fill(64) // the releases freed a little
	if v, err := r.Do(ctx, LockAcquire("{q}:lock:e", "t", time.Minute)); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Errorf("acquire when full: %v, %v; want OOM", v, err)
	}
	if n := rdb.Exists(ctx, "{q}:lock:e").Val(); n != 0 {
		t.Errorf("the refused acquire wrote its lock")
	}

	// Takes and finishes of one batch, in one call: the takes are refused
	// and write nothing, the finishes run.
	fill(64)
	g := &gate{release: make(chan struct{})}
	close(g.release)
	rdb.AddHook(g)
	replies, errs := r.Send(ctx, []*Op{
		FinishRelease("{q}:lock:h", LockValue(fence(hv), "t"), time.Minute, "{q}:idem:h", "c", "o", result, time.Hour),
		LockAcquire("{q}:lock:e", "t", time.Minute),
		RecordFinish("{q}:idem:i", "o", "c", result, time.Hour),
		LockBegin("{q}:lock:f", "t", time.Minute, "{q}:idem:f", "o", time.Minute),
		RecordBegin("{q}:idem:g", "o", time.Minute),
	})
	if n := g.calls.Load(); n != 1 {
		t.Errorf("a batch of takes and finishes made %d script calls, want 1", n)
	}
	for i, want := range []string{"3", "OOM", "1", "OOM", "OOM"} {
		got := fmt.Sprint(replies[i])
		if errs[i] != nil {
			got = errs[i].Error()
		}
		if !strings.HasPrefix(got, want) {
			t.Errorf("operation %d of a mixed batch when full: %s, want %s", i, got, want)
		}
	}
	if n := rdb.Exists(ctx, "{q}:lock:e", "{q}:lock:f", "{q}:idem:f", "{q}:idem:g").Val(); n != 0 {
		t.Errorf("the refused takes of a mixed batch wrote %d keys", n)
	}
}

// A call with a take after another operation fails whole and writes
// nothing: over maxmemory the take would run (Send never sends one).
func TestOps_takeAfterOtherRefused(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, shared) + "}:"
	defer redistest.DeleteKeys(shared, prefix+"*")
	ops := []*Op{RecordRelease(prefix+"r", "o"), LockAcquire(prefix+"k", "t", time.Minute)}
	cmd := scriptCmd(t.Context(), gather(ops, []int{0, 1}), true)
	_ = shared.Process(t.Context(), cmd)
	err := cmd.Err()
	if err == nil || !strings.Contains(err.Error(), "a take after another operation") {
		t.Fatalf("take after a release: %v; want the call refused", err)
	}
	if n := shared.Exists(t.Context(), prefix+"k").Val(); n != 0 {
		t.Errorf("the refused call wrote the lock")
	}
}

// An operation posted before another one of the same key is applied first,
// even when a batch also holds operations of other kinds that come first:
// a release posted by a job that returned, then the acquire of the next
// job of the key.
func TestRunner_Post_keepsOrder(t *testing.T) {
	t.Parallel()
	rdb, prefix := scriptClient(t)
	r := newRunner(rdb)
	v, err := r.Do(t.Context(), LockAcquire(prefix+"k", "a", time.Minute))
	f, ok := v.(string)
	if err != nil || !ok {
		t.Fatalf("acquire: %v, %v", v, err)
	}
	g := &gate{release: make(chan struct{})}
	rdb.AddHook(g)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = r.Do(t.Context(), LockAcquire(prefix+"first", "t", time.Minute)) })
	for g.calls.Load() == 0 { // the first caller is sending
		time.Sleep(time.Millisecond)
	}
	queued := func(n int) {
		deadline := time.Now().Add(time.Minute)
		for {
			r.mu.Lock()
			q := len(r.queue)
			r.mu.Unlock()
			if q == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d operations queued, want %d", q, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	var other, next any
	var nextErr error
	wg.Go(func() { other, _ = r.Do(t.Context(), LockAcquire(prefix+"other", "t", time.Minute)) })
	queued(1)
	r.Post(LockRelease(prefix+"k", LockValue(f, "a"), time.Minute))
	wg.Go(func() { next, nextErr = r.Do(t.Context(), LockAcquire(prefix+"k", "b", time.Minute)) })
	queued(3)
	close(g.release)
	wg.Wait()
	if _, ok := other.(string); !ok {
		t.Fatalf("acquire of another key: %v", other)
	}
	if n, ok := next.(string); nextErr != nil || !ok || n <= f {
		t.Fatalf("acquire after the posted release: %v, %v; want a fence above %s", next, nextErr, f)
	}
}

// Tokens are 32 hex characters and do not repeat.
func TestToken(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10000 {
		k := Token()
		if len(k) != 32 || strings.Trim(k, "0123456789abcdef") != "" || seen[k] {
			t.Fatalf("token %q: want 32 hex characters, not seen before", k)
		}
		seen[k] = true
	}
}

// A key that holds another type fails its own operation only: the other
// operations of the same script call apply, and the failed ones write
// nothing. A fused begin takes both its lock and its record.
func TestOps_wrongTypeIsPerOperation(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	ctx := t.Context()
	prefix := "{" + redistest.Prefix(t, shared) + "}:"
	defer redistest.DeleteKeys(shared, prefix+"*")
	for _, k := range []string{"list:lock", "list:rec", "list:rec2"} {
		shared.RPush(ctx, prefix+k, "x")
	}
	r := newRunner(shared)
	ops := []*Op{
		LockBegin(prefix+"ok:lock", "t1", time.Minute, prefix+"ok:rec", "o1", time.Minute),
		LockBegin(prefix+"list:lock", "t2", time.Minute, prefix+"no:rec", "o2", time.Minute),
		LockBegin(prefix+"no:lock", "t3", time.Minute, prefix+"list:rec", "o3", time.Minute),
		RecordBegin(prefix+"list:rec2", "o4", time.Minute),
		LockAcquire(prefix+"ok:lock2", "t5", time.Minute),
	}
	if calls := plan(ops); len(calls) != 1 {
		t.Fatalf("plan: %d calls; want one", len(calls))
	}
	replies, errs := r.Send(ctx, ops)
	for i := 1; i <= 3; i++ {
		if errs[i] == nil || !strings.Contains(errs[i].Error(), "WRONGTYPE") {
			t.Errorf("op %d on a list: %v, %v; want WRONGTYPE", i, replies[i], errs[i])
		}
	}
	for _, k := range []string{"no:rec", "no:lock"} {
		if shared.Exists(ctx, prefix+k).Val() != 0 {
			t.Errorf("a failed fused begin wrote %s", k)
		}
	}
	f0, ok := replies[0].(string)
	if errs[0] != nil || !ok {
		t.Fatalf("fused begin: %v, %v; want started (a fence)", replies[0], errs[0])
	}
	if v := shared.Get(ctx, prefix+"ok:lock").Val(); v != LockValue(f0, "t1") {
		t.Errorf("lock after a fused begin: %q; want %q", v, LockValue(f0, "t1"))
	}
	if v := shared.Get(ctx, prefix+"ok:rec").Val(); v != "po1" {
		t.Errorf("record after a fused begin: %q; want po1", v)
	}
	if f, ok := replies[4].(string); errs[4] != nil || !ok || shared.Get(ctx, prefix+"ok:lock2").Val() != LockValue(f, "t5") {
		t.Errorf("acquire beside failed operations: %v, %v", replies[4], errs[4])
	}
	// The finishes of one call, with one record now a list.
	shared.Del(ctx, prefix+"ok:rec")
	shared.RPush(ctx, prefix+"ok:rec", "x")
	replies, errs = r.Send(ctx, []*Op{
		FinishRelease(prefix+"ok:lock", LockValue(f0, "t1"), time.Minute, prefix+"ok:rec", "c", "o1", []byte("r"), time.Minute),
		LockRelease(prefix+"ok:lock2", shared.Get(ctx, prefix+"ok:lock2").Val(), time.Minute),
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "WRONGTYPE") {
		t.Errorf("finish of a list record: %v, %v; want WRONGTYPE", replies[0], errs[0])
	}
	if v := shared.Get(ctx, prefix+"ok:lock").Val(); v != LockValue(f0, "t1") {
		t.Errorf("lock of a failed finish: %q; want it still held", v)
	}
	if errs[1] != nil || replies[1] != int64(1) || strings.Contains(shared.Get(ctx, prefix+"ok:lock2").Val(), " ") {
		t.Errorf("release beside a failed finish: %v, %v", replies[1], errs[1])
	}
}

// Settle ignores its context's cancellation, queued or not, and withdraws
// an operation only after waiting within in the queue: a settlement after
// the handler returned is sent even when the job's context has ended.
func TestRunner_Settle_ignoresCancelBoundsWait(t *testing.T) {
	t.Parallel()
	rdb, prefix := scriptClient(t)
	r := newRunner(rdb)
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	// Not queued: sent at once despite the ended context.
	if v, err := r.Settle(ended, RecordBegin(prefix+"a", "o", time.Minute), time.Minute); err != nil {
		t.Fatalf("settle with an ended context: %v, %v; want it sent", v, err)
	}
	g := &gate{release: make(chan struct{})}
	rdb.AddHook(g)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = r.Do(t.Context(), LockAcquire(prefix+"first", "t", time.Minute)) })
	for g.calls.Load() == 0 { // the first caller is sending, held
		time.Sleep(time.Millisecond)
	}
	// Queued behind the held call: withdrawn after within, not before.
	if _, err := r.Settle(ended, RecordRelease(prefix+"a", "o"), time.Millisecond); err != context.DeadlineExceeded {
		t.Fatalf("settle queued past within: %v; want context.DeadlineExceeded", err)
	}
	var v any
	var err error
	wg.Go(func() { v, err = r.Settle(ended, RecordRelease(prefix+"a", "o"), time.Hour) })
	for {
		r.mu.Lock()
		q := len(r.queue)
		r.mu.Unlock()
		if q == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	wg.Wait()
	if err != nil || v != int64(1) {
		t.Fatalf("settle queued with an ended context: %v, %v; want the release applied (1)", v, err)
	}
}

// holdCalls holds the first two script calls of a client, each until its
// channel is closed.
type holdCalls struct {
	calls   atomic.Int64
	release [2]chan struct{}
}

func (g *holdCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *holdCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := strings.ToLower(cmd.Name()); n == "evalsha" || n == "eval" {
			if i := g.calls.Add(1); i <= 2 {
				<-g.release[i-1]
			}
		}
		return next(ctx, cmd)
	}
}
func (g *holdCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A caller whose operation is in a batch being sent waits for its reply,
// even when its ctx ends meanwhile: the operation may be applied.
func TestRunner_Do_sentWaitsForReply(t *testing.T) {
	t.Parallel()
	rdb, prefix := scriptClient(t)
	r := newRunner(rdb)
	g := &holdCalls{release: [2]chan struct{}{make(chan struct{}), make(chan struct{})}}
	rdb.AddHook(g)
	queued := func(n int) {
		for {
			r.mu.Lock()
			q := len(r.queue)
			r.mu.Unlock()
			if q == n {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = r.Do(t.Context(), LockAcquire(prefix+"a", "t", time.Minute)) })
	for g.calls.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	wg.Go(func() { _, _ = r.Do(t.Context(), LockAcquire(prefix+"b", "t", time.Minute)) })
	queued(1)
	ctx, cancel := context.WithCancel(t.Context())
	var v any
	var err error
	wg.Go(func() { v, err = r.Do(ctx, LockAcquire(prefix+"c", "t", time.Minute)) })
	queued(2)
	close(g.release[0]) // b leads the second call, with c in it
	for g.calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	time.Sleep(10 * time.Millisecond) // let a wrong withdrawal happen
	close(g.release[1])
	wg.Wait()
	if _, ok := v.(string); err != nil || !ok {
		t.Fatalf("acquire cancelled while sent: %v, %v; want its reply (a fence)", v, err)
	}
}

// A release posted while nothing is sent rides the next caller's script
// call instead of a call of its own, and is applied before that caller's
// operations.
func TestRunner_Post_ridesNextCall(t *testing.T) {
	t.Parallel()
	rdb, prefix := scriptClient(t)
	r := newRunner(rdb)
	r.postDelay = time.Hour // only a caller sends it
	v, err := r.Do(t.Context(), LockAcquire(prefix+"k", "a", time.Minute))
	f, ok := v.(string)
	if err != nil || !ok {
		t.Fatalf("acquire: %v, %v", v, err)
	}
	trips := &roundTrips{}
	rdb.AddHook(trips)
	r.Post(LockRelease(prefix+"k", LockValue(f, "a"), time.Minute))
	r.mu.Lock()
	busy := r.busy
	r.mu.Unlock()
	if busy {
		t.Fatal("Post started a call of its own")
	}
	next, err := r.Do(t.Context(), LockAcquire(prefix+"k", "b", time.Minute))
	if n, ok := next.(string); err != nil || !ok || n <= f {
		t.Fatalf("acquire after the posted release: %v, %v; want a fence above %s", next, err, f)
	}
	if c := trips.n.Load(); c != 1 {
		t.Errorf("%d round trips for a posted release and the next acquire, want 1", c)
	}
}

// roundTrips counts the script calls (in scripts) and the round trips
// that carry them (in n) of a client.
type roundTrips struct{ n, scripts atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.n.Add(1)
			h.scripts.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n == "evalsha" || n == "eval" { // not a connection's setup
			h.n.Add(1)
			h.scripts.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// A release posted while nothing is sent, and no caller follows, is sent
// alone after the Runner's post delay.
func TestRunner_Post_sentAloneAfterDelay(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, shared) + "}:"
	defer redistest.DeleteKeys(shared, prefix+"*")
	rdb := redis.NewClient(&redis.Options{Addr: shared.Options().Addr, PoolSize: 4})
	defer rdb.Close()
	r := newRunner(rdb)
	for i := range 3 { // again once the first was sent: the timer is re-armed
		v, err := r.Do(t.Context(), LockAcquire(prefix+"k", "a", time.Minute))
		f, ok := v.(string)
		if err != nil || !ok {
			t.Fatalf("acquire %d: %v, %v", i, v, err)
		}
		r.Post(LockRelease(prefix+"k", LockValue(f, "a"), time.Minute))
		deadline := time.Now().Add(time.Minute)
		for {
			got, err := rdb.Get(t.Context(), prefix+"k").Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != LockValue(f, "a") { // released: only the fence is left
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("release %d not sent: the lock still holds %q", i, got)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// On a *redis.Client (one node) the operations of keys in different slots
// go in one script call: no slot is computed.
func TestRunner_Send_oneCallOnOneNode(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	prefix := redistest.Prefix(t, shared)
	defer redistest.DeleteKeys(shared, "{"+prefix+"*")
	rdb := redis.NewClient(&redis.Options{Addr: shared.Options().Addr, PoolSize: 4})
	defer rdb.Close()
	if err := opsScript.Load(t.Context(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	trips := &roundTrips{}
	rdb.AddHook(trips)
	r := newRunner(rdb)
	var ops []*Op
	slots := map[int]bool{}
	for i := range 8 {
		k := "{" + prefix + "-" + strconv.Itoa(i) + "}:lock"
		slots[keyslot.Of(k)] = true
		ops = append(ops, LockAcquire(k, "t", time.Minute))
	}
	if len(slots) < 2 {
		t.Fatalf("the keys share one slot")
	}
	replies, errs := r.Send(t.Context(), ops)
	for i := range ops {
		if _, ok := replies[i].(string); errs[i] != nil || !ok {
			t.Fatalf("op %d: %v, %v; want a fence", i, replies[i], errs[i])
		}
	}
	if c := trips.scripts.Load(); c != 1 {
		t.Errorf("%d script calls for keys in %d slots on one node, want 1", c, len(slots))
	}
}

// plan puts, per slot in the order the slots come, the takes before the
// others, and a take of a key that another operation of the batch has in a
// call of its slot after the first.
func TestPlan_order(t *testing.T) {
	t.Parallel()
	ops := []*Op{
		LockAcquire("k1", "t", time.Minute),         // 0: a take of k1, released by 1
		LockRelease("k1", "1 a", time.Minute),       // 1
		LockAcquire("k2", "t", time.Minute),         // 2
		LockExtend("k3", "1 a", time.Minute),        // 3
		LockAcquire("x", "t", time.Minute),          // 4: another slot
		RecordBegin("r1", "o", time.Minute),         // 5
		RecordRelease("r1", "o"),                    // 6: of 5's key
		RecordFinish("y", "o", "c", nil, time.Hour), // 7: x's slot
	}
	ops[4].slot, ops[7].slot = 1, 1
	got := fmt.Sprint(plan(ops))
	if want := "[[2 1 3 6] [4 7] [0 5]]"; got != want {
		t.Errorf("plan = %s, want %s", got, want)
	}
}

// scriptClient returns a client of its own on the shared server, with the
// operations script cached (a NOSCRIPT fallback would be a call of its
// own), and a key prefix in one hash tag whose keys are deleted when the
// test ends.
func scriptClient(t *testing.T) (*redis.Client, string) {
	t.Helper()
	shared := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, shared) + "}:"
	t.Cleanup(func() { redistest.DeleteKeys(shared, prefix+"*") })
	rdb := redis.NewClient(&redis.Options{Addr: shared.Options().Addr, PoolSize: 4})
	t.Cleanup(func() { rdb.Close() })
	if err := opsScript.Load(t.Context(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb, prefix
}
