package claim_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/internal/redistest"
)

// These tests run against the real Redis at REDIS_ADDR (default
// 127.0.0.1:6379): REDIS-NOTES.md §8 keeps the PEL behaviour that claim
// relies on (min-idle, delivery counts, dangling entries) off miniredis.
// Each test has its own stream and deletes it in t.Cleanup.
//
// Nothing here sleeps to make entries idle: age sets an entry's idle time
// with XCLAIM … IDLE (keeping its owner and delivery count), which is what
// waiting would do. A minIdle of visibility (30 s) against an age of stale
// (60 s) then separates stale entries from fresh ones (idle ≈ 0) with a
// wide margin.
const (
	group      = "g"
	visibility = 30 * time.Second
	stale      = 60 * time.Second
)

// env is the bundle a test works with: a client to the shared Redis and a
// stream of its own with consumer group "g".
type env struct {
	t      *testing.T
	ctx    context.Context
	rdb    *redis.Client
	stream string
}

// setup returns an env with a fresh stream and group, deleted by t.Cleanup.
func setup(t *testing.T) *env {
	t.Helper()
	rdb := redistest.Shared(t)
	stream := "claimtest:" + redistest.Name(t)
	ctx := t.Context()
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatalf("XGROUP CREATE %s: %v", stream, err)
	}
	t.Cleanup(func() {
		if err := rdb.Del(context.Background(), stream).Err(); err != nil {
			t.Errorf("cleanup: DEL %s: %v", stream, err)
		}
	})
	return &env{t: t, ctx: ctx, rdb: rdb, stream: stream}
}

// claimer returns a Claimer for consumer on e's stream and group.
func (e *env) claimer(consumer string) *claim.Claimer {
	return claim.New(e.rdb, e.stream, group, consumer, claim.Oversize{})
}

