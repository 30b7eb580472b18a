package claim_test

import (
	"errors"
	"math/rand/v2"
	"slices"
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
				if err := c.Sweep(e.ctx, 0, func(int) int { return 1000 }, func(_ int, claimed []claim.Entry, _ []string) {
					got = append(got, claimed...)
				}); err != nil {
					t.Fatal(err)
				}
			} else {
				var err error
				if got, _, err = claim.New(e.rdb, e.stream, group, "a", over).ReadOwn(e.ctx, "0", 1000); err != nil {
					t.Fatal(err)
				}
			}
			if len(got) != len(all) {
				t.Fatalf("%d entries handed over, want %d", len(got), len(all))
			}
			cuts := 0
			for i, g := range got {
				if g.ID != ids[i] {
					t.Fatalf("entry %d: ID %s, want %s", i, g.ID, ids[i])
				}
				_, err := stream.DecodeFields(ids[i], all[i], limit)
				var de *stream.DecodeError
				if !errors.As(err, &de) || de.Size == 0 {
					if g.Cut != nil || !slices.Equal(g.Fields, all[i]) {
						t.Errorf("entry %s within the limit (%v): cut %+v, fields %q; want it whole: %q", g.ID, err, g.Cut, g.Fields, all[i])
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
			t.Logf("%d of %d entries cut", cuts, len(all))
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
