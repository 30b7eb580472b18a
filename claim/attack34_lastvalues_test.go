package claim_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/stream"
)

// attack34: an entry larger than Oversize.MaxBytes only by the earlier
// values of names it gives again is handed over (by Sweep and by ReadOwn)
// with one value per name, its last, in the order of those last values,
// Cut nil; an entry within MaxBytes whole (duplicates kept); one over it as
// stream.DecodeFields counts cut short. The reply budget counts what is
// handed over. Every expectation below comes from a model written from the
// docs (go doc ./claim Entry, Oversize, Cut; docs/wire-format.md), checked
// against stream.DecodeFields where the two meet.

// ---------------------------------------------------------------- model

// a34Model returns what the docs say a Claimer with o hands over of an
// entry with fields f: its Fields and its Cut.
func a34Model(f []string, o claim.Oversize) ([]string, *claim.Cut) {
	m := o.MaxBytes
	if m <= 0 || rawBytes(f) <= m {
		return slices.Clone(f), nil
	}
	counted := countedBytes(f)
	if counted <= m {
		return lastValues(f), nil
	}
	cutS := func(s string) string { return s[:min(len(s), o.KeepBytes)] }
	last := map[string]string{}
	var firstOrder []string
	for i := 0; i+1 < len(f); i += 2 {
		if _, ok := last[f[i]]; !ok {
			firstOrder = append(firstOrder, f[i])
		}
		last[f[i]] = f[i+1]
	}
	// Field: the name of the longest (last) value, the smallest name among
	// equals.
	field, best := "", -1
	for _, name := range firstOrder {
		v := last[name]
		if len(v) > best || (len(v) == best && name < field) {
			field, best = name, len(v)
		}
	}
	n := len(f) / 2
	var kept []string
	if n <= o.KeepFields {
		kept = f
	} else {
		for _, name := range firstOrder[:min(len(firstOrder), max(o.KeepFields, 0))] {
			kept = append(kept, name, last[name])
		}
	}
	out := make([]string, len(kept))
	for i, s := range kept {
		out[i] = cutS(s)
	}
	return out, &claim.Cut{Size: counted, Field: cutS(field), Left: n - len(kept)/2}
}

// a34Handed is the bytes the model says a reply carries of an entry.
func a34Handed(f []string, o claim.Oversize) int {
	got, _ := a34Model(f, o)
	return rawBytes(got)
}

// a34Greedy is how many of the entries (their handed-over sizes, in order)
// one call takes with count: it stops once the bytes it hands over add up
// to MaxBytes (no budget when MaxBytes is 0).
func a34Greedy(sizes []int, maxBytes, count int) int {
	n, sum := 0, 0
	for n < len(sizes) && n < count && (maxBytes <= 0 || sum < maxBytes) {
		sum += sizes[n]
		n++
	}
	return n
}

// ---------------------------------------------------------------- checks

func a34Short(fs []string) string {
	var b strings.Builder
	b.WriteString("[")
	for i, f := range fs {
		if i == 16 {
			fmt.Fprintf(&b, "... (%d in all)", len(fs))
			break
		}
		if len(f) > 24 {
			fmt.Fprintf(&b, "%q…(%d) ", f[:24], len(f))
		} else {
			fmt.Fprintf(&b, "%q ", f)
		}
	}
	return b.String() + "]"
}