// add appends n entries, {"n": "0"} … {"n": "n-1"}, and returns their IDs.
func (e *env) add(n int) []string {
	e.t.Helper()
	cmds, err := e.rdb.Pipelined(e.ctx, func(p redis.Pipeliner) error {
		for i := range n {
			p.XAdd(e.ctx, &redis.XAddArgs{Stream: e.stream, Values: []any{"n", strconv.Itoa(i)}})
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("XADD: %v", err)
	}
	ids := make([]string, n)
	for i, c := range cmds {
		ids[i] = c.(*redis.StringCmd).Val()
	}
	return ids
}

// read delivers up to count new entries to consumer (XREADGROUP … >), as a
// worker would, and returns their IDs.
func (e *env) read(consumer string, count int) []string {
	e.t.Helper()
	res, err := e.rdb.XReadGroup(e.ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: consumer, Streams: []string{e.stream, ">"}, Count: int64(count), Block: -1,
	}).Result()
	if err != nil {
		e.t.Fatalf("XREADGROUP as %s: %v", consumer, err)
	}
	var ids []string
	for _, m := range res[0].Messages {
		ids = append(ids, m.ID)
	}
	return ids
}

// pending returns the group's whole PEL by ID.
func (e *env) pending() map[string]redis.XPendingExt {
	e.t.Helper()
	res, err := e.rdb.XPendingExt(e.ctx, &redis.XPendingExtArgs{
		Stream: e.stream, Group: group, Start: "-", End: "+", Count: 1 << 20,
	}).Result()
	if err != nil {
		e.t.Fatalf("XPENDING: %v", err)
	}
	m := make(map[string]redis.XPendingExt, len(res))
	for _, p := range res {
		m[p.ID] = p
	}
	return m
}

// age sets the idle time of pending entries to idle, keeping their owners
// and delivery counts, as if nobody had touched them for that long. The
// entries must still exist in the stream (XCLAIM drops dangling ones).
func (e *env) age(idle time.Duration, ids ...string) {
	e.t.Helper()
	pel := e.pending()
	type key struct {
		owner string
		count int64
	}
	groups := map[key][]any{}
	for _, id := range ids {
		p, ok := pel[id]
		if !ok {
			e.t.Fatalf("age: %s is not pending", id)
		}
		k := key{p.Consumer, p.RetryCount}
		groups[k] = append(groups[k], id)
	}
	for k, g := range groups {
		args := []any{"XCLAIM", e.stream, group, k.owner, 0}
		args = append(args, g...)
		args = append(args, "IDLE", idle.Milliseconds(), "RETRYCOUNT", k.count, "JUSTID")
		if err := e.rdb.Do(e.ctx, args...).Err(); err != nil {
			e.t.Fatalf("age: XCLAIM: %v", err)
		}
	}
}

// wantPending checks that each of ids is pending for owner with the given
// delivery count.
func (e *env) wantPending(owner string, count int64, ids ...string) {
	e.t.Helper()
	pel := e.pending()
	for _, id := range ids {
		p, ok := pel[id]
		if !ok {
			e.t.Errorf("%s: not pending; want pending for %s with count %d", id, owner, count)
			continue
		}
		if p.Consumer != owner || p.RetryCount != count {
			e.t.Errorf("%s: pending for %s with count %d; want %s with count %d", id, p.Consumer, p.RetryCount, owner, count)
		}
	}
}

// wantNotPending checks that none of ids is in the PEL.
func (e *env) wantNotPending(ids ...string) {
	e.t.Helper()
	pel := e.pending()
	for _, id := range ids {
		if p, ok := pel[id]; ok {
			e.t.Errorf("%s: still pending (owner %s, count %d); want it gone from the PEL", id, p.Consumer, p.RetryCount)
		}
	}
}

// upTo returns a take func that grants min(n, max) slots on every call.
func upTo(n int) func(int) int {
	return func(max int) int { return min(n, max) }
}

// sweepCall is one XAUTOCLAIM of a Sweep, as handle saw it.
type sweepCall struct {
	reserved int
	claimed  []claim.Entry
	deleted  []string
}

// sweep runs one Sweep of c and returns what handle got, call by call.
func sweep(t *testing.T, c *claim.Claimer, minIdle time.Duration, take func(int) int) []sweepCall {
	t.Helper()
	var calls []sweepCall
	err := c.Sweep(t.Context(), minIdle, take, func(reserved int, claimed []claim.Entry, deleted []string) {
		calls = append(calls, sweepCall{reserved, claimed, deleted})
	})
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	return calls
}

func claimedIDs(calls []sweepCall) []string {
	var ids []string
	for _, c := range calls {
		for _, e := range c.claimed {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

func deletedIDs(calls []sweepCall) []string {
	var ids []string
	for _, c := range calls {
		ids = append(ids, c.deleted...)
	}
	return ids
}

func entryIDs(es []claim.Entry) []string {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	return ids
}

func TestClaimer_Sweep(t *testing.T) {
	t.Parallel()

	t.Run("claims idle entries only", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(5)
		e.read("a", 5)
		e.age(stale, ids[:3]...)

		var maxes []int
		take := func(max int) int { maxes = append(maxes, max); return min(10, max) }
		calls := sweep(t, e.claimer("b"), visibility, take)

		if len(calls) != 1 {
			t.Fatalf("handle called %d times; want 1 (the pass reaches the end of the PEL)", len(calls))
		}
		if maxes[0] < 10 {
			t.Errorf("take offered max %d; want at least 10", maxes[0])
		}
		c := calls[0]
		if c.reserved != 10 {
			t.Errorf("handle got reserved %d; want the 10 that take granted", c.reserved)
		}
		if got := entryIDs(c.claimed); !slices.Equal(got, ids[:3]) {
			t.Errorf("claimed %v; want the idle entries %v", got, ids[:3])
		}
		for i, en := range c.claimed {
			if en.Deliveries != 2 {
				t.Errorf("%s: Deliveries %d; want 2 (read once, claimed once)", en.ID, en.Deliveries)
			}
			if want := strconv.Itoa(i); en.Field("n") != want {
				t.Errorf("%s: Fields %v; want n=%s", en.ID, en.Fields, want)
			}
		}
		if len(c.deleted) != 0 {
			t.Errorf("deleted %v; want none", c.deleted)
		}
		e.wantPending("b", 2, ids[:3]...)
		e.wantPending("a", 1, ids[3:]...)
		for _, id := range ids[:3] {
			if idle := e.pending()[id].Idle; idle >= visibility {
				t.Errorf("%s: idle %v after the claim; want it reset", id, idle)
			}
		}
	})

	t.Run("take limits the claim and the cursor carries over", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(10)
		e.read("a", 10)
		e.age(stale, ids...)
		c := e.claimer("b")

		// free is the worker's free slots: take reserves them, handle gives
		// back those it did not use; claimed jobs keep theirs until done.
		free := 6
		takes := 0
		take := func(max int) int {
			takes++
			n := min(free, max)
			free -= n
			return n
		}
		var calls []sweepCall
		handle := func(reserved int, claimed []claim.Entry, deleted []string) {
			calls = append(calls, sweepCall{reserved, claimed, deleted})
			free += reserved - len(claimed)
		}
		run := func() []sweepCall {
			t.Helper()
			calls = nil
			if err := c.Sweep(t.Context(), visibility, take, handle); err != nil {
				t.Fatalf("Sweep: %v", err)
			}
			return calls
		}

		// Sweep 1: 6 slots, so 6 of the 10 idle entries; then take says 0.
		got := run()
		if len(got) != 1 || got[0].reserved != 6 || !slices.Equal(entryIDs(got[0].claimed), ids[:6]) {
			t.Fatalf("sweep 1: calls %+v; want one call, reserved 6, claiming %v", got, ids[:6])
		}
		if takes != 2 || free != 0 {
			t.Errorf("sweep 1: take called %d times, %d slots free; want 2 calls (the last one returning 0) and 0 free", takes, free)
		}

		// The 6 jobs finish; make their entries idle again. A sweep that
		// started over at 0-0 would take them first; Sweep 2 must continue
		// from the stored cursor instead.
		free = 6
		e.age(stale, ids[:6]...)
		got = run()
		if len(got) != 1 || !slices.Equal(entryIDs(got[0].claimed), ids[6:]) {
			t.Fatalf("sweep 2: calls %+v; want one call claiming %v (continued from the cursor)", got, ids[6:])
		}
		if got[0].reserved != 6 || len(got[0].claimed) != 4 {
			t.Errorf("sweep 2: reserved %d, claimed %d; want 6 reserved and 4 claimed, so 2 reported unused", got[0].reserved, len(got[0].claimed))
		}
		if free != 2 {
			t.Errorf("sweep 2: %d slots free; want the 2 unused reservations back", free)
		}

		// Sweep 2 reached the end of the PEL, so Sweep 3 starts over.
		got = run()
		if c := claimedIDs(got); !slices.Equal(c, ids[:2]) {
			t.Errorf("sweep 3: claimed %v; want %v (a new pass from 0-0 with 2 slots)", c, ids[:2])
		}
		e.wantPending("b", 3, ids[:2]...)
		e.wantPending("b", 2, ids[2:]...)
	})

	t.Run("3000 idle entries are each claimed once per idle epoch", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		const n = 3000
		ids := e.add(n)
		if got := len(e.read("a", n)); got != n {
			t.Fatalf("read %d entries; want %d", got, n)
		}
		c := e.claimer("b")
		const slots = 10 // per call, so a sweep covers at most 640 entries

		for epoch, wantCount := range []int{2, 3} {
			e.age(stale, ids...)
			seen := make(map[string]int, n)
			var sweeps int
			for sweeps = 1; len(seen) < n; sweeps++ {
				if sweeps > 20 {
					t.Fatalf("epoch %d: %d of %d entries claimed after 20 sweeps", epoch, len(seen), n)
				}
				calls := sweep(t, c, visibility, upTo(slots))
				if len(calls) > claim.MaxCallsPerSweep {
					t.Fatalf("epoch %d sweep %d: %d XAUTOCLAIM calls; want at most MaxCallsPerSweep (%d)", epoch, sweeps, len(calls), claim.MaxCallsPerSweep)
				}
				if epoch == 0 && sweeps == 1 && len(calls) != claim.MaxCallsPerSweep {
					t.Errorf("first sweep: %d calls; want MaxCallsPerSweep (%d): the PEL outlasts the budget", len(calls), claim.MaxCallsPerSweep)
				}
				for _, call := range calls {
					if len(call.claimed) > slots {
						t.Fatalf("a call claimed %d entries; take granted %d", len(call.claimed), slots)
					}
					for _, en := range call.claimed {
						seen[en.ID]++
						if en.Deliveries != wantCount {
							t.Fatalf("epoch %d: %s Deliveries %d; want %d", epoch, en.ID, en.Deliveries, wantCount)
						}
					}
				}
			}
			for id, k := range seen {
				if k != 1 {
					t.Errorf("epoch %d: %s claimed %d times; want once", epoch, id, k)
				}
			}
			// Two more sweeps finish the pass and make a whole new one: the
			// entries are fresh now, so nothing is claimed twice.
			for range 2 {
				if extra := claimedIDs(sweep(t, c, visibility, upTo(slots))); len(extra) != 0 {
					t.Fatalf("epoch %d: %d entries claimed again in the same epoch: %v", epoch, len(extra), extra[:min(5, len(extra))])
				}
			}
			pel := e.pending()
			if len(pel) != n {
				t.Fatalf("epoch %d: %d pending; want %d", epoch, len(pel), n)
			}
			for id, p := range pel {
				if p.Consumer != "b" || p.RetryCount != int64(wantCount) {
					t.Fatalf("epoch %d: %s pending for %s with count %d; want b with count %d", epoch, id, p.Consumer, p.RetryCount, wantCount)
				}
			}
			t.Logf("epoch %d: %d entries claimed in %d sweeps", epoch, n, sweeps-1)
		}
	})

	t.Run("deleted and trimmed entries are reported once and leave the PEL", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(10)
		e.read("a", 10)
		e.age(stale, ids...)
		if err := e.rdb.XDel(e.ctx, e.stream, ids[2], ids[5]).Err(); err != nil {
			t.Fatal(err)
		}
		c := e.claimer("b")

		calls := sweep(t, c, visibility, upTo(100))
		live := slices.Concat(ids[:2], ids[3:5], ids[6:])
		if got := claimedIDs(calls); !slices.Equal(got, live) {
			t.Errorf("claimed %v; want the live entries %v", got, live)
		}
		if got := deletedIDs(calls); !slices.Equal(got, []string{ids[2], ids[5]}) {
			t.Errorf("deleted %v; want the XDELed %v", got, []string{ids[2], ids[5]})
		}
		e.wantNotPending(ids[2], ids[5])
		e.wantPending("b", 2, live...)

		// Trim the whole stream under b's now-idle entries.
		e.age(stale, live...)
		if err := e.rdb.XTrimMaxLen(e.ctx, e.stream, 0).Err(); err != nil {
			t.Fatal(err)
		}
		calls = sweep(t, c, visibility, upTo(100))
		if got := claimedIDs(calls); len(got) != 0 {
			t.Errorf("claimed %v from a trimmed stream; want nothing", got)
		}
		if got := deletedIDs(calls); !slices.Equal(got, live) {
			t.Errorf("deleted %v; want the trimmed %v", got, live)
		}
		if pel := e.pending(); len(pel) != 0 {
			t.Errorf("PEL after the sweep: %v; want empty", slices.Sorted(maps.Keys(pel)))
		}
		for i := range 3 {
			if calls := sweep(t, c, visibility, upTo(100)); len(claimedIDs(calls)) != 0 || len(deletedIDs(calls)) != 0 {
				t.Errorf("sweep %d after the purge: %+v; want nothing claimed or deleted", i, calls)
			}
		}
	})

	t.Run("a trimmed backlog drains with one slot per call", func(t *testing.T) {
		t.Parallel()
		// Deleted entries consume XAUTOCLAIM's COUNT (REDIS-NOTES §1.1): with
		// take granting 1, each call purges one, so 100 need two sweeps, and
		// the third finds nothing: no loop, no repeat.
		e := setup(t)
		const n = 100
		ids := e.add(n)
		e.read("a", n)
		e.age(stale, ids...)
		if err := e.rdb.XTrimMaxLen(e.ctx, e.stream, 0).Err(); err != nil {
			t.Fatal(err)
		}
		c := e.claimer("b")
		var deleted []string
		for i, want := range []int{claim.MaxCallsPerSweep, n - claim.MaxCallsPerSweep, 0} {
			calls := sweep(t, c, visibility, upTo(1))
			d := deletedIDs(calls)
			if len(d) != want {
				t.Errorf("sweep %d: %d deleted in %d calls; want %d", i, len(d), len(calls), want)
			}
			if len(calls) > claim.MaxCallsPerSweep {
				t.Errorf("sweep %d: %d calls; want at most %d", i, len(calls), claim.MaxCallsPerSweep)
			}
			deleted = append(deleted, d...)
		}
		if !slices.Equal(deleted, ids) {
			t.Errorf("deleted %d IDs over three sweeps; want each of the %d trimmed entries once, in order", len(deleted), n)
		}
		if pel := e.pending(); len(pel) != 0 {
			t.Errorf("%d entries still pending; want none", len(pel))
		}
	})

	t.Run("an error still reports the reservation", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := claim.New(e.rdb, e.stream, "nosuchgroup", "b", claim.Oversize{})
		var calls []sweepCall
		err := c.Sweep(t.Context(), visibility, upTo(7), func(reserved int, claimed []claim.Entry, deleted []string) {
			calls = append(calls, sweepCall{reserved, claimed, deleted})
		})
		if err == nil || !strings.Contains(err.Error(), "NOGROUP") {
			t.Errorf("Sweep on a missing group: err %v; want NOGROUP", err)
		}
		if len(calls) != 1 || calls[0].reserved != 7 || len(calls[0].claimed) != 0 {
			t.Errorf("handle calls %+v; want one with reserved 7 and nothing claimed", calls)
		}
	})

	t.Run("take of 0 makes no call", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(1)
		e.read("a", 1)
		e.age(stale, ids...)
		if calls := sweep(t, e.claimer("b"), visibility, upTo(0)); len(calls) != 0 {
			t.Errorf("handle calls %+v; want none", calls)
		}
		e.wantPending("a", 1, ids...)
	})
}

