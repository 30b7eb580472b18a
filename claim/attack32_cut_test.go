package claim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/stream"
)

// attack32: an entry over the Claimer's size limit is handed over cut short
// by Sweep and ReadOwn (claim.Cut) with the verdict stream.DecodeFields gives
// the whole entry; an entry within it is handed over whole, every field in
// order, duplicates kept.

const (
	a32Max        = 2000
	a32KeepFields = 1100
	a32KeepBytes  = 1024
)

type a32Case struct {
	name   string
	max    int // Oversize.MaxBytes; a32Max when 0
	fields []string
	// Independent expectations from the docs (checked besides the
	// comparison with stream.DecodeFields): wantCut says whether the entry
	// is over the limit, wantField the field reported, wantSize its size.
	wantCut   bool
	wantField string
	wantSize  int
	wantLeft  int
}

func rep(s string, n int) string { return strings.Repeat(s, n) }

func a32Cases() []a32Case {
	var cs []a32Case
	// type=t, payload=<p>: size 4+1+7+p.
	cs = append(cs,
		a32Case{name: "at limit", fields: []string{"type", "t", "payload", rep("x", 1988)}, wantSize: 2000},
		a32Case{name: "one over", fields: []string{"type", "t", "payload", rep("x", 1989)}, wantCut: true, wantField: "payload", wantSize: 2001},
		a32Case{name: "earlier value huge, last small",
			fields:   []string{"payload", rep("x", 5000), "type", "t", "payload", "small"},
			wantSize: 7 + 5 + 5},
		a32Case{name: "earlier values huge, last at limit",
			fields:   []string{"payload", rep("x", 5000), "type", "t", "payload", rep("x", 3000), "payload", rep("y", 1988)},
			wantSize: 2000},
		a32Case{name: "earlier small, last huge",
			fields:  []string{"payload", "small", "type", "t", "payload", rep("x", 5000)},
			wantCut: true, wantField: "payload", wantSize: 7 + 5000 + 5},
		a32Case{name: "earlier huge, last one over",
			fields:  []string{"payload", rep("x", 5000), "payload", rep("z", 1989), "type", "t"},
			wantCut: true, wantField: "payload", wantSize: 2001},
		// The longest value ever written is a's first, but a's last is
		// empty: the field reported is b's.
		a32Case{name: "longest earlier value not last",
			fields:  []string{"a", rep("x", 3000), "b", rep("x", 1500), "c", rep("x", 600), "a", ""},
			wantCut: true, wantField: "b", wantSize: 1 + 1 + 1500 + 1 + 600},
		a32Case{name: "tie differs by case",
			fields:  []string{"b", rep("v", 700), "a", rep("v", 700), "B", rep("v", 700)},
			wantCut: true, wantField: "B", wantSize: 3 + 2100},
		a32Case{name: "tie high bytes",
			fields:  []string{"\xc3\xa9", rep("v", 700), "\xff", rep("v", 700), "z", rep("v", 700), "\x80", rep("v", 700)},
			wantCut: true, wantField: "z", wantSize: 2 + 1 + 1 + 1 + 2800},
		a32Case{name: "tie only high bytes",
			fields:  []string{"\xff\x01", rep("v", 700), "\xc3\xa9", rep("v", 700), "\xfe\xff", rep("v", 700), "\x80\x80", rep("v", 700)},
			wantCut: true, wantField: "\x80\x80", wantSize: 8 + 2800},
		a32Case{name: "tie prefix and NUL",
			fields:  []string{"a\x00b", rep("v", 700), "a\x00a", rep("v", 700), "ab", rep("v", 700), "b", "w"},
			wantCut: true, wantField: "a\x00a", wantSize: 3 + 3 + 2 + 1 + 1 + 2100},
		a32Case{name: "tie broken by a later shorter value",
			fields:  []string{"a", rep("v", 900), "b", rep("v", 900), "c", rep("v", 300), "a", rep("v", 899)},
			wantCut: true, wantField: "b", wantSize: 3 + 900 + 899 + 300},
		a32Case{name: "long name",
			fields:  []string{"type", "t", rep("n", 1500), rep("x", 1000)},
			wantCut: true, wantField: rep("n", 1024), wantSize: 5 + 2500},
		a32Case{name: "long name empty value",
			fields:  []string{rep("N", 2100), "", "type", "t"},
			wantCut: true, wantField: "type", wantSize: 2105},
		a32Case{name: "all values empty",
			fields:  []string{rep("b", 1100), "", rep("a", 1100), ""},
			wantCut: true, wantField: rep("a", 1024), wantSize: 2200},
		a32Case{name: "names equal after cut",
			fields:  []string{rep("k", 1024) + "b", rep("v", 500), rep("k", 1024) + "a", rep("v", 500)},
			wantCut: true, wantField: rep("k", 1024), wantSize: 2*1025 + 1000},
	)

	// More than KeepFields fields, all distinct.
	many := []string{"type", "t"}
	for i := range 1199 {
		many = append(many, fmt.Sprintf("f%04d", i), "v")
	}
	cs = append(cs, a32Case{name: "1200 fields", fields: many, wantCut: true, wantField: "f0000",
		wantSize: 5 + 1199*6, wantLeft: 100})

	// 1101 fields, 1100 names: one per name, the repeated one at its first
	// place with its last value.
	dup := []string{"type", "t"}
	for i := range 1099 {
		dup = append(dup, fmt.Sprintf("f%04d", i), "v")
	}
	dup = append(dup, "type", "uu")
	cs = append(cs, a32Case{name: "1101 fields 1100 names", fields: dup, wantCut: true, wantField: "type",
		wantSize: 6 + 1099*6, wantLeft: 1})

	// Exactly KeepFields fields with duplicates: every field, in order.
	exact := []string{"type", "t"}
	for i := range 1000 {
		exact = append(exact, fmt.Sprintf("f%04d", i), "v")
	}
	for i := range 99 {
		exact = append(exact, fmt.Sprintf("f%04d", i), "w")
	}
	cs = append(cs, a32Case{name: "1100 fields with duplicates", fields: exact, wantCut: true, wantField: "f0000",
		wantSize: 5 + 1000*6, wantLeft: 0})

	// 5000 fields (more than Lua unpacks at once), 1500 names, the longest
	// value a late duplicate.
	big := []string{}
	for i := range 5000 {
		v := "v"
		if i == 4990 {
			v = rep("L", 1500)
		}
		big = append(big, fmt.Sprintf("g%04d", i%1500), v)
	}
	cs = append(cs, a32Case{name: "5000 fields 1500 names", fields: big, wantCut: true,
		wantField: fmt.Sprintf("g%04d", 4990%1500), wantSize: 1500*5 + 1499 + 1500, wantLeft: 5000 - 1100})

	// Within a larger limit: 1200 fields with duplicates come whole.
	whole := []string{"type", "t"}
	for i := range 1199 {
		whole = append(whole, fmt.Sprintf("h%03d", i%300), rep("w", i%7))
	}
	cs = append(cs, a32Case{name: "1200 fields within limit", max: 1 << 20, fields: whole})
	return cs
}