// a34Check checks one handed-over entry against the model and against
// stream.DecodeFields of the whole entry.
func a34Check(t *testing.T, how string, o claim.Oversize, whole []string, got claim.Entry, wantDeliveries int) {
	t.Helper()
	m := o.MaxBytes
	wantFields, wantCut := a34Model(whole, o)
	if got.Deliveries != wantDeliveries {
		t.Errorf("%s %s: Deliveries %d; want %d", how, got.ID, got.Deliveries, wantDeliveries)
	}
	if !slices.Equal(got.Fields, wantFields) {
		t.Errorf("%s %s (raw %d, counted %d, limit %d): Fields\n  got  %s\n  want %s\n  whole %s",
			how, got.ID, rawBytes(whole), countedBytes(whole), m, a34Short(got.Fields), a34Short(wantFields), a34Short(whole))
	}
	switch {
	case wantCut == nil && got.Cut != nil:
		t.Errorf("%s %s (raw %d, counted %d, limit %d): Cut %+v; want nil", how, got.ID, rawBytes(whole), countedBytes(whole), m, *got.Cut)
	case wantCut != nil && got.Cut == nil:
		t.Errorf("%s %s (raw %d, counted %d, limit %d): Cut nil; want %+v", how, got.ID, rawBytes(whole), countedBytes(whole), m, *wantCut)
	case wantCut != nil && *got.Cut != *wantCut:
		t.Errorf("%s %s: Cut %+v; want %+v", how, got.ID, *got.Cut, *wantCut)
	}

	// Decoding what is handed over gives what decoding the whole gives.
	jw, ew := stream.DecodeFields(got.ID, whole, m)
	var dw *stream.DecodeError
	oversize := errors.As(ew, &dw) && dw.Size > 0
	if oversize != (wantCut != nil) {
		t.Fatalf("test bug: model says cut=%v, DecodeFields(whole) = %v (whole %s)", wantCut != nil, ew, a34Short(whole))
	}
	if got.Cut == nil {
		if m > 0 && rawBytes(got.Fields) > m {
			t.Errorf("%s %s: not cut, but %d bytes handed over, over the limit %d", how, got.ID, rawBytes(got.Fields), m)
		}
		jg, eg := stream.DecodeFields(got.ID, got.Fields, m)
		if (ew == nil) != (eg == nil) {
			t.Errorf("%s %s: DecodeFields(handed) err %v; DecodeFields(whole) err %v", how, got.ID, eg, ew)
		} else if ew != nil {
			if !reflect.DeepEqual(ew, eg) {
				t.Errorf("%s %s: DecodeFields(handed) err %#v; DecodeFields(whole) err %#v", how, got.ID, eg, ew)
			}
		} else if !reflect.DeepEqual(jw, jg) {
			t.Errorf("%s %s: DecodeFields(handed) = %+v; DecodeFields(whole) = %+v", how, got.ID, jg, jw)
		}
		return
	}
	if dw == nil {
		return
	}
	if got.Cut.Size != dw.Size {
		t.Errorf("%s %s: Cut.Size %d; DecodeFields(whole) Size %d", how, got.ID, got.Cut.Size, dw.Size)
	}
	if o.KeepBytes == stream.CutBytes {
		if oe := stream.OversizeError(got.ID, got.Cut.Field, got.Cut.Size, m); !reflect.DeepEqual(oe, dw) {
			t.Errorf("%s %s: OversizeError from Cut %#v; DecodeFields(whole) %#v", how, got.ID, oe, dw)
		}
	} else if want := dw.Field[:min(len(dw.Field), o.KeepBytes)]; got.Cut.Field != want {
		t.Errorf("%s %s: Cut.Field %q; DecodeFields(whole) Field cut to %d: %q", how, got.ID, got.Cut.Field, o.KeepBytes, want)
	}
}

// ---------------------------------------------------------------- driving

type a34Reply struct {
	count   int // reserved (Sweep) or count (ReadOwn)
	entries []claim.Entry
	deleted []string
}

