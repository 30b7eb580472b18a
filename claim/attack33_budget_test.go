package claim_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/stream"
)

// attack33: the reply budget of Oversize.MaxBytes. A reclaim (one
// XAUTOCLAIM of a Sweep) or a ReadOwn stops taking entries once those it
// hands over add up to MaxBytes (a reply carries less than MaxBytes plus one
// entry); entries not taken are not touched; the next call takes them; every
// idle entry comes exactly once per pass; deleted ones are still reported;
// a call takes at most count entries.

const a33Limit = 10_000

func a33Over() claim.Oversize {
	return claim.Oversize{MaxBytes: a33Limit, KeepFields: 1100, KeepBytes: 1024}
}

// a33add appends an entry with the given fields (and ID, "*" for auto) and
// returns its ID.
func (e *env) a33add(id string, fields ...string) string {
	e.t.Helper()
	args := []any{"XADD", e.stream, id}
	for _, f := range fields {
		args = append(args, f)
	}
	got, err := e.rdb.Do(e.ctx, args...).Text()
	if err != nil {
		e.t.Fatalf("XADD %s: %v", id, err)
	}
	return got
}

// a33checkBudget checks one reply: the names and values of the entries
// before its last add up to less than the limit, and it holds at most count
// entries.
func a33checkBudget(t *testing.T, what string, es []claim.Entry, count int) {
	t.Helper()
	if len(es) > count {
		t.Errorf("%s: %d entries, more than count %d", what, len(es), count)
	}
	size := 0
	for j, en := range es {
		if j == len(es)-1 && size >= a33Limit {
			var d []string
			for _, x := range es {
				d = append(d, fmt.Sprintf("%s size %d wire %d cut %+v", x.ID, countedBytes(x.Fields), rawBytes(x.Fields), x.Cut))
			}
			t.Errorf("%s: %d bytes handed over before its last entry (%d of %d): over the budget %d: %v", what, size, j+1, len(es), a33Limit, d)
		}
		// What the reply carries of it: its names and values (an entry
		// over the limit, cut, carries only what is kept of it).
		size += rawBytes(en.Fields)
	}
}

// a33sweepPass sweeps with c until a sweep claims and deletes nothing,
// checking every call against the budget and, from inside handle, that
// every idle entry not handed over yet is untouched (owner and delivery
// count as before).
func a33sweepPass(t *testing.T, e *env, c *claim.Claimer, take func(int) int, untouched map[string]redis.XPendingExt) ([]sweepCall, []int) {
	t.Helper()
	var all []sweepCall
	var perSweep []int
	handed := map[string]bool{}
	for range 1000 {
		var calls []sweepCall
		err := c.Sweep(e.ctx, visibility, take, func(reserved int, claimed []claim.Entry, deleted []string) {
			calls = append(calls, sweepCall{reserved, claimed, deleted})
			a33checkBudget(t, fmt.Sprintf("sweep call %d", len(all)+len(calls)), claimed, reserved)
			for _, en := range claimed {
				handed[en.ID] = true
			}
			for _, id := range deleted {
				handed[id] = true
			}
			pel := e.pending()
			for id, was := range untouched {
				if handed[id] {
					continue
				}
				if p, ok := pel[id]; !ok || p.Consumer != was.Consumer || p.RetryCount != was.RetryCount {
					t.Errorf("call %d: %s not handed over yet but touched: %+v, was %+v", len(all)+len(calls), id, p, was)
				}
			}
		})
		if err != nil {
			t.Fatalf("Sweep: %v", err)
		}
		if len(claimedIDs(calls)) == 0 && len(deletedIDs(calls)) == 0 {
			return all, perSweep
		}
		perSweep = append(perSweep, len(calls))
		all = append(all, calls...)
	}
	t.Fatal("sweeps never ran dry")
	return nil, nil
}