// a32Verdict computes size and field as the docs define them: each name
// once with its last value; field the name of the longest value, smallest
// name (bytewise) among ties, cut to stream.CutBytes.
func a32Verdict(fields []string) (size int, field string) {
	defer func() { field = field[:min(len(field), stream.CutBytes)] }()
	last := map[string]string{}
	for i := 0; i < len(fields); i += 2 {
		last[fields[i]] = fields[i+1]
	}
	best := -1
	for n, v := range last {
		size += len(n) + len(v)
		if len(v) > best || (len(v) == best && n < field) {
			best, field = len(v), n
		}
	}
	return size, field
}

// a32CutFields is what the docs say Fields holds of an entry over the
// limit, and how many fields it leaves out.
func a32CutFields(fields []string) ([]string, int) {
	cut := func(s string) string { return s[:min(len(s), a32KeepBytes)] }
	n := len(fields) / 2
	var out []string
	if n <= a32KeepFields {
		for _, f := range fields {
			out = append(out, cut(f))
		}
		return out, 0
	}
	last := map[string]string{}
	var order []string
	for i := 0; i < len(fields); i += 2 {
		if _, ok := last[fields[i]]; !ok {
			order = append(order, fields[i])
		}
		last[fields[i]] = fields[i+1]
	}
	if len(order) > a32KeepFields {
		order = order[:a32KeepFields]
	}
	for _, name := range order {
		out = append(out, cut(name), cut(last[name]))
	}
	return out, n - len(order)
}

func (e *env) rawAdd(fields []string) string {
	e.t.Helper()
	args := []any{"XADD", e.stream, "*"}
	for _, f := range fields {
		args = append(args, f)
	}
	id, err := e.rdb.Do(e.ctx, args...).Text()
	if err != nil {
		e.t.Fatalf("XADD: %v", err)
	}
	return id
}