// a34Add appends entries with the given fields and returns their IDs,
// checking that Redis holds each exactly as given.
func (e *env) a34Add(entries [][]string) []string {
	e.t.Helper()
	cmds, err := e.rdb.Pipelined(e.ctx, func(p redis.Pipeliner) error {
		for _, f := range entries {
			args := []any{"XADD", e.stream, "*"}
			for _, s := range f {
				args = append(args, s)
			}
			p.Do(e.ctx, args...)
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("XADD: %v", err)
	}
	ids := make([]string, len(entries))
	for i, c := range cmds {
		ids[i] = c.(*redis.Cmd).Val().(string)
		if got := e.rawFields(ids[i]); !slices.Equal(got, entries[i]) {
			e.t.Fatalf("test bug: XRANGE %s gave %s; added %s", ids[i], a34Short(got), a34Short(entries[i]))
		}
	}
	return ids
}

// a34Deliver delivers every entry of the stream to consumer (one delivery
// each).
func (e *env) a34Deliver(consumer string, n int) {
	e.t.Helper()
	if got := e.read(consumer, n); len(got) != n {
		e.t.Fatalf("read %d entries; want %d", len(got), n)
	}
}

// a34SweepAll sweeps as "taker" with upTo(k) until a sweep hands nothing
// over, checking from inside handle that no entry not handed over yet was
// touched. The entries must be pending for another consumer and aged.
func a34SweepAll(t *testing.T, e *env, o claim.Oversize, k int) []a34Reply {
	t.Helper()
	c := claim.New(e.rdb, e.stream, group, "taker", o)
	before := e.pending()
	handed := map[string]bool{}
	var replies []a34Reply
	for range 200 {
		progressed := false
		err := c.Sweep(e.ctx, visibility, upTo(k), func(reserved int, claimed []claim.Entry, deleted []string) {
			replies = append(replies, a34Reply{reserved, claimed, deleted})
			for _, en := range claimed {
				handed[en.ID] = true
			}
			for _, id := range deleted {
				handed[id] = true
			}
			if len(claimed)+len(deleted) > 0 {
				progressed = true
			}
			pel := e.pending()
			for id, was := range before {
				if handed[id] {
					continue
				}
				if p, ok := pel[id]; !ok || p.Consumer != was.Consumer || p.RetryCount != was.RetryCount {
					t.Errorf("sweep reply %d: %s not handed over yet but touched: now %+v (present %v), was %+v", len(replies), id, p, ok, was)
				}
			}
		})
		if err != nil {
			t.Fatalf("Sweep: %v", err)
		}
		if !progressed {
			return replies
		}
	}
	t.Fatal("sweeps never ran dry")
	return nil
}

// a34ReadOwnAll re-reads consumer's own pending entries count at a time,
// each call after the last ID the previous one returned, checking that the
// entries after the last one returned are untouched.
func a34ReadOwnAll(t *testing.T, e *env, o claim.Oversize, consumer string, count int) []a34Reply {
	t.Helper()
	c := claim.New(e.rdb, e.stream, group, consumer, o)
	var replies []a34Reply
	after := "0"
	for range 2000 {
		before := e.pending()
		es, del, err := c.ReadOwn(e.ctx, after, count)
		if err != nil {
			t.Fatalf("ReadOwn(%s, %d): %v", after, count, err)
		}
		if len(es) == 0 && len(del) == 0 {
			return replies
		}
		replies = append(replies, a34Reply{count, es, del})
		last := after
		for _, en := range es {
			if stream.CompareIDs(en.ID, after) <= 0 {
				t.Errorf("ReadOwn after %s returned %s", after, en.ID)
			}
			last = laterID(last, en.ID)
		}
		for _, id := range del {
			last = laterID(last, id)
		}
		e.wantUntouchedAfter(t, before, last, len(replies))
		after = last
	}
	t.Fatal("ReadOwn never ran dry")
	return nil
}

// a34CheckReplies checks every reply against the budget and count, that
// each entry is handed over exactly once (claimed or deleted, as wanted),
// and each claimed entry against the model. It returns the claimed
// entries by ID.
func a34CheckReplies(t *testing.T, how string, o claim.Oversize, replies []a34Reply, ids []string, whole map[string][]string, wantDeleted map[string]bool) map[string]claim.Entry {
	t.Helper()
	seen := map[string]int{}
	got := map[string]claim.Entry{}
	for i, r := range replies {
		if len(r.entries) > r.count {
			t.Errorf("%s reply %d: %d entries; count %d", how, i, len(r.entries), r.count)
		}
		sum := 0
		for j, en := range r.entries {
			if o.MaxBytes > 0 && j > 0 && sum >= o.MaxBytes {
				var d []string
				for _, x := range r.entries {
					d = append(d, fmt.Sprintf("%s:%d(cut %v)", x.ID, rawBytes(x.Fields), x.Cut != nil))
				}
				t.Errorf("%s reply %d: %d bytes handed over before entry %d of %d: the budget %d was reached; reply %v", how, i, sum, j+1, len(r.entries), o.MaxBytes, d)
			}
			sum += rawBytes(en.Fields)
			// The last entry is within MaxBytes as handed over, unless cut.
			if o.MaxBytes > 0 && en.Cut == nil && rawBytes(en.Fields) > o.MaxBytes {
				t.Errorf("%s reply %d: %s not cut but %d bytes > %d", how, i, en.ID, rawBytes(en.Fields), o.MaxBytes)
			}
			if en.Cut != nil {
				if len(en.Fields) > 2*o.KeepFields {
					t.Errorf("%s: cut %s holds %d names and values; KeepFields %d", how, en.ID, len(en.Fields), o.KeepFields)
				}
				for _, s := range en.Fields {
					if len(s) > o.KeepBytes {
						t.Errorf("%s: cut %s holds a name or value of %d bytes; KeepBytes %d", how, en.ID, len(s), o.KeepBytes)
						break
					}
				}
			}
			seen[en.ID]++
			got[en.ID] = en
			if wantDeleted[en.ID] {
				t.Errorf("%s: %s was deleted while pending but handed over as an entry %s", how, en.ID, a34Short(en.Fields))
			}
		}
		for _, id := range r.deleted {
			seen[id]++
			if !wantDeleted[id] {
				t.Errorf("%s: %s reported deleted; it is in the stream", how, id)
			}
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("%s: %s handed over %d times; want exactly once", how, id, seen[id])
		}
	}
	for _, id := range ids {
		if en, ok := got[id]; ok && !wantDeleted[id] {
			a34Check(t, how, o, whole[id], en, 2)
		}
	}
	return got
}

// a34Both runs entries through both paths (Sweep with upTo(k), ReadOwn with
// count k), each on its own stream, and checks everything.
func a34Both(t *testing.T, o claim.Oversize, k int, entries [][]string) {
	t.Helper()
	for _, how := range []string{"Sweep", "ReadOwn"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ids := e.a34Add(entries)
			whole := map[string][]string{}
			for i, id := range ids {
				whole[id] = entries[i]
			}
			var replies []a34Reply
			if how == "Sweep" {
				e.a34Deliver("dead", len(ids))
				e.age(stale, ids...)
				replies = a34SweepAll(t, e, o, k)
				e.wantPending("taker", 2, ids...)
			} else {
				e.a34Deliver("me", len(ids))
				replies = a34ReadOwnAll(t, e, o, "me", k)
				e.wantPending("me", 2, ids...)
			}
			a34CheckReplies(t, how, o, replies, ids, whole, nil)
		})
	}
}

func a34Pairs(kv ...string) []string { return kv }

// ---------------------------------------------------------------- tests