// a33readOwnPages re-reads c's own entries count at a time, each call after
// the last ID the previous one returned, checking each reply against the
// budget and that the entries after it are untouched.
func a33readOwnPages(t *testing.T, e *env, c *claim.Claimer, count int) ([]claim.Entry, []string, int) {
	t.Helper()
	var got []claim.Entry
	var deleted []string
	after := "0"
	calls := 0
	for range 10_000 {
		before := e.pending()
		es, del, err := c.ReadOwn(e.ctx, after, count)
		if err != nil {
			t.Fatalf("ReadOwn(%s, %d): %v", after, count, err)
		}
		if len(es) == 0 && len(del) == 0 {
			return got, deleted, calls
		}
		calls++
		a33checkBudget(t, fmt.Sprintf("ReadOwn %d after %s", calls, after), es, count)
		if len(es)+len(del) > count {
			t.Errorf("ReadOwn %d: %d entries + %d deleted, more than count %d", calls, len(es), len(del), count)
		}
		got, deleted = append(got, es...), append(deleted, del...)
		last := after
		for _, en := range es {
			last = laterID(last, en.ID)
		}
		for _, id := range del {
			last = laterID(last, id)
		}
		// Entries after the last one returned are untouched.
		e.wantUntouchedAfter(t, before, last, calls)
		after = last
	}
	t.Fatal("ReadOwn never ran dry")
	return nil, nil, 0
}

// Entries whose counted size fills the budget exactly: the reply stops at
// the entry that makes MaxBytes (3 of 3,333+... bytes), never a fourth.
// Also the budget reached on the last of count, and count 1.
func TestAttack33_exactFill(t *testing.T) {
	t.Parallel()
	// "n" + 2 digits + "payload" + v: 1+2+7+len(v) = a33Limit/4 = 2500.
	const per = a33Limit / 4
	for _, tc := range []struct {
		path      string
		count     int
		wantPerCl int
	}{
		{"reclaim", 100, 4}, {"reclaim", 4, 4}, {"reclaim", 1, 1}, {"reclaim", 3, 3},
		{"readown", 100, 4}, {"readown", 4, 4}, {"readown", 1, 1}, {"readown", 3, 3},
	} {
		t.Run(fmt.Sprintf("%s/count%d", tc.path, tc.count), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			const n = 14
			var ids []string
			for i := range n {
				ids = append(ids, e.a33add("*", "n", fmt.Sprintf("%02d", i), "payload", strings.Repeat("x", per-10)))
			}
			e.read("a", n)
			var got []claim.Entry
			var calls []int
			if tc.path == "reclaim" {
				e.age(stale, ids...)
				all, _ := a33sweepPass(t, e, claim.New(e.rdb, e.stream, group, "b", a33Over()), upTo(tc.count), e.pending())
				for _, c := range all {
					got = append(got, c.claimed...)
					calls = append(calls, len(c.claimed))
				}
			} else {
				got, _, _ = a33readOwnPages(t, e, claim.New(e.rdb, e.stream, group, "a", a33Over()), tc.count)
			}
			if !slices.Equal(entryIDs(got), ids) {
				t.Fatalf("handed over %v; want each of %v once, in order", entryIDs(got), ids)
			}
			for _, en := range got {
				if en.Cut != nil || en.Deliveries != 2 || countedBytes(en.Fields) != per {
					t.Errorf("%s: cut %+v, deliveries %d, size %d; want whole, 2, %d", en.ID, en.Cut, en.Deliveries, countedBytes(en.Fields), per)
				}
			}
			if tc.path == "reclaim" {
				for i, k := range calls {
					if i < len(calls)-1 && k != tc.wantPerCl {
						t.Errorf("call %d took %d entries; want %d (calls %v)", i, k, tc.wantPerCl, calls)
					}
				}
				e.wantPending("b", 2, ids...)
			} else {
				e.wantPending("a", 2, ids...)
			}
		})
	}
}