// TestClaimer_Sweep_concurrent is F26: sweepers racing over one stale PEL
// claim disjoint sets, because XAUTOCLAIM resets the idle time of what it
// claims, atomically.
func TestClaimer_Sweep_concurrent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n, sweepers = 1000, 10
	ids := e.add(n)
	e.read("a", n)
	e.age(stale, ids...)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var (
		total   atomic.Int64
		start   = make(chan struct{})
		wg      sync.WaitGroup
		claimed = make([][]claim.Entry, sweepers)
		errs    = make([]error, sweepers)
	)
	for i := range sweepers {
		c := e.claimer("c" + strconv.Itoa(i))
		wg.Go(func() {
			<-start
			for total.Load() < n && ctx.Err() == nil {
				err := c.Sweep(ctx, visibility, upTo(25), func(_ int, cl []claim.Entry, _ []string) {
					claimed[i] = append(claimed[i], cl...)
					total.Add(int64(len(cl)))
				})
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("sweeper c%d: %v", i, err)
		}
	}

	owner := make(map[string]string, n)
	var spread []int
	for i, es := range claimed {
		name := "c" + strconv.Itoa(i)
		spread = append(spread, len(es))
		for _, en := range es {
			if prev, ok := owner[en.ID]; ok {
				t.Errorf("%s claimed by both %s and %s", en.ID, prev, name)
			}
			owner[en.ID] = name
			if en.Deliveries != 2 {
				t.Errorf("%s: Deliveries %d; want 2", en.ID, en.Deliveries)
			}
		}
	}
	t.Logf("entries claimed per sweeper: %v", spread)
	if len(owner) != n {
		t.Fatalf("%d distinct entries claimed; want all %d", len(owner), n)
	}
	pel := e.pending()
	if len(pel) != n {
		t.Errorf("%d pending; want %d (none lost)", len(pel), n)
	}
	for id, p := range pel {
		if p.Consumer != owner[id] || p.RetryCount != 2 {
			t.Errorf("%s: pending for %s with count %d; want %s (the sweeper that got it) with count 2", id, p.Consumer, p.RetryCount, owner[id])
		}
	}
	// A whole new pass finds nothing left to claim in this epoch.
	if extra := claimedIDs(sweep(t, e.claimer("late"), visibility, upTo(1000))); len(extra) != 0 {
		t.Errorf("a later sweep claimed %d entries again", len(extra))
	}
}

func TestClaimer_ReadOwn(t *testing.T) {
	t.Parallel()

	t.Run("pages own entries", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(7)
		mine := e.read("a", 5)
		e.read("b", 2)
		c := e.claimer("a")

		var got [][]string
		after := "0"
		for page := 0; ; page++ {
			if page > 5 {
				t.Fatalf("ReadOwn still returning entries after %d pages: %v", page, got)
			}
			entries, deleted, err := c.ReadOwn(t.Context(), after, 2)
			if err != nil {
				t.Fatalf("ReadOwn(%s, 2): %v", after, err)
			}
			if len(deleted) != 0 {
				t.Errorf("ReadOwn(%s, 2): deleted %v; want none", after, deleted)
			}
			if len(entries) == 0 {
				break
			}
			for _, en := range entries {
				if en.Deliveries != 2 {
					t.Errorf("%s: Deliveries %d; want 2 (first read, then history)", en.ID, en.Deliveries)
				}
				if want := strconv.Itoa(slices.Index(ids, en.ID)); en.Field("n") != want {
					t.Errorf("%s: Fields %v; want n=%s", en.ID, en.Fields, want)
				}
			}
			got = append(got, entryIDs(entries))
			after = entries[len(entries)-1].ID
		}
		want := [][]string{mine[:2], mine[2:4], mine[4:]}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("pages %v; want %v (COUNT 2, after exclusive, only a's entries)", got, want)
		}
		e.wantPending("a", 2, mine...)
		e.wantPending("b", 1, ids[5:]...)

		entries, _, err := c.ReadOwn(t.Context(), mine[1], 100)
		if err != nil {
			t.Fatal(err)
		}
		if got := entryIDs(entries); !slices.Equal(got, mine[2:]) {
			t.Errorf("ReadOwn(%s): %v; want %v", mine[1], got, mine[2:])
		}
	})

	t.Run("deleted entries are acked and reported once", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(4)
		e.read("a", 4)
		if err := e.rdb.XDel(e.ctx, e.stream, ids[3]).Err(); err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.XTrimMinID(e.ctx, e.stream, ids[2]).Err(); err != nil {
			t.Fatal(err)
		}
		c := e.claimer("a")
		entries, deleted, err := c.ReadOwn(t.Context(), "0", 10)
		if err != nil {
			t.Fatal(err)
		}
		if got := entryIDs(entries); !slices.Equal(got, ids[2:3]) {
			t.Errorf("entries %v; want the live %v", got, ids[2:3])
		}
		if want := []string{ids[0], ids[1], ids[3]}; !slices.Equal(deleted, want) {
			t.Errorf("deleted %v; want the trimmed and XDELed %v", deleted, want)
		}
		e.wantNotPending(ids[0], ids[1], ids[3])
		e.wantPending("a", 2, ids[2])

		entries, deleted, err = c.ReadOwn(t.Context(), "0", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(deleted) != 0 || !slices.Equal(entryIDs(entries), ids[2:3]) {
			t.Errorf("second ReadOwn: entries %v deleted %v; want %v and nothing deleted", entryIDs(entries), deleted, ids[2:3])
		}
	})

	// Deleted entries count toward count, with or without a size limit (a
	// size limit reads one entry at a time): a page of 2 over two deleted
	// entries holds only them, and the next page goes on after them.
	for _, over := range []claim.Oversize{{}, {MaxBytes: 1 << 20, KeepFields: 10, KeepBytes: 10}} {
		t.Run(fmt.Sprintf("deleted entries count toward count/MaxBytes=%d", over.MaxBytes), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ids := e.add(4)
			e.read("a", 4)
			if err := e.rdb.XDel(e.ctx, e.stream, ids[0], ids[1]).Err(); err != nil {
				t.Fatal(err)
			}
			c := claim.New(e.rdb, e.stream, group, "a", over)
			entries, deleted, err := c.ReadOwn(t.Context(), "0", 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 0 || !slices.Equal(deleted, ids[:2]) {
				t.Errorf("ReadOwn(0, 2): entries %v deleted %v; want none and %v", entryIDs(entries), deleted, ids[:2])
			}
			entries, deleted, err = c.ReadOwn(t.Context(), ids[1], 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(deleted) != 0 || !slices.Equal(entryIDs(entries), ids[2:]) {
				t.Errorf("ReadOwn(%s, 2): entries %v deleted %v; want %v and none", ids[1], entryIDs(entries), deleted, ids[2:])
			}
		})
	}

	t.Run("missing group is an error", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, _, err := claim.New(e.rdb, e.stream, "nosuchgroup", "a", claim.Oversize{}).ReadOwn(t.Context(), "0", 10)
		if err == nil || !strings.Contains(err.Error(), "NOGROUP") {
			t.Errorf("err %v; want NOGROUP", err)
		}
	})
}