// Entries at and around the limit, repeated names, empty values, empty and
// binary names, interleaved names, malformed last values: each handed over
// one per reply (count 1) by both paths.
func TestAttack34_shapes(t *testing.T) {
	t.Parallel()
	const m = 200
	o := claim.Oversize{MaxBytes: m, KeepFields: 1100, KeepBytes: stream.CutBytes}
	type tc struct {
		name string
		f    []string
		kind string // "whole", "last", "cut": checked against the model first
	}
	var cs []tc
	// raw exactly M, duplicates: whole, duplicates kept.
	cs = append(cs, tc{"raw=M dup", a34Pairs("type", "t", "x", rep("a", 190), "x", "bbb"), "whole"})
	// raw M+1: last values.
	cs = append(cs, tc{"raw=M+1 dup", a34Pairs("type", "t", "x", rep("a", 191), "x", "bbb"), "last"})
	// counted exactly M, raw far over.
	cs = append(cs, tc{"counted=M", a34Pairs("type", "t", "payload", rep("p", 500), "payload", rep("q", 188)), "last"})
	// counted M+1: cut.
	cs = append(cs, tc{"counted=M+1", a34Pairs("type", "t", "payload", rep("p", 500), "payload", rep("q", 189)), "cut"})
	// counted M+1 without duplicates (raw = counted = M+1).
	cs = append(cs, tc{"no dup M+1", a34Pairs("type", "t", "payload", rep("q", 189)), "cut"})
	// raw = counted = M: whole.
	cs = append(cs, tc{"no dup M", a34Pairs("type", "t", "payload", rep("q", 188)), "whole"})
	// Longest value first, then ever shorter values of the same name.
	{
		f := []string{"type", "t"}
		for i := 40; i > 0; i-- {
			f = append(f, "payload", rep("v", 3*i))
		}
		f = append(f, "payload", "{}")
		cs = append(cs, tc{"longest early", f, "last"})
	}
	// Interleaved a b a c b: last values a@3 c@4 b@5.
	cs = append(cs, tc{"interleaved", a34Pairs("type", "t", "a", rep("A", 100), "b", rep("B", 100), "a", "3", "c", "4", "b", "5"), "last"})
	// type itself given again at the end, after every other last value.
	cs = append(cs, tc{"type moves last", a34Pairs("type", rep("x", 150), "h.k", "1", "payload", rep("y", 60), "payload", "{}", "type", "t"), "last"})
	// Raw within M: interleaved duplicates stay as they are.
	cs = append(cs, tc{"small dup order", a34Pairs("b", "1", "type", "t", "a", "2", "b", "3", "a", "4"), "whole"})
	// Empty last value.
	cs = append(cs, tc{"empty last", a34Pairs("type", "t", "h.k", rep("z", 190), "h.k", ""), "last"})
	// Empty earlier and last values of several names.
	cs = append(cs, tc{"empty values", a34Pairs("type", "t", "a", "", "b", rep("z", 200), "a", "", "b", "", "c", ""), "last"})
	// Empty name given twice.
	cs = append(cs, tc{"empty name", a34Pairs("type", "t", "", rep("e", 200), "", "z"), "last"})
	// Binary names and values: NUL, bytes >= 0x80, invalid UTF-8.
	cs = append(cs, tc{"binary", a34Pairs(
		"type", "t",
		"\x00", rep("\xff", 150),
		"\xff\x80", "v\x00",
		"\x00", "n\x00\x01",
		"a\x00b", rep("\x80", 60),
		"a\x00b", "",
		"\xc3\x28", "\xfe\xfe",
	), "last"})
	// Names that are Lua numbers or near it.
	cs = append(cs, tc{"numeric names", a34Pairs(
		"type", "t", "1", rep("1", 120), "01", "b", "1.0", "c", "1e0", "d", "-0", "e", "inf", "f", "nan", "g",
		"1", "h", "0x1", rep("i", 60), "0x1", "j",
	), "last"})
	// Lua-ish names.
	cs = append(cs, tc{"lua names", a34Pairs(
		"type", "t", "__index", rep("x", 150), "n", "1", "__newindex", "y", "__index", "z", "_G", rep("g", 50), "_G", "",
	), "last"})
	// The same value repeated.
	{
		f := []string{"type", "t"}
		for range 60 {
			f = append(f, "payload", "{}")
		}
		cs = append(cs, tc{"same value", f, "last"})
	}
	// 20 names, each given 5 times, in a different order each round: last
	// values come in the last round's order, not the first-come order.
	{
		f := []string{"type", "t"}
		for r := range 5 {
			for i := range 20 {
				j := (i*7 + r*3) % 20
				f = append(f, fmt.Sprintf("h.n%02d", j), fmt.Sprintf("%d%d", r, j%10))
			}
		}
		cs = append(cs, tc{"many names", f, "last"})
	}
	// Malformed: last attempt invalid, earlier valid; and the reverse.
	cs = append(cs, tc{"bad last attempt", a34Pairs("type", "t", "attempt", rep("1", 190), "attempt", "x"), "last"})
	cs = append(cs, tc{"good last attempt", a34Pairs("type", "t", "attempt", rep("x", 190), "attempt", "2"), "last"})
	cs = append(cs, tc{"empty last type", a34Pairs("type", rep("t", 190), "payload", "{}", "type", ""), "last"})
	cs = append(cs, tc{"version", a34Pairs("v", rep("1", 195), "type", "t", "v", "1"), "last"})
	cs = append(cs, tc{"bad version last", a34Pairs("v", "1", "type", "t", "payload", rep("p", 190), "payload", "", "v", "2"), "last"})
	cs = append(cs, tc{"no type", a34Pairs("payload", rep("p", 250), "payload", "x"), "last"})
	// Cut: the longest value ever is an earlier one of a name whose last is
	// short; the field reported is another's.
	cs = append(cs, tc{"cut earlier longest", a34Pairs("type", "t", "aaa", rep("a", 300), "aaa", "1", "zzz", rep("z", 250)), "cut"})
	// Cut: two longest last values of equal length: the smallest name.
	cs = append(cs, tc{"cut tie", a34Pairs("type", "t", "b", rep("b", 150), "a", rep("a", 150)), "cut"})
	// Cut: binary names in the tie.
	cs = append(cs, tc{"cut binary tie", a34Pairs("type", "t", "\xff", rep("b", 150), "\x00\xff", rep("a", 150), "\x00\xff", rep("c", 150)), "cut"})
	// More than KeepFields fields (duplicates) but few names: within by
	// counting, handed over as last values, not cut to KeepFields.
	{
		f := []string{"type", "t"}
		for i := range 1150 {
			f = append(f, "h.x", fmt.Sprint(i%10))
		}
		cs = append(cs, tc{"1151 fields 2 names", f, "last"})
	}
	// Over KeepFields fields and over the limit as counted: cut, one per
	// name in first-come order.
	{
		f := []string{"h.y", "0", "type", "t"}
		for i := range 1150 {
			f = append(f, "h.x", fmt.Sprint(i%10))
		}
		f = append(f, "h.y", rep("y", 300))
		cs = append(cs, tc{"1152 fields cut", f, "cut"})
	}
	var entries [][]string
	for _, c := range cs {
		fields, cut := a34Model(c.f, o)
		kind := "whole"
		if cut != nil {
			kind = "cut"
		} else if !slices.Equal(fields, c.f) {
			kind = "last"
		}
		if kind != c.kind {
			t.Fatalf("test bug: %s: model says %s, case says %s (raw %d counted %d)", c.name, kind, c.kind, rawBytes(c.f), countedBytes(c.f))
		}
		entries = append(entries, c.f)
	}
	// Independent spot checks of the model on a few cases.
	byName := func(n string) []string {
		for _, c := range cs {
			if c.name == n {
				return c.f
			}
		}
		t.Fatalf("test bug: no case %s", n)
		return nil
	}
	if got := lastValues(byName("interleaved")); !slices.Equal(got, []string{"type", "t", "a", "3", "c", "4", "b", "5"}) {
		t.Fatalf("test bug: interleaved last values %q", got)
	}
	if got := lastValues(byName("type moves last")); !slices.Equal(got, []string{"h.k", "1", "payload", "{}", "type", "t"}) {
		t.Fatalf("test bug: type-moves-last values %q", got)
	}
	if _, cut := a34Model(byName("cut earlier longest"), o); cut.Field != "zzz" || cut.Size != 5+4+253 {
		t.Fatalf("test bug: cut earlier longest %+v", cut)
	}
	if _, cut := a34Model(byName("cut tie"), o); cut.Field != "a" {
		t.Fatalf("test bug: cut tie %+v", cut)
	}
	a34Both(t, o, 1, entries)
}