// rawFields returns the entry's fields as Redis holds them (XRANGE).
func (e *env) rawFields(id string) []string {
	e.t.Helper()
	res, err := e.rdb.Do(e.ctx, "XRANGE", e.stream, id, id).Slice()
	if err != nil || len(res) != 1 {
		e.t.Fatalf("XRANGE %s: %v %v", id, res, err)
	}
	kv := res[0].([]any)[1].([]any)
	out := make([]string, len(kv))
	for i, x := range kv {
		out[i] = x.(string)
	}
	return out
}

func short(fs []string) string {
	var b strings.Builder
	b.WriteString("[")
	for i, f := range fs {
		if i == 12 {
			fmt.Fprintf(&b, " ... (%d in all)", len(fs))
			break
		}
		if len(f) > 20 {
			f = fmt.Sprintf("%q…(%d)", f[:20], len(f))
		} else {
			f = fmt.Sprintf("%q", f)
		}
		b.WriteString(f + " ")
	}
	return b.String() + "]"
}

// a32Check checks one handed-over entry against the docs and against
// stream.DecodeFields of the whole entry.
func a32Check(t *testing.T, how string, c a32Case, whole []string, got claim.Entry, wantDeliveries int) {
	t.Helper()
	max := c.max
	if max == 0 {
		max = a32Max
	}
	if !slices.Equal(whole, c.fields) {
		t.Fatalf("%s: XRANGE gave %s; want %s", c.name, short(whole), short(c.fields))
	}
	if got.Deliveries != wantDeliveries {
		t.Errorf("%s %s: Deliveries %d; want %d", how, c.name, got.Deliveries, wantDeliveries)
	}
	size, field := a32Verdict(whole)
	if c.wantCut && (size != c.wantSize || field != c.wantField) {
		t.Fatalf("test bug: %s: verdict %d %q; case says %d %q", c.name, size, field, c.wantSize, c.wantField)
	}
	_, err := stream.DecodeFields(got.ID, whole, max)
	var de *stream.DecodeError
	oversize := errors.As(err, &de) && de.Size > 0
	if oversize != c.wantCut {
		t.Errorf("%s: DecodeFields(whole) = %v; want oversize %v", c.name, err, c.wantCut)
	}
	if oversize && (de.Size != size || de.Field != field) {
		t.Errorf("%s: DecodeFields(whole) reports size %d field %q; docs say %d %q", c.name, de.Size, short([]string{de.Field}), size, short([]string{field}))
	}
	if !c.wantCut {
		if got.Cut != nil {
			t.Errorf("%s %s: within the limit (size %d ≤ %d) but Cut = %+v", how, c.name, size, max, *got.Cut)
		}
		// Entry.Fields: whole, unless its names and values add up to more
		// than the limit; then one value per name, its last.
		want := whole
		if rawBytes(whole) > max {
			want = lastValues(whole)
		}
		if !slices.Equal(got.Fields, want) {
			t.Errorf("%s %s: within the limit: Fields %s; want %s", how, c.name, short(got.Fields), short(want))
		}
		return
	}
	if got.Cut == nil {
		t.Errorf("%s %s: size %d over %d, handed over whole (%d fields, Cut nil)", how, c.name, size, max, len(got.Fields)/2)
		return
	}
	if got.Cut.Size != size {
		t.Errorf("%s %s: Cut.Size %d; want %d", how, c.name, got.Cut.Size, size)
	}
	if oversize && got.Cut.Size != de.Size {
		t.Errorf("%s %s: Cut.Size %d; DecodeFields says %d", how, c.name, got.Cut.Size, de.Size)
	}
	if got.Cut.Field != field {
		t.Errorf("%s %s: Cut.Field %s; want %s", how, c.name, short([]string{got.Cut.Field}), short([]string{field}))
	}
	if oversize && got.Cut.Field != de.Field {
		t.Errorf("%s %s: Cut.Field %s; DecodeFields says %s", how, c.name, short([]string{got.Cut.Field}), short([]string{de.Field}))
	}
	if oversize {
		// The error the consumer would build from the Cut is the one of a
		// whole read.
		if o := stream.OversizeError(got.ID, got.Cut.Field, got.Cut.Size, max); o.Error() != de.Error() {
			t.Errorf("%s %s: OversizeError from Cut %q; DecodeFields %q", how, c.name, o.Error(), de.Error())
		}
	}
	wantFields, left := a32CutFields(whole)
	if left != c.wantLeft {
		t.Fatalf("test bug: %s: left %d; case says %d", c.name, left, c.wantLeft)
	}
	if got.Cut.Left != left {
		t.Errorf("%s %s: Cut.Left %d; want %d", how, c.name, got.Cut.Left, left)
	}
	if !slices.Equal(got.Fields, wantFields) {
		t.Errorf("%s %s: Fields %s; want %s", how, c.name, short(got.Fields), short(wantFields))
		for i := range min(len(got.Fields), len(wantFields)) {
			if got.Fields[i] != wantFields[i] {
				t.Errorf("  first difference at %d: %s vs %s", i, short(got.Fields[i:i+1]), short(wantFields[i:i+1]))
				break
			}
		}
	}
	for _, f := range got.Fields {
		if len(f) > a32KeepBytes {
			t.Errorf("%s %s: a name or value of %d bytes handed over", how, c.name, len(f))
			break
		}
	}
}