func TestClaimer_Extend(t *testing.T) {
	t.Parallel()

	t.Run("resets idle and keeps the delivery count", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(2)
		e.read("a", 2)
		e.age(stale, ids...)
		lost, err := e.claimer("a").Extend(t.Context(), ids...)
		if err != nil || len(lost) != 0 {
			t.Fatalf("Extend: lost %v, err %v; want neither", lost, err)
		}
		for id, p := range e.pending() {
			if p.Idle >= visibility {
				t.Errorf("%s: idle %v after Extend; want reset (was %v)", id, p.Idle, stale)
			}
		}
		e.wantPending("a", 1, ids...)
	})

	t.Run("a stale heartbeat does not take the entry back", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(2)
		e.read("a", 2)
		e.age(stale, ids[0])
		if got := claimedIDs(sweep(t, e.claimer("b"), visibility, upTo(10))); !slices.Equal(got, ids[:1]) {
			t.Fatalf("b claimed %v; want %v", got, ids[:1])
		}
		e.age(stale, ids[0])

		lost, err := e.claimer("a").Extend(t.Context(), ids...)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(lost, ids[:1]) {
			t.Errorf("lost %v; want %v (reclaimed by b)", lost, ids[:1])
		}
		e.wantPending("b", 2, ids[0])
		e.wantPending("a", 1, ids[1])
		if idle := e.pending()[ids[0]].Idle; idle < visibility {
			t.Errorf("b's entry idle %v after a's heartbeat; want it untouched (%v)", idle, stale)
		}
	})

	t.Run("acked and deleted entries are lost", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := e.add(3)
		e.read("a", 3)
		if err := e.rdb.XAck(e.ctx, e.stream, group, ids[0]).Err(); err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.XDel(e.ctx, e.stream, ids[1]).Err(); err != nil {
			t.Fatal(err)
		}
		lost, err := e.claimer("a").Extend(t.Context(), ids...)
		if err != nil {
			t.Fatal(err)
		}
		// XCLAIM drops the deleted entry from the PEL (Redis 7), so a owns
		// it no more either.
		if !slices.Equal(lost, ids[:2]) {
			t.Errorf("lost %v; want %v (acked, deleted)", lost, ids[:2])
		}
		e.wantNotPending(ids[:2]...)
		e.wantPending("a", 1, ids[2])
	})

	t.Run("no IDs, no call", func(t *testing.T) {
		t.Parallel()
		c := claim.New(nil, "s", group, "a", claim.Oversize{}) // a nil client would panic if used
		if lost, err := c.Extend(t.Context()); lost != nil || err != nil {
			t.Errorf("Extend(): %v, %v; want nil, nil", lost, err)
		}
	})
}