// Small KeepFields and KeepBytes apply only to cut entries: an entry
// within the limit as counted keeps every last value, however many names
// and however long, and a cut one keeps what Oversize says.
func TestAttack34_smallKeep(t *testing.T) {
	t.Parallel()
	entries := [][]string{
		// cut, 2 fields: in order, each cut to 3.
		{"type", "t", "payload", rep("p", 100)},
		// cut, 3 fields > KeepFields 2: one per name, first-come, last value.
		{"payload", rep("a", 100), "type", "t", "payload", rep("b", 60)},
		// cut, 4 names: the first 2.
		{"a", rep("x", 60), "b", "1", "c", "2", "d", "3"},
		// cut, the longest value's name is long: Field cut to KeepBytes.
		{"type", "t", "h.a-long-header-name", rep("v", 80), "h.a-long-header-name", rep("w", 70)},
		// last values: 10 names of 2 bytes, each given twice: 20 fields,
		// 10 kept, none cut to 3 bytes.
		func() []string {
			var f []string
			for r := range 2 {
				for i := range 10 {
					f = append(f, fmt.Sprintf("n%d", (i+r*3)%10), fmt.Sprint(r))
				}
			}
			return f
		}(),
		// last values with a value longer than KeepBytes.
		{"type", "t", "payload", rep("p", 40), "payload", rep("q", 20), "h.k", "abcdef"},
		// whole: 5 names under the limit.
		{"type", "t", "a", "1", "b", "2", "c", "3", "d", "4"},
	}
	for _, o := range []claim.Oversize{
		{MaxBytes: 50, KeepFields: 2, KeepBytes: 3},
		{MaxBytes: 50, KeepFields: 0, KeepBytes: 3},
		{MaxBytes: 50, KeepFields: 1, KeepBytes: 1},
	} {
		t.Run(fmt.Sprintf("keep%d-%d", o.KeepFields, o.KeepBytes), func(t *testing.T) {
			t.Parallel()
			a34Both(t, o, 1, entries)
		})
	}
}