func TestAttack32_cutVerdict(t *testing.T) {
	t.Parallel()
	for _, c := range a32Cases() {
		for _, how := range []string{"Sweep", "ReadOwn"} {
			t.Run(how+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				max := c.max
				if max == 0 {
					max = a32Max
				}
				before := e.add(1)
				id := e.rawAdd(c.fields)
				after := e.add(1)
				ids := []string{before[0], id, after[0]}
				over := claim.Oversize{MaxBytes: max, KeepFields: a32KeepFields, KeepBytes: a32KeepBytes}
				var got []claim.Entry
				switch how {
				case "Sweep":
					if r := e.read("dead", 10); !slices.Equal(r, ids) {
						t.Fatalf("read %v; want %v", r, ids)
					}
					e.age(stale, ids...)
					calls := sweep(t, claim.New(e.rdb, e.stream, group, "c", over), visibility, upTo(100))
					for _, cl := range calls {
						got = append(got, cl.claimed...)
						if len(cl.deleted) > 0 {
							t.Errorf("deleted %v; want none", cl.deleted)
						}
					}
				case "ReadOwn":
					if r := e.read("c", 10); !slices.Equal(r, ids) {
						t.Fatalf("read %v; want %v", r, ids)
					}
					es, del := readOwnAll(t, claim.New(e.rdb, e.stream, group, "c", over), 100)
					if len(del) > 0 {
						t.Errorf("deleted %v; want none", del)
					}
					got = es
				}
				if g := entryIDs(got); !slices.Equal(g, ids) {
					t.Fatalf("%s handed over %v; want %v", how, g, ids)
				}
				for _, other := range []claim.Entry{got[0], got[2]} {
					if other.Cut != nil || len(other.Fields) != 2 || other.Fields[0] != "n" {
						t.Errorf("neighbour %s: %+v", other.ID, other)
					}
				}
				a32Check(t, how, c, e.rawFields(id), got[1], 2)
				e.wantPending("c", 2, ids...)
			})
		}
	}
}

// An oversize entry deleted while pending is reported deleted (not cut,
// not claimed), by both paths; an oversize neighbour is still cut.
func TestAttack32_deletedWhilePending(t *testing.T) {
	t.Parallel()
	over := claim.Oversize{MaxBytes: a32Max, KeepFields: a32KeepFields, KeepBytes: a32KeepBytes}
	for _, how := range []string{"Sweep", "ReadOwn"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			gone := e.rawAdd([]string{"type", "t", "payload", rep("x", 5000)})
			kept := e.rawAdd([]string{"type", "t", "payload", rep("y", 5000)})
			owner := "dead"
			if how == "ReadOwn" {
				owner = "c"
			}
			e.read(owner, 10)
			if how == "Sweep" {
				e.age(stale, gone, kept)
			}
			if err := e.rdb.XDel(e.ctx, e.stream, gone).Err(); err != nil {
				t.Fatal(err)
			}
			cl := claim.New(e.rdb, e.stream, group, "c", over)
			var got []claim.Entry
			var del []string
			if how == "Sweep" {
				calls := sweep(t, cl, visibility, upTo(100))
				got, del = nil, deletedIDs(calls)
				for _, c := range calls {
					got = append(got, c.claimed...)
				}
			} else {
				got, del = readOwnAll(t, cl, 100)
			}
			if !slices.Equal(del, []string{gone}) {
				t.Errorf("deleted %v; want [%s]", del, gone)
			}
			if len(got) != 1 || got[0].ID != kept || got[0].Cut == nil || got[0].Cut.Size != 4+1+7+5000 || got[0].Cut.Field != "payload" {
				t.Errorf("claimed %+v; want only %s, cut (size %d, field payload)", got, kept, 4+1+7+5000)
			}
			e.wantNotPending(gone)
			e.wantPending("c", 2, kept)
		})
	}
}

var _ = context.Background