func TestClaimer_Release(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.add(2)
	e.read("a", 2)
	a := e.claimer("a")

	lost, err := a.Release(t.Context(), visibility, ids[0])
	if err != nil || len(lost) != 0 {
		t.Fatalf("Release: lost %v, err %v; want neither", lost, err)
	}
	pel := e.pending()
	if idle := pel[ids[0]].Idle; idle < visibility || idle > visibility+10*time.Second {
		t.Errorf("released entry idle %v; want about %v", idle, visibility)
	}
	if idle := pel[ids[1]].Idle; idle >= visibility {
		t.Errorf("other entry idle %v; want it untouched (fresh)", idle)
	}
	// Its delivery count went down by one, so that the reclaim brings it
	// back to where it was: giving back is not a delivery.
	e.wantPending("a", 0, ids[0])
	e.wantPending("a", 1, ids[1])

	// Another consumer's sweep with min-idle = the visibility timeout takes
	// it at once, and only it.
	b := e.claimer("b")
	claimed := sweep(t, b, visibility, upTo(10))
	if got := claimedIDs(claimed); !slices.Equal(got, ids[:1]) {
		t.Errorf("b's sweep claimed %v; want %v", got, ids[:1])
	}
	if len(claimed) == 1 && len(claimed[0].claimed) == 1 && claimed[0].claimed[0].Deliveries != 1 {
		t.Errorf("b's sweep claimed %+v; want delivery count 1, as before the give-back", claimed[0].claimed[0])
	}
	e.wantPending("b", 1, ids[0])
	e.wantPending("a", 1, ids[1])

	// a no longer owns it: releasing again is refused and changes nothing.
	lost, err = a.Release(t.Context(), visibility, ids[0])
	if err != nil || !slices.Equal(lost, ids[:1]) {
		t.Errorf("second Release: lost %v, err %v; want %v", lost, err, ids[:1])
	}
	if idle := e.pending()[ids[0]].Idle; idle >= visibility {
		t.Errorf("b's entry idle %v after a's stale Release; want untouched", idle)
	}
	e.wantPending("b", 1, ids[0])
}

