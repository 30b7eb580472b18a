package claim_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/stream"
)

// An entry over the size limit is handed over cut short, by a reclaim and
// by a re-read of the consumer's own entries alike, and the verdict agrees
// with stream.DecodeFields on the whole entry: the same entries are over
// the limit, with the same size and field (each name counted once, with its
// last value; the smallest name, in byte order, among values of the
// longest length; cut to KeepBytes), and the fields kept are those a dead
// letter records.
// Seeded random entries with repeated names, values of tied lengths and
// bytes above 0x7f (Lua compares strings by the C locale; Go by bytes).
func TestOversize_agreesWithDecode(t *testing.T) {
	const limit = 2000
	over := claim.Oversize{MaxBytes: limit, KeepFields: 5, KeepBytes: 16}
	names := []string{"type", "payload", "v", "job_id", "h:x", "extra", "\xffhigh", "a-name-longer-than-sixteen-bytes", "B", "b"}
	rng := rand.New(rand.NewPCG(31, 11))
	value := func() string {
		n := []int{0, 3, 16, 17, 300, 700, 700, 1200}[rng.IntN(8)]
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	for _, path := range []string{"reclaim", "readown"} {
		t.Run(path, func(t *testing.T) {
			e := setup(t)
			var all [][]string
			for range 300 {
				var f []string
				for range 1 + rng.IntN(12) {
					f = append(f, names[rng.IntN(len(names))], value())
				}
				all = append(all, f)
			}
			ids := make([]string, len(all))
			for i, f := range all {
				args := []any{"XADD", e.stream, "*"}
				for _, s := range f {
					args = append(args, s)
				}
				id, err := e.rdb.Do(e.ctx, args...).Text()
				if err != nil {
					t.Fatal(err)
				}
				ids[i] = id
			}
			if err := e.rdb.XReadGroup(e.ctx, &redis.XReadGroupArgs{Group: group, Consumer: "a", Streams: []string{e.stream, ">"}, Count: 1000}).Err(); err != nil {
				t.Fatal(err)
			}
			var got []claim.Entry
			if path == "reclaim" {
				c := claim.New(e.rdb, e.stream, group, "b", over)
				e.age(stale, ids...)
				for _, cl := range sweepAll(t, c, upTo(1000)) {
					got = append(got, cl.claimed...)
				}
			} else {
				got, _ = readOwnAll(t, claim.New(e.rdb, e.stream, group, "a", over), 1000)
			}
			if len(got) != len(all) {
				t.Fatalf("%d entries handed over, want %d", len(got), len(all))
			}
			cuts, deduped := 0, 0
			for i, g := range got {
				if g.ID != ids[i] {
					t.Fatalf("entry %d: ID %s, want %s", i, g.ID, ids[i])
				}
				job, err := stream.DecodeFields(ids[i], all[i], limit)
				var de *stream.DecodeError
				if !errors.As(err, &de) || de.Size == 0 {
					// Within the limit as decoding counts: whole, or with one
					// value per name when its bytes are over the limit.
					want := all[i]
					if rawBytes(want) > limit {
						want = lastValues(want)
						deduped++
					}
					if g.Cut != nil || !slices.Equal(g.Fields, want) {
						t.Errorf("entry %s within the limit (%v): cut %+v, fields %q; want %q", g.ID, err, g.Cut, g.Fields, want)
						continue
					}
					// What it decodes to is what the whole entry decodes to.
					gj, gerr := stream.DecodeFields(ids[i], g.Fields, limit)
					if fmt.Sprint(gerr) != fmt.Sprint(err) || !reflect.DeepEqual(gj, job) {
						t.Errorf("entry %s: handed over, it decodes to %+v, %v; whole, to %+v, %v", g.ID, gj, gerr, job, err)
					}
					continue
				}
				cuts++
				wantFields, left := recorded(all[i], over)
				if g.Cut == nil || g.Cut.Size != de.Size || g.Cut.Field != de.Field[:min(len(de.Field), over.KeepBytes)] || g.Cut.Left != left || !slices.Equal(g.Fields, wantFields) {
					t.Errorf("entry %s over the limit (%v): cut %+v, fields %q; want size %d, field %q, left %d, fields %q",
						g.ID, err, g.Cut, g.Fields, de.Size, de.Field, left, wantFields)
				}
			}
			if cuts < 30 || cuts > len(all)-30 {
				t.Fatalf("precondition: %d of %d entries over the limit; the seed should give both kinds", cuts, len(all))
			}
			if deduped < 10 {
				t.Fatalf("precondition: %d entries within the limit only as decoding counts; the seed should give some", deduped)
			}
			t.Logf("%d of %d entries cut, %d handed over with one value per name", cuts, len(all), deduped)
		})
	}
}

// recorded returns what an oversize entry's dead letter records of f, by
// docs/wire-format.md: every field in order when there are at most
// KeepFields, else one per name (its last value) for the first KeepFields
// names in the order they first come; each name and value cut to
// KeepBytes; and how many fields that leaves out.
func recorded(f []string, o claim.Oversize) ([]string, int) {
	n := len(f) / 2
	kept := f
	if n > o.KeepFields {
		last := map[string]string{}
		for i := 0; i < len(f); i += 2 {
			last[f[i]] = f[i+1]
		}
		kept = nil
		seen := map[string]bool{}
		for i := 0; i < len(f) && len(kept) < 2*o.KeepFields; i += 2 {
			if !seen[f[i]] {
				seen[f[i]] = true
				kept = append(kept, f[i], last[f[i]])
			}
		}
	}
	out := make([]string, len(kept))
	for i, s := range kept {
		out[i] = s[:min(len(s), o.KeepBytes)]
	}
	return out, n - len(kept)/2
}

func laterID(a, b string) string {
	if stream.CompareIDs(a, b) < 0 {
		return b
	}
	return a
}

// sweepAll sweeps with c (entries idle for the visibility timeout: age
// them first) until a sweep claims nothing: with a size limit a sweep's
// calls (MaxCallsPerSweep) may not cover every idle entry.
func sweepAll(t *testing.T, c *claim.Claimer, take func(int) int) []sweepCall {
	t.Helper()
	var all []sweepCall
	for {
		calls := sweep(t, c, visibility, take)
		if len(claimedIDs(calls)) == 0 && len(deletedIDs(calls)) == 0 {
			return all
		}
		all = append(all, calls...)
	}
}

// readOwnAll re-reads every own pending entry of c, count at a time, as the
// consumer does: each call goes on after the last entry it got.
func readOwnAll(t *testing.T, c *claim.Claimer, count int) ([]claim.Entry, []string) {
	t.Helper()
	var got []claim.Entry
	var deleted []string
	after := "0"
	for {
		es, del, err := c.ReadOwn(t.Context(), after, count)
		if err != nil {
			t.Fatalf("ReadOwn: %v", err)
		}
		if len(es) == 0 && len(del) == 0 {
			return got, deleted
		}
		got, deleted = append(got, es...), append(deleted, del...)
		for _, e := range es {
			after = laterID(after, e.ID)
		}
		for _, id := range del {
			after = laterID(after, id)
		}
	}
}

// With a size limit, a reclaim or re-read hands over entries within it
// whole, but stops once those handed over add up to the limit: each reply
// carries less than the limit plus one entry. The entries it did not hand
// over were not touched (still the first reader's, delivered once), and
// the next call (the rest of the sweep; the next ReadOwn) hands them over,
// so every entry comes exactly once, after one delivery more.
func TestOversize_replyBudget(t *testing.T) {
	const limit, each, n = 10_000, 3_000, 12 // about 3 entries a reply
	over := claim.Oversize{MaxBytes: limit, KeepFields: 1100, KeepBytes: 1024}
	for _, path := range []string{"reclaim", "readown"} {
		t.Run(path, func(t *testing.T) {
			e := setup(t)
			var ids []string
			for i := range n {
				id, err := e.rdb.XAdd(e.ctx, &redis.XAddArgs{Stream: e.stream, Values: []any{"n", strconv.Itoa(i), "payload", strings.Repeat("x", each)}}).Result()
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if err := e.rdb.XReadGroup(e.ctx, &redis.XReadGroupArgs{Group: group, Consumer: "a", Streams: []string{e.stream, ">"}, Count: n}).Err(); err != nil {
				t.Fatal(err)
			}
			var got []claim.Entry
			c := claim.New(e.rdb, e.stream, group, map[string]string{"reclaim": "b", "readown": "a"}[path], over)
			if path == "reclaim" {
				e.age(stale, ids...)
				calls := sweepAll(t, c, upTo(100))
				for i, cl := range calls {
					size := 0
					for j, en := range cl.claimed {
						if j == len(cl.claimed)-1 && size >= limit {
							t.Errorf("call %d: %d bytes handed over before its last entry, over the limit %d", i, size, limit)
						}
						size += len(en.Field("payload"))
					}
					got = append(got, cl.claimed...)
				}
				if len(calls) < n*each/limit {
					t.Errorf("%d calls for %d entries of %d bytes under a %d limit; want the replies cut by the limit", len(calls), n, each, limit)
				}
				// Before the rest is claimed, the first call leaves the
				// others as they were: checked through the PEL below.
			} else {
				first, _, err := c.ReadOwn(e.ctx, "0", 100)
				if err != nil {
					t.Fatal(err)
				}
				if len(first) == 0 || len(first)*each > limit+each {
					t.Fatalf("first re-read handed over %d entries of %d bytes; want the reply cut by the %d limit", len(first), each, limit)
				}
				pend, err := e.rdb.XPendingExt(e.ctx, &redis.XPendingExtArgs{Stream: e.stream, Group: group, Start: "-", End: "+", Count: 100}).Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range pend[len(first):] {
					if p.RetryCount != 1 {
						t.Errorf("entry %s not handed over yet was delivered again: %+v", p.ID, p)
					}
				}
				rest, _ := readOwnAll(t, c, 100)
				// readOwnAll starts again from "0": the first ones come again.
				got = append(first, rest[len(first):]...)
			}
			var gotIDs []string
			for _, en := range got {
				gotIDs = append(gotIDs, en.ID)
				if en.Cut != nil || len(en.Field("payload")) != each {
					t.Errorf("entry %s handed over as %+v; want it whole", en.ID, en.Cut)
				}
			}
			if !slices.Equal(gotIDs, ids) {
				t.Fatalf("handed over %v; want each of %v once", gotIDs, ids)
			}
			pend, err := e.rdb.XPendingExt(e.ctx, &redis.XPendingExtArgs{Stream: e.stream, Group: group, Start: "-", End: "+", Count: 100}).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pend {
				if want := map[string]int64{"reclaim": 2, "readown": 2}[path]; p.RetryCount < want || (path == "reclaim" && p.RetryCount != want) {
					t.Errorf("entry %s: %+v; want %d deliveries", p.ID, p, want)
				}
			}
		})
	}
}

// rawBytes returns the bytes of the names and values f holds, duplicates
// included.
func rawBytes(f []string) int {
	n := 0
	for _, s := range f {
		n += len(s)
	}
	return n
}

// lastValues returns f with one value per name, its last, in the order of
// those last values: what a Claimer hands over of an entry within its
// limit only as stream.DecodeFields counts (Entry.Fields).
func lastValues(f []string) []string {
	last := make(map[string]int)
	for i := 0; i+1 < len(f); i += 2 {
		last[f[i]] = i
	}
	var out []string
	for i := 0; i+1 < len(f); i += 2 {
		if last[f[i]] == i {
			out = append(out, f[i], f[i+1])
		}
	}
	return out
}

// countedBytes returns an entry's size as stream.DecodeFields counts it:
// each name once, with its last value.
func countedBytes(f []string) int {
	last := map[string]string{}
	for i := 0; i+1 < len(f); i += 2 {
		last[f[i]] = f[i+1]
	}
	n := 0
	for k, v := range last {
		n += len(k) + len(v)
	}
	return n
}

// wantUntouchedAfter fails t unless every entry of before (the PEL before
// ReadOwn call n) after last, the last ID the call returned, still has its
// owner and delivery count.
func (e *env) wantUntouchedAfter(t *testing.T, before map[string]redis.XPendingExt, last string, n int) {
	t.Helper()
	pel := e.pending()
	for id, was := range before {
		if stream.CompareIDs(id, last) > 0 {
			if p := pel[id]; p.RetryCount != was.RetryCount || p.Consumer != was.Consumer {
				t.Errorf("ReadOwn %d: %s after the last returned (%s) touched: %+v, was %+v", n, id, last, p, was)
			}
		}
	}
}

// KeepBytes 0 keeps the fields of a cut entry, up to KeepFields, each name
// and value empty; KeepFields 0 keeps none. Either way the Cut reports the
// entry's counted size and how many fields were left out.
func TestOversize_keepNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	fields := []string{"type", "t", "payload", strings.Repeat("x", 100), "attempt", "0"}
	id, err := e.rdb.XAdd(e.ctx, &redis.XAddArgs{Stream: e.stream, Values: fields}).Result()
	if err != nil {
		t.Fatal(err)
	}
	e.read("a", 1)
	size := countedBytes(fields)
	for _, tc := range []struct {
		over   claim.Oversize
		fields []string
		field  string
		left   int
	}{
		{claim.Oversize{MaxBytes: 50, KeepFields: 2, KeepBytes: 0}, []string{"", "", "", ""}, "", 1},
		{claim.Oversize{MaxBytes: 50, KeepFields: 3, KeepBytes: 0}, []string{"", "", "", "", "", ""}, "", 0},
		{claim.Oversize{MaxBytes: 50, KeepFields: 0, KeepBytes: 4}, []string{}, "payl", 3},
	} {
		entries, _, err := claim.New(e.rdb, e.stream, group, "a", tc.over).ReadOwn(e.ctx, "0", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].ID != id {
			t.Fatalf("%+v: ReadOwn: %v; want %s", tc.over, entryIDs(entries), id)
		}
		got := entries[0]
		if got.Cut == nil {
			t.Fatalf("%+v: not cut: %q", tc.over, got.Fields)
		}
		if !slices.Equal(got.Fields, tc.fields) || *got.Cut != (claim.Cut{Size: size, Field: tc.field, Left: tc.left}) {
			t.Errorf("%+v: Fields %q Cut %+v; want %q and {Size:%d Field:%q Left:%d}", tc.over, got.Fields, *got.Cut, tc.fields, size, tc.field, tc.left)
		}
	}
}