// Entries with a repeated name whose earlier value is large: their counted
// size is tiny, but what Redis holds is not. The docs promised that a reply
// carries less than MaxBytes plus one entry, which such an entry handed
// over whole broke without bound (this test's first finding: 99 KB against
// a 20 KB budget). Entry.Fields now says such an entry comes with one value
// per name, its last: each within MaxBytes, and the reply within the bound.
func TestAttack33_repeatedNamesReplyBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path      string
		big, last int // earlier and last value of "payload"
		perReply  int
	}{
		// 30 × 3,021 bytes stored (within the limit), handed over whole:
		// 4 a reply.
		{"reclaim", 3000, 5, 4}, {"readown", 3000, 5, 4},
		// Stored 18,016 bytes (over the limit), counted and handed over
		// 9,009 (within it): two a reply.
		{"reclaim", 9000, 9000, 2}, {"readown", 9000, 9000, 2},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.path, tc.big), func(t *testing.T) {
			t.Parallel()
			path, big := tc.path, tc.big
			e := setup(t)
			const n = 30
			var ids []string
			for i := range n {
				ids = append(ids, e.a33add("*", "payload", strings.Repeat("x", big), "payload", fmt.Sprintf("%0*d", tc.last, i), "n", "1"))
			}
			e.read("a", n)
			var replies [][]claim.Entry
			if path == "reclaim" {
				e.age(stale, ids...)
				for _, c := range sweep(t, claim.New(e.rdb, e.stream, group, "b", a33Over()), visibility, upTo(100)) {
					replies = append(replies, c.claimed)
				}
			} else {
				es, _, err := claim.New(e.rdb, e.stream, group, "a", a33Over()).ReadOwn(e.ctx, "0", 100)
				if err != nil {
					t.Fatal(err)
				}
				replies = append(replies, es)
			}
			for i, es := range replies {
				wire, maxOne := 0, 0
				for _, en := range es {
					want := []string{"payload", strings.Repeat("x", big), "payload", en.Field("payload"), "n", "1"}
					if rawBytes(want) > a33Limit {
						want = want[2:]
					}
					if en.Cut != nil || !slices.Equal(en.Fields, want) || len(en.Field("payload")) != tc.last {
						t.Errorf("%s: cut %+v, %d fields; want %d (payload's last value of %d bytes)", en.ID, en.Cut, len(en.Fields), len(want), tc.last)
					}
					if rawBytes(en.Fields) > a33Limit {
						t.Errorf("%s: %d bytes handed over; want at most MaxBytes (%d)", en.ID, rawBytes(en.Fields), a33Limit)
					}
					wire += rawBytes(en.Fields)
					maxOne = max(maxOne, rawBytes(en.Fields))
				}
				if i < len(replies)-1 && len(es) != tc.perReply {
					t.Errorf("reply %d: %d entries; want %d", i, len(es), tc.perReply)
				}
				if wire >= a33Limit+maxOne {
					t.Errorf("reply %d carries %d bytes of names and values in %d entries; the docs promise less than MaxBytes (%d) plus one entry (%d)",
						i, wire, len(es), a33Limit, maxOne)
				}
			}
		})
	}
}

// A deleted-while-pending entry in the middle of budget-limited calls, and
// an oversize entry among them: every entry is handed over once, the
// deleted ones reported once, the oversize one cut.
func TestAttack33_deletedAndCutInBudget(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"reclaim", "readown"} {
		for _, count := range []int{1, 2, 3, 4, 5, 100} {
			// value 2,490: 2,500 bytes an entry, the budget full after 4,
			// and deleted entries right at those boundaries.
			for _, value := range []int{3000, 2490} {
				t.Run(fmt.Sprintf("%s/count%d/%d", path, count, value), func(t *testing.T) {
					t.Parallel()
					e := setup(t)
					var ids []string
					for i := range 18 {
						size := value
						if i == 7 && value == 3000 {
							size = 12_000 // over the limit: cut
						}
						ids = append(ids, e.a33add("*", "n", fmt.Sprintf("%02d", i), "payload", strings.Repeat("x", size)))
					}
					e.read("a", 100)
					if path == "reclaim" {
						e.age(stale, ids...)
					}
					gone := []string{ids[2], ids[3], ids[8], ids[15]}
					if value == 2490 {
						gone = []string{ids[4], ids[5], ids[10], ids[17]}
					}
					if err := e.rdb.XDel(e.ctx, e.stream, gone...).Err(); err != nil {
						t.Fatal(err)
					}
					var got []claim.Entry
					var del []string
					if path == "reclaim" {
						calls, _ := a33sweepPass(t, e, claim.New(e.rdb, e.stream, group, "b", a33Over()), upTo(count), e.pending())
						del = deletedIDs(calls)
						for _, c := range calls {
							got = append(got, c.claimed...)
						}
					} else {
						got, del, _ = a33readOwnPages(t, e, claim.New(e.rdb, e.stream, group, "a", a33Over()), count)
					}
					var want []string
					for _, id := range ids {
						if !slices.Contains(gone, id) {
							want = append(want, id)
						}
					}
					if !slices.Equal(entryIDs(got), want) {
						t.Errorf("handed over %v; want %v", entryIDs(got), want)
					}
					slices.SortFunc(del, stream.CompareIDs)
					if !slices.Equal(del, gone) {
						t.Errorf("deleted %v; want %v", del, gone)
					}
					for _, en := range got {
						if (en.ID == ids[7] && value == 3000) != (en.Cut != nil) {
							t.Errorf("%s: cut %+v", en.ID, en.Cut)
						}
						if en.Cut == nil && (en.Deliveries != 2 || countedBytes(en.Fields) != 1+2+7+value) {
							t.Errorf("%s: deliveries %d, size %d", en.ID, en.Deliveries, countedBytes(en.Fields))
						}
					}
					e.wantNotPending(gone...)
					owner := map[string]string{"reclaim": "b", "readown": "a"}[path]
					e.wantPending(owner, 2, want...)
				})
			}
		}
	}
}