// TestClaimer_Reap also decides the dangling case: Redis counts entries
// deleted or trimmed while pending as the consumer's pending entries, so a
// consumer that owns only such entries is kept. Deleting it would drop the
// IDs without anyone reporting them lost; instead the next Sweep purges them
// and reports them in deleted, and the Reap after that removes the consumer.
func TestClaimer_Reap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const minIdle = 100 * time.Millisecond
	for _, name := range []string{"a", "idle"} {
		if err := e.rdb.XGroupCreateConsumer(e.ctx, e.stream, group, name).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ids := e.add(4)
	done := e.read("done", 1)
	if err := e.rdb.XAck(e.ctx, e.stream, group, done...).Err(); err != nil {
		t.Fatal(err)
	}
	busy := e.read("busy", 1)
	ghost := e.read("ghost", 2)
	if err := e.rdb.XDel(e.ctx, e.stream, ghost...).Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(slices.Concat(done, busy, ghost), ids) {
		t.Fatalf("setup: read %v %v %v; want %v", done, busy, ghost, ids)
	}
	a := e.claimer("a")

	// Nobody is idle for an hour: nothing to reap.
	if got, err := a.Reap(t.Context(), time.Hour); err != nil || len(got) != 0 {
		t.Fatalf("Reap(1h): %v, %v; want nothing", got, err)
	}

	// Wait until every consumer has been idle for minIdle.
	deadline := time.Now().Add(5 * time.Second)
	for {
		cs, err := e.rdb.XInfoConsumers(e.ctx, e.stream, group).Result()
		if err != nil {
			t.Fatal(err)
		}
		ready := len(cs) == 5
		for _, c := range cs {
			ready = ready && c.Idle >= minIdle
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumers not idle for %v after 5 s: %+v", minIdle, cs)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for the answer
	}

	got, err := a.Reap(t.Context(), minIdle)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"done", "idle"}; !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Errorf("Reap: %v; want %v (idle, nothing pending, not the caller)", got, want)
	}
	consumers := func() map[string]int64 {
		t.Helper()
		cs, err := e.rdb.XInfoConsumers(e.ctx, e.stream, group).Result()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for _, c := range cs {
			m[c.Name] = c.Pending
		}
		return m
	}
	if want := map[string]int64{"a": 0, "busy": 1, "ghost": 2}; !maps.Equal(consumers(), want) {
		t.Errorf("consumers (name: pending) %v; want %v", consumers(), want)
	}
	e.wantPending("busy", 1, busy...)
	e.wantPending("ghost", 1, ghost...) // dangling, but still in the PEL

	// a sweeps: it takes busy's idle entry and purges ghost's dangling ones.
	calls := sweep(t, a, minIdle, upTo(10))
	if got := claimedIDs(calls); !slices.Equal(got, busy) {
		t.Errorf("sweep claimed %v; want %v", got, busy)
	}
	if got := deletedIDs(calls); !slices.Equal(got, ghost) {
		t.Errorf("sweep deleted %v; want %v", got, ghost)
	}
	got, err = a.Reap(t.Context(), minIdle)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"busy", "ghost"}; !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Errorf("Reap after the sweep: %v; want %v", got, want)
	}
	if want := map[string]int64{"a": 1}; !maps.Equal(consumers(), want) {
		t.Errorf("consumers (name: pending) %v; want %v", consumers(), want)
	}
	e.wantPending("a", 2, busy...)
}