// The budget counts what is handed over: a deduplicated entry (raw far
// over the limit) counts its last values, a cut one what is kept of it.
// Each reply is exactly the entries a call takes before the handed-over
// bytes reach MaxBytes (or count), for both paths.
func TestAttack34_budgetExact(t *testing.T) {
	t.Parallel()
	o := claim.Oversize{MaxBytes: 1000, KeepFields: 2, KeepBytes: 8}
	var entries [][]string
	small := func(n int) []string { return []string{"type", "t", "payload", rep("s", n)} }
	dedup := func(raw, last int) []string {
		return []string{"type", "t", "payload", rep("r", raw), "h.k", "1", "payload", rep("l", last)}
	}
	entries = append(entries,
		small(100),       // 112
		dedup(5000, 10),  // raw 5033, handed 26
		dedup(3000, 5),   // handed 21
		small(880),       // 892: 112+26+21+892 = 1051 ≥ 1000 → stop
		dedup(4000, 500), // handed 516
		[]string{"type", "t", "payload", rep("c", 3000)},                     // cut: handed 4+1+7+8 = 20
		[]string{"payload", rep("c", 3000), "a", "1", "b", "2", "type", "t"}, // cut, 4 names: 2 kept, 7+8+1+1 = 17
		dedup(2000, 450),            // handed 466: 516+20+17+466 = 1019 → stop
		dedup(9000, 1000-4-1-3-1-7), // counted exactly 1000: alone
		small(988),                  // 1000 exactly: alone
		dedup(1200, 0),              // 16
		small(0),                    // 12
		dedup(1500, 1),              // 17
	)
	for i := range 12 {
		entries = append(entries, dedup(1100+i*50, 60+i)) // 76+i each
	}
	sizes := make([]int, len(entries))
	for i, f := range entries {
		sizes[i] = a34Handed(f, o)
	}
	if sizes[0] != 112 || sizes[1] != 26 || sizes[4] != 516 || sizes[5] != 20 || sizes[6] != 17 || sizes[8] != 1000 || sizes[9] != 1000 {
		t.Fatalf("test bug: handed sizes %v", sizes)
	}
	for _, k := range []int{1, 2, 3, 100} {
		for _, how := range []string{"Sweep", "ReadOwn"} {
			t.Run(fmt.Sprintf("%s/count%d", how, k), func(t *testing.T) {
				t.Parallel()
				_, ids, whole, replies := a34Hand(t, how, entries, o, k)
				a34CheckReplies(t, how, o, replies, ids, whole, nil)
				// Exact partition: each reply is the greedy prefix of the
				// entries not handed over yet.
				next := 0
				for i, r := range replies {
					if len(r.entries) == 0 && len(r.deleted) == 0 {
						continue
					}
					want := a34Greedy(sizes[next:], o.MaxBytes, r.count)
					gotIDs := entryIDs(r.entries)
					wantIDs := ids[next:min(len(ids), next+want)]
					if !slices.Equal(gotIDs, wantIDs) {
						var gs, ws []int
						for _, en := range r.entries {
							gs = append(gs, rawBytes(en.Fields))
						}
						ws = sizes[next:min(len(ids), next+want)]
						t.Errorf("%s count %d reply %d (count %d): took %d entries with handed sizes %v; want %d with %v (handed over as the docs say; the budget %d counts them as handed over)",
							how, k, i, r.count, len(gotIDs), gs, want, ws, o.MaxBytes)
						break
					}
					next += len(gotIDs)
				}
			})
		}
	}
}

// Entries deleted while pending between deduplicated and cut ones: each
// reported once as deleted and gone from the PEL, the others handed over
// once with their last values; the budget holds.
func TestAttack34_deletedBetween(t *testing.T) {
	t.Parallel()
	o := claim.Oversize{MaxBytes: 300, KeepFields: 3, KeepBytes: 16}
	entries := [][]string{
		{"type", "t", "payload", rep("a", 400), "payload", "1"},   // 0 last values
		{"type", "t", "payload", rep("b", 500), "payload", "2"},   // 1 deleted
		{"type", "t", "payload", rep("c", 600), "payload", "3"},   // 2 last values
		{"type", "t", "payload", rep("d", 700)},                   // 3 deleted
		{"type", "t", "payload", rep("e", 350)},                   // 4 cut
		{"type", "t", "h.x", "1", "h.x", rep("f", 280)},           // 5 whole (raw 296)
		{"type", "t", "payload", rep("g", 900), "payload", "7"},   // 6 deleted
		{"h.x", rep("h", 200), "type", "t", "h.x", rep("i", 200)}, // 7 last values (counted 208)
		{"type", "t", "payload", rep("j", 300), "payload", "{}"},  // 8 deleted, last
	}
	del := []int{1, 3, 6, 8}
	for _, k := range []int{1, 2, 5, 100} {
		for _, how := range []string{"Sweep", "ReadOwn"} {
			t.Run(fmt.Sprintf("%s/count%d", how, k), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				ids := e.a34Add(entries)
				whole := map[string][]string{}
				for i, id := range ids {
					whole[id] = entries[i]
				}
				wantDeleted := map[string]bool{}
				var delIDs []any
				for _, i := range del {
					wantDeleted[ids[i]] = true
					delIDs = append(delIDs, ids[i])
				}
				var replies []a34Reply
				if how == "Sweep" {
					e.a34Deliver("dead", len(ids))
					e.age(stale, ids...)
					if err := e.rdb.Do(e.ctx, append([]any{"XDEL", e.stream}, delIDs...)...).Err(); err != nil {
						t.Fatal(err)
					}
					replies = a34SweepAll(t, e, o, k)
				} else {
					e.a34Deliver("me", len(ids))
					if err := e.rdb.Do(e.ctx, append([]any{"XDEL", e.stream}, delIDs...)...).Err(); err != nil {
						t.Fatal(err)
					}
					replies = a34ReadOwnAll(t, e, o, "me", k)
				}
				a34CheckReplies(t, how, o, replies, ids, whole, wantDeleted)
				for id := range wantDeleted {
					e.wantNotPending(id)
				}
				for i, id := range ids {
					if !wantDeleted[id] {
						owner := "me"
						if how == "Sweep" {
							owner = "taker"
						}
						e.wantPending(owner, 2, ids[i])
					}
				}
			})
		}
	}
}