// A huge count (1000) with many small entries: a call takes at most count,
// and the budget, not count, limits it when the entries fill it first.
func TestAttack33_hugeCount(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"reclaim", "readown"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			const n = 2500
			// "p" + 9 bytes = 10 bytes counted: 1000 fill the budget exactly.
			cmds, err := e.rdb.Pipelined(e.ctx, func(p redis.Pipeliner) error {
				for i := range n {
					p.XAdd(e.ctx, &redis.XAddArgs{Stream: e.stream, Values: []any{"p", fmt.Sprintf("%09d", i)}})
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, c := range cmds {
				ids = append(ids, c.(*redis.StringCmd).Val())
			}
			e.read("a", n)
			for _, count := range []int{1000, 999, 1001} {
				var got []claim.Entry
				var sizes []int
				if path == "reclaim" {
					e.age(stale, ids...)
					owner := e.pending()[ids[0]].Consumer
					c := claim.New(e.rdb, e.stream, group, map[string]string{"a": "b", "b": "a"}[owner], a33Over())
					calls, _ := a33sweepPass(t, e, c, upTo(count), e.pending())
					for _, cl := range calls {
						got = append(got, cl.claimed...)
						sizes = append(sizes, len(cl.claimed))
					}
				} else {
					got, _, _ = a33readOwnPages(t, e, claim.New(e.rdb, e.stream, group, "a", a33Over()), count)
				}
				if !slices.Equal(entryIDs(got), ids) {
					t.Fatalf("count %d: handed over %d entries; want each of %d once, in order", count, len(got), n)
				}
				want := min(count, 1000)
				for i, s := range sizes {
					if i < len(sizes)-1 && s != want {
						t.Errorf("count %d: call sizes %v; want %d per call", count, sizes, want)
						break
					}
				}
			}
		})
	}
}

// ReadOwn pages continuing after the last returned ID, with IDs of
// different sequence and millisecond lengths (9-x, 10-x, 99-x, 100-x;
// sequences 0..120 in one millisecond), and a budget that ends pages on
// those boundaries.
func TestAttack33_idLengths(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"reclaim", "readown"} {
		for _, count := range []int{1, 2, 7, 1000} {
			t.Run(fmt.Sprintf("%s/count%d", path, count), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				var ids []string
				for _, ms := range []int{9, 10, 99, 100, 1000} {
					for seq := range 121 {
						// Size 1000 or 2500 so that the budget ends pages on
						// varied IDs: "p" + value.
						size := 999
						if seq%3 == 0 {
							size = 2499
						}
						ids = append(ids, e.a33add(fmt.Sprintf("%d-%d", ms, seq), "p", strings.Repeat("v", size)))
					}
				}
				e.read("a", len(ids))
				var got []claim.Entry
				if path == "reclaim" {
					e.age(stale, ids...)
					calls, _ := a33sweepPass(t, e, claim.New(e.rdb, e.stream, group, "b", a33Over()), upTo(count), e.pending())
					for _, c := range calls {
						got = append(got, c.claimed...)
					}
				} else {
					got, _, _ = a33readOwnPages(t, e, claim.New(e.rdb, e.stream, group, "a", a33Over()), count)
				}
				if !slices.Equal(entryIDs(got), ids) {
					t.Fatalf("handed over %d entries %v; want each of %d once, in order", len(got), entryIDs(got), len(ids))
				}
			})
		}
	}
}