func TestClaimer_errors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := claim.New(e.rdb, "claimtest:"+redistest.Name(t)+":missing", group, "a", claim.Oversize{})
	if _, err := c.Reap(t.Context(), time.Second); err == nil {
		t.Error("Reap on a missing stream: no error")
	}
	if _, err := c.Extend(t.Context(), "not-an-id"); err == nil {
		t.Error("Extend with a malformed ID: no error")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := e.claimer("a").ReadOwn(ctx, "0", 1); err == nil {
		t.Error("ReadOwn with a cancelled context: no error")
	} else if !strings.HasPrefix(err.Error(), "claim: ") {
		t.Errorf("error %q; want the package prefix", err)
	}
}

// replyScripter answers every script call with reply, as a server running
// some other script under the same SHA (or a proxy gone wrong) might.
type replyScripter struct {
	redis.Scripter // nil: only EvalSha is called
	reply          any
}

func (s replyScripter) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmdResult(s.reply, nil)
}

// TestClaimer_foreignReplies checks that replies of the wrong shape are
// errors, never panics.
func TestClaimer_foreignReplies(t *testing.T) {
	t.Parallel()
	entry := []any{"1-0", []any{"n", "0"}, int64(2)}
	for _, tc := range []struct {
		name  string
		reply any
	}{
		{"not an array", "OK"},
		{"short", []any{"0-0"}},
		{"entry too short", []any{"0-0", []any{[]any{"1-0"}}, []any{}}},
		{"entry not an array", []any{"0-0", []any{"1-0"}, []any{}}},
		{"entry after a good one", []any{"0-0", []any{entry, int64(7)}, []any{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := claim.New(replyScripter{reply: tc.reply}, "s", group, "a", claim.Oversize{})
			var calls []sweepCall
			err := c.Sweep(t.Context(), visibility, upTo(3), func(reserved int, claimed []claim.Entry, deleted []string) {
				calls = append(calls, sweepCall{reserved, claimed, deleted})
			})
			if err == nil || !strings.HasPrefix(err.Error(), "claim: ") {
				t.Errorf("Sweep: err %v; want a claim error", err)
			}
			if len(calls) != 1 || calls[0].reserved != 3 || len(calls[0].claimed) != 0 {
				t.Errorf("Sweep: handle calls %+v; want the reservation back, nothing claimed", calls)
			}
			if _, _, err := c.ReadOwn(t.Context(), "0", 1); err == nil {
				t.Errorf("ReadOwn: no error (its reply has two elements)")
			}
		})
	}

	t.Run("ReadOwn", func(t *testing.T) {
		t.Parallel()
		for _, reply := range []any{
			"OK",
			[]any{[]any{}},
			[]any{[]any{entry, "x"}, []any{}},
		} {
			if _, _, err := claim.New(replyScripter{reply: reply}, "s", group, "a", claim.Oversize{}).ReadOwn(t.Context(), "0", 1); err == nil {
				t.Errorf("ReadOwn with reply %v: no error", reply)
			}
		}
		// Odd field lists and non-string names are passed on as they are
		// (a non-string in its fmt form), for the decoder to judge.
		entries, deleted, err := claim.New(replyScripter{reply: []any{
			[]any{[]any{"1-0", []any{"n", "0", int64(5), "x", "odd"}, int64(3)}},
			[]any{"2-0", int64(9)},
		}}, "s", group, "a", claim.Oversize{}).ReadOwn(t.Context(), "0", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].ID != "1-0" || entries[0].Deliveries != 3 ||
			!slices.Equal(entries[0].Fields, []string{"n", "0", "5", "x", "odd"}) || entries[0].Field("n") != "0" {
			t.Errorf("entries %+v; want 1-0 with fields n 0 5 x odd and 3 deliveries", entries)
		}
		if !slices.Equal(deleted, []string{"2-0"}) {
			t.Errorf("deleted %v; want [2-0]", deleted)
		}
	})

	t.Run("Extend and Reap", func(t *testing.T) {
		t.Parallel()
		c := claim.New(replyScripter{reply: "OK"}, "s", group, "a", claim.Oversize{})
		if _, err := c.Extend(t.Context(), "1-0"); err == nil {
			t.Error("Extend: no error")
		}
		if _, err := c.Reap(t.Context(), time.Second); err == nil {
			t.Error("Reap: no error")
		}
	})
}