// MaxBytes 0 hands every entry over whole, duplicates kept, however large,
// and (no limit, no budget) takes up to count entries per call.
func TestAttack34_maxBytesZero(t *testing.T) {
	t.Parallel()
	o := claim.Oversize{MaxBytes: 0, KeepFields: 1, KeepBytes: 1}
	entries := [][]string{
		{"type", "t", "payload", rep("a", 200_000), "payload", "{}"},
		{"type", "t", "payload", rep("b", 100_000)},
		{"a", "1", "b", "2", "a", "3", "type", "t"},
		{"type", "t", "", "", "", "x", "\x00\xff", rep("\x00", 5000)},
		{"type", "t"},
	}
	for _, how := range []string{"Sweep", "ReadOwn"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			_, ids, whole, replies := a34Hand(t, how, entries, o, 10)
			got := a34CheckReplies(t, how, o, replies, ids, whole, nil)
			for _, id := range ids {
				if en := got[id]; !slices.Equal(en.Fields, whole[id]) || en.Cut != nil {
					t.Errorf("%s %s: MaxBytes 0: Fields %s Cut %v; want whole", how, id, a34Short(en.Fields), en.Cut)
				}
			}
			if len(replies) == 0 {
				t.Fatalf("%s: no replies", how)
			}
			if len(replies[0].entries) != min(len(ids), replies[0].count) {
				var n []int
				for _, r := range replies {
					n = append(n, len(r.entries))
				}
				t.Errorf("%s: MaxBytes 0: replies of %v entries (first count %d); want the first to take min(count, %d)", how, n, replies[0].count, len(ids))
			}
		})
	}
}

// Random entries over a small alphabet of names (binary and empty ones
// included), random value lengths around the limit, random counts: every
// entry against the model, DecodeFields equivalence, the budget and
// exactly-once, on both paths, with an exact greedy partition.
func TestAttack34_random(t *testing.T) {
	t.Parallel()
	names := []string{"type", "payload", "a", "b", "\x00", "\xff\xfe", "", "h.x", "h.", "attempt", "job_id", "v"}
	for seed := uint64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 34))
		m := 100 + r.IntN(400)
		o := claim.Oversize{MaxBytes: m, KeepFields: 1 + r.IntN(5), KeepBytes: 1 + r.IntN(40)}
		if seed%2 == 0 {
			o.KeepFields, o.KeepBytes = 1100, stream.CutBytes
		}
		var entries [][]string
		for range 40 {
			n := 1 + r.IntN(12)
			f := []string{}
			if r.IntN(4) != 0 {
				f = append(f, "type", "t")
			}
			for range n {
				name := names[r.IntN(len(names))]
				var val string
				switch r.IntN(4) {
				case 0:
					val = ""
				case 1:
					val = fmt.Sprint(r.IntN(100))
				default:
					b := make([]byte, r.IntN(m))
					for i := range b {
						b[i] = byte(r.IntN(256))
					}
					val = string(b)
				}
				f = append(f, name, val)
			}
			if len(f) == 0 {
				f = append(f, "type", "t")
			}
			entries = append(entries, f)
		}
		k := 1 + r.IntN(6)
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			sizes := make([]int, len(entries))
			for i, f := range entries {
				sizes[i] = a34Handed(f, o)
			}
			for _, how := range []string{"Sweep", "ReadOwn"} {
				t.Run(how, func(t *testing.T) {
					t.Parallel()
					_, ids, whole, replies := a34Hand(t, how, entries, o, k)
					a34CheckReplies(t, fmt.Sprintf("%s %+v", how, o), o, replies, ids, whole, nil)
					next := 0
					for i, rp := range replies {
						if len(rp.entries) == 0 {
							continue
						}
						want := a34Greedy(sizes[next:], o.MaxBytes, rp.count)
						if got := entryIDs(rp.entries); !slices.Equal(got, ids[next:min(len(ids), next+want)]) {
							t.Errorf("%s reply %d (count %d): took %d entries; want %d (handed sizes from %d: %v)", how, i, rp.count, len(got), want, next, sizes[next:min(len(sizes), next+want+2)])
							break
						}
						next += len(rp.entries)
					}
				})
			}
		})
	}
}