// Entries owned by another consumer that are not idle, interleaved with
// idle ones: only the idle ones are handed over, once each, in order; the
// others are untouched; a later pass hands over nothing until an entry
// becomes idle again, and then only that one.
func TestAttack33_interleavedAndCursor(t *testing.T) {
	t.Parallel()
	for _, count := range []int{1, 3, 100} {
		t.Run(fmt.Sprintf("count%d", count), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			var ids []string
			for i := range 60 {
				ids = append(ids, e.a33add("*", "n", strconv.Itoa(i), "payload", strings.Repeat("x", 2000+37*i)))
			}
			e.read("a", 30)
			e.read("c", 30)
			var idle, busy []string
			for i, id := range ids {
				if i%5 == 1 || i%5 == 2 || i%7 == 0 {
					busy = append(busy, id)
				} else {
					idle = append(idle, id)
				}
			}
			e.age(stale, idle...)
			before := e.pending()
			cl := claim.New(e.rdb, e.stream, group, "b", a33Over())
			calls, _ := a33sweepPass(t, e, cl, upTo(count), before)
			if got := claimedIDs(calls); !slices.Equal(got, idle) {
				t.Fatalf("handed over %v; want the idle %v once each, in order", got, idle)
			}
			for _, id := range busy {
				if p := e.pending()[id]; p.Consumer != before[id].Consumer || p.RetryCount != 1 {
					t.Errorf("busy %s touched: %+v", id, p)
				}
			}
			// More sweeps, by another consumer too: nothing is idle.
			for _, who := range []string{"b", "d", "b"} {
				if got := claimedIDs(sweep(t, claim.New(e.rdb, e.stream, group, who, a33Over()), visibility, upTo(count))); len(got) != 0 {
					t.Errorf("sweep by %s after the pass handed over %v again", who, got)
				}
			}
			// One claimed entry and one busy entry become idle again.
			again := []string{idle[len(idle)/2], busy[1]}
			slices.SortFunc(again, stream.CompareIDs)
			e.age(stale, again...)
			var got []string
			for range 3 {
				got = append(got, claimedIDs(sweep(t, cl, visibility, upTo(count)))...)
			}
			if !slices.Equal(got, again) {
				t.Errorf("after two entries became idle again: handed over %v; want %v", got, again)
			}
		})
	}
}

// MaxCallsPerSweep reached before the end of the PEL: the first sweep
// makes exactly MaxCallsPerSweep calls, the next continues where it
// stopped, and the pass hands every entry over once, in order.
func TestAttack33_maxCalls(t *testing.T) {
	t.Parallel()
	for _, count := range []int{2, 100} {
		t.Run(fmt.Sprintf("count%d", count), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			const n = 240
			var ids []string
			for i := range n {
				// 4,000 bytes each: 3 a call under the budget (8,000 < 10,000).
				ids = append(ids, e.a33add("*", "n", fmt.Sprintf("%03d", i), "payload", strings.Repeat("x", 4000-8)))
			}
			e.read("a", n)
			// Some busy entries in the way of the cursor.
			var idle []string
			for i, id := range ids {
				if i%10 != 9 {
					idle = append(idle, id)
				}
			}
			e.age(stale, idle...)
			calls, perSweep := a33sweepPass(t, e, claim.New(e.rdb, e.stream, group, "b", a33Over()), upTo(count), e.pending())
			if got := claimedIDs(calls); !slices.Equal(got, idle) {
				t.Fatalf("handed over %v; want %v once each, in order", got, idle)
			}
			per := min(count, 3)
			want := (len(idle) + per - 1) / per
			if len(perSweep) < 2 || perSweep[0] != claim.MaxCallsPerSweep {
				t.Errorf("calls per sweep %v; want the first to make MaxCallsPerSweep (%d)", perSweep, claim.MaxCallsPerSweep)
			}
			if len(calls) < want {
				t.Errorf("%d calls; want at least %d", len(calls), want)
			}
			for i, c := range calls {
				if i < len(calls)-1 && len(c.claimed) != per && len(c.claimed) != 0 {
					t.Logf("call %d took %d (%v)", i, len(c.claimed), entryIDs(c.claimed))
				}
			}
		})
	}
}

// ReadOwn pages over a PEL where the consumer's own entries are interleaved
// with other consumers' (idle or not) and with empty entries (no bytes of
// names and values) and deleted ones: each own entry once, in order, the
// others untouched.
func TestAttack33_readOwnInterleaved(t *testing.T) {
	t.Parallel()
	for _, count := range []int{1, 2, 5, 1000} {
		t.Run(fmt.Sprintf("count%d", count), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			var mine, others, gone []string
			for i := range 90 {
				var id string
				switch {
				case i%9 == 4:
					id = e.a33add("*", "", "") // empty name and value
				default:
					id = e.a33add("*", "n", fmt.Sprintf("%02d", i), "payload", strings.Repeat("x", 1000+113*(i%11)))
				}
				who := "a"
				if i%3 == 1 {
					who = "c"
				}
				e.read(who, 1)
				if who == "a" {
					if i%13 == 6 {
						gone = append(gone, id)
					} else {
						mine = append(mine, id)
					}
				} else {
					others = append(others, id)
				}
			}
			e.age(stale, others[:len(others)/2]...)
			if err := e.rdb.XDel(e.ctx, e.stream, gone...).Err(); err != nil {
				t.Fatal(err)
			}
			before := e.pending()
			got, del, _ := a33readOwnPages(t, e, claim.New(e.rdb, e.stream, group, "a", a33Over()), count)
			if !slices.Equal(entryIDs(got), mine) {
				t.Errorf("re-read %v; want %v", entryIDs(got), mine)
			}
			if !slices.Equal(del, gone) {
				t.Errorf("deleted %v; want %v", del, gone)
			}
			pel := e.pending()
			for _, id := range others {
				if p := pel[id]; p.Consumer != "c" || p.RetryCount != before[id].RetryCount {
					t.Errorf("other consumer's %s touched: %+v", id, p)
				}
			}
			e.wantPending("a", 2, mine...)
		})
	}
}

// A take that grants slots only on its first call each sweep (then 0):
// each sweep makes one budget-limited call, and the next sweep continues
// after the last entry taken; the unused slots are reported as reserved.
func TestAttack33_takeOncePerSweep(t *testing.T) {
	t.Parallel()
	for _, grant := range []int{1, 3, 4, 5, 50} {
		t.Run(fmt.Sprintf("grant%d", grant), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			var ids []string
			for i := range 25 {
				ids = append(ids, e.a33add("*", "n", fmt.Sprintf("%02d", i), "payload", strings.Repeat("x", 2490)))
			}
			e.read("a", 100)
			e.age(stale, ids...)
			c := claim.New(e.rdb, e.stream, group, "b", a33Over())
			var got []string
			for s := 0; s < 100 && len(got) < len(ids); s++ {
				first := true
				take := func(max int) int {
					if !first {
						return 0
					}
					first = false
					return min(grant, max)
				}
				calls := sweep(t, c, visibility, take)
				if len(calls) != 1 {
					t.Fatalf("sweep %d: %d calls; want 1 (take returns 0 after the first)", s, len(calls))
				}
				cl := calls[0]
				a33checkBudget(t, fmt.Sprintf("sweep %d", s), cl.claimed, cl.reserved)
				if want := min(grant, 4, len(ids)-len(got)); len(cl.claimed) != want || cl.reserved != grant {
					t.Errorf("sweep %d: reserved %d, claimed %d; want %d reserved, %d claimed", s, cl.reserved, len(cl.claimed), grant, want)
				}
				got = append(got, entryIDs(cl.claimed)...)
				e.wantPending("a", 1, ids[len(got):]...)
			}
			if !slices.Equal(got, ids) {
				t.Errorf("handed over %v; want %v", got, ids)
			}
		})
	}
}

// Two consumers sweeping at once (each its own Claimer) under the budget:
// every idle entry is handed over exactly once in all.
func TestAttack33_twoSweepers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var ids []string
	for i := range 120 {
		ids = append(ids, e.a33add("*", "n", fmt.Sprintf("%03d", i), "payload", strings.Repeat("x", 1500+41*(i%17))))
	}
	e.read("a", 200)
	e.age(stale, ids...)
	res := make([][]string, 2)
	done := make(chan struct{})
	for k, who := range []string{"b", "c"} {
		go func() {
			defer func() { done <- struct{}{} }()
			c := claim.New(e.rdb, e.stream, group, who, a33Over())
			for range 20 {
				err := c.Sweep(e.ctx, visibility, upTo(3), func(_ int, claimed []claim.Entry, _ []string) {
					res[k] = append(res[k], entryIDs(claimed)...)
				})
				if err != nil {
					t.Errorf("Sweep %s: %v", who, err)
					return
				}
			}
		}()
	}
	<-done
	<-done
	all := append(slices.Clone(res[0]), res[1]...)
	slices.SortFunc(all, stream.CompareIDs)
	if !slices.Equal(all, ids) {
		t.Errorf("handed over %d entries (%d by b, %d by c); want each of %d once", len(all), len(res[0]), len(res[1]), len(ids))
	}
}