// Entries with thousands of fields: many distinct names each given twice
// (over stream.MaxFields as counted, so decoding fails the same way either
// way), one name given thousands of times, and a cut entry kept whole in
// order under a large KeepFields; with small neighbours in the same replies.
func TestAttack34_manyFields(t *testing.T) {
	t.Parallel()
	o := claim.Oversize{MaxBytes: 60_000, KeepFields: 10_000, KeepBytes: stream.CutBytes}
	distinct := func(n int) []string {
		f := []string{"type", "t"}
		for r := range 2 {
			for i := range n {
				f = append(f, fmt.Sprintf("h.%05d", (i*13+r)%n), fmt.Sprint(r))
			}
		}
		return f
	}
	same := []string{"type", "t"}
	for i := range 9000 {
		same = append(same, "payload", fmt.Sprintf("%07d", i))
	}
	over := []string{"type", "t"}
	for i := range 8000 {
		over = append(over, fmt.Sprintf("h.%05d", i%4000), rep("x", 10+i%5))
	}
	entries := [][]string{
		{"type", "t", "payload", "{}"},
		distinct(900),  // within MaxFields: a job
		distinct(6000), // 6,000 names: too many fields
		{"type", "t", "payload", "{}"},
		same,
		over,
		{"type", "t", "payload", "{}"},
	}
	kinds := []string{}
	for _, f := range entries {
		got, cut := a34Model(f, o)
		switch {
		case cut != nil:
			kinds = append(kinds, "cut")
		case !slices.Equal(got, f):
			kinds = append(kinds, "last")
		default:
			kinds = append(kinds, "whole")
		}
	}
	if want := []string{"whole", "whole", "last", "whole", "last", "cut", "whole"}; !slices.Equal(kinds, want) {
		t.Fatalf("test bug: kinds %v; want %v", kinds, want)
	}
	a34Both(t, o, 3, entries)
}

// Two claimers sweep the same deduplicated and cut entries at once: each
// entry is handed over exactly once in all, with its last values, and each
// reply keeps to the budget.
func TestAttack34_twoSweepers(t *testing.T) {
	t.Parallel()
	o := claim.Oversize{MaxBytes: 500, KeepFields: 4, KeepBytes: 32}
	var entries [][]string
	for i := range 60 {
		switch i % 3 {
		case 0:
			entries = append(entries, []string{"type", "t", "payload", rep("a", 600+i), "h.i", fmt.Sprint(i), "payload", rep("b", i)})
		case 1:
			entries = append(entries, []string{"type", "t", "payload", rep("c", 520+i)})
		default:
			entries = append(entries, []string{"type", "t", "payload", rep("d", 100+i)})
		}
	}
	e := setup(t)
	ids := e.a34Add(entries)
	whole := map[string][]string{}
	for i, id := range ids {
		whole[id] = entries[i]
	}
	e.a34Deliver("dead", len(ids))
	e.age(stale, ids...)
	type result struct {
		replies []a34Reply
		err     error
	}
	results := make(chan result, 2)
	for _, name := range []string{"taker-a", "taker-b"} {
		go func() {
			c := claim.New(e.rdb, e.stream, group, name, o)
			var rs []a34Reply
			for range 200 {
				progressed := false
				err := c.Sweep(e.ctx, visibility, upTo(3), func(reserved int, claimed []claim.Entry, deleted []string) {
					rs = append(rs, a34Reply{reserved, claimed, deleted})
					if len(claimed)+len(deleted) > 0 {
						progressed = true
					}
				})
				if err != nil {
					results <- result{rs, err}
					return
				}
				if !progressed {
					break
				}
			}
			results <- result{rs, nil}
		}()
	}
	var all []a34Reply
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatalf("Sweep: %v", r.err)
		}
		all = append(all, r.replies...)
	}
	a34CheckReplies(t, "two sweepers", o, all, ids, whole, nil)
	pel := e.pending()
	for _, id := range ids {
		if p, ok := pel[id]; !ok || p.RetryCount != 2 || (p.Consumer != "taker-a" && p.Consumer != "taker-b") {
			t.Errorf("%s: pending %+v (present %v); want a taker's, count 2", id, p, ok)
		}
	}
}

// a34Hand adds entries to a new stream and hands them over how ("Sweep":
// delivered to a dead consumer, aged, swept; "ReadOwn": delivered to "me",
// re-read), k at a time, under o; it returns the env, the entries' IDs,
// each ID's fields as added, and the replies.
func a34Hand(t *testing.T, how string, entries [][]string, o claim.Oversize, k int) (*env, []string, map[string][]string, []a34Reply) {
	t.Helper()
	e := setup(t)
	ids := e.a34Add(entries)
	whole := map[string][]string{}
	for i, id := range ids {
		whole[id] = entries[i]
	}
	if how == "Sweep" {
		e.a34Deliver("dead", len(ids))
		e.age(stale, ids...)
		return e, ids, whole, a34SweepAll(t, e, o, k)
	}
	e.a34Deliver("me", len(ids))
	return e, ids, whole, a34ReadOwnAll(t, e, o, "me", k)
}
