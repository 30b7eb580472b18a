package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// attack32: an oversize entry taken over by a reclaim (Sweep) or a re-read of
// the consumer's own pending entries (ReadOwn) ends in the same dead letter
// as when it is read fresh, and entries within the limit run once.

func a32rep(s string, n int) string { return strings.Repeat(s, n) }

// a32rawEntries returns the entries of key (XRANGE), fields as Redis holds
// them: in order, duplicates kept.
func a32rawEntries(t *testing.T, rdb *redis.Client, key string) [][]string {
	t.Helper()
	res, err := rdb.Do(context.Background(), "XRANGE", key, "-", "+").Slice()
	if err != nil {
		if err == redis.Nil {
			return nil
		}
		t.Fatalf("XRANGE %s: %v", key, err)
	}
	var out [][]string
	for _, r := range res {
		m := r.([]any)
		kv := m[1].([]any)
		fs := []string{m[0].(string)}
		for _, x := range kv {
			fs = append(fs, x.(string))
		}
		out = append(out, fs)
	}
	return out
}

// a32norm drops the dead_* fields that name the run (time, consumer,
// entry ID, attempts) and replaces the entry ID in dead_error.
func a32norm(fields []string, id string) []string {
	var out []string
	for i := 0; i+1 < len(fields); i += 2 {
		switch fields[i] {
		case "dead_at", "dead_consumer", "dead_entry_id", "dead_attempts", "dead_stream":
			continue
		case "dead_error":
			out = append(out, fields[i], strings.ReplaceAll(fields[i+1], id, "<id>"))
			continue
		}
		out = append(out, fields[i], fields[i+1])
	}
	return out
}

func a32short(fs []string) string {
	var b strings.Builder
	for i, f := range fs {
		if i == 16 {
			fmt.Fprintf(&b, " ... (%d in all)", len(fs))
			break
		}
		if len(f) > 24 {
			fmt.Fprintf(&b, "%q…(%d) ", f[:24], len(f))
		} else {
			fmt.Fprintf(&b, "%q ", f)
		}
	}
	return "[" + b.String() + "]"
}

type a32Entry struct {
	name   string
	fields []string
	// runs: a valid job within the limit (job_id = name) that must run
	// once; else it must be dead-lettered as oversize with size and field.
	runs  bool
	size  int
	field string
}

func a32Entries() []a32Entry {
	job := func(name string, extra ...string) []string {
		return append([]string{"type", "t", "job_id", name}, extra...)
	}
	// job(name): 4+1+6+len(name)
	base := func(name string) int { return 11 + len(name) }
	es := []a32Entry{
		{name: "under", fields: job("under", "payload", a32rep("x", 2000-base("under")-7)), runs: true},
		{name: "over", fields: job("over", "payload", a32rep("x", 2000-base("over")-7+1)), size: 2001, field: "payload"},
		{name: "dupbig", fields: job("dupbig", "payload", a32rep("x", 6000), "payload", "{}"), runs: true},
		{name: "duplate", fields: job("duplate", "payload", "{}", "payload", a32rep("x", 3000)), size: base("duplate") + 7 + 3000, field: "payload"},
		{name: "tie", fields: job("tie", "h.b", a32rep("v", 900), "h.B", a32rep("v", 900), "h.\xc3\xa9", a32rep("v", 900)),
			size: base("tie") + 3 + 3 + 4 + 2700, field: "h.B"},
		{name: "longname", fields: job("longname", a32rep("n", 1500), a32rep("x", 1000)), size: base("longname") + 2500, field: a32rep("n", 1500)},
	}
	many := job("many")
	for i := range 1199 {
		many = append(many, fmt.Sprintf("f%04d", i), "v")
	}
	// all values of f* are 1 byte, "t" too: longest is job_id "many" (4).
	es = append(es, a32Entry{name: "many", fields: many, size: base("many") + 1199*6, field: "job_id"})
	dup := job("dup1101")
	for i := range 1098 {
		dup = append(dup, fmt.Sprintf("f%04d", i), "v")
	}
	dup = append(dup, "type", "tt")
	es = append(es, a32Entry{name: "dup1101", fields: dup, size: base("dup1101") + 1 + 1098*6, field: "job_id"})
	return es
}

// a32Run enqueues es on a fresh queue, optionally leaves them pending for
// owner (a raw XREADGROUP), runs a consumer "c" with MaxEntryBytes 2000,
// waits until nothing is pending and every entry is settled, and returns
// the dead letters by job name (normalised) and the runs.
func a32Run(t *testing.T, rdb *redis.Client, owner string, es []a32Entry) (map[string][]string, *hostileConsumer) {
	t.Helper()
	ctx := context.Background()
	q, keys := hostileQueue(t, rdb)
	ids := map[string]string{}
	for _, e := range es {
		ids[e.name] = rawXADD(t, rdb, q, "*", e.fields...)
	}
	if owner != "" {
		if err := rdb.Do(ctx, "XREADGROUP", "GROUP", "g", owner, "COUNT", 100, "STREAMS", q, ">").Err(); err != nil {
			t.Fatalf("XREADGROUP: %v", err)
		}
		if p, err := rdb.XPending(ctx, q, "g").Result(); err != nil || p.Count != int64(len(es)) {
			t.Fatalf("after XREADGROUP as %s: pending %+v, %v; want %d", owner, p, err, len(es))
		}
	}
	h := runHostile(t, rdb, q, consumer.Config{
		MaxEntryBytes:     2000,
		VisibilityTimeout: time.Second,
		Block:             200 * time.Millisecond,
		KeepSettled:       true,
	})
	eventually(t, 60*time.Second, func() (bool, string) {
		p, err := rdb.XPending(ctx, q, "g").Result()
		if err != nil {
			return false, err.Error()
		}
		dead := a32rawEntries(t, rdb, keys.Dead)
		ran := 0
		for _, e := range es {
			if e.runs && h.ran(e.name) > 0 {
				ran++
			}
		}
		want := 0
		for _, e := range es {
			if e.runs {
				want++
			}
		}
		return p.Count == 0 && len(dead)+ran == len(es),
			fmt.Sprintf("pending %d, dead letters %d, ran %d of %d; runs %s", p.Count, len(dead), ran, want, h.runsText())
	})
	// Let a duplicate, if any, show up.
	time.Sleep(1500 * time.Millisecond)
	out := map[string][]string{}
	for _, d := range a32rawEntries(t, rdb, keys.Dead) {
		fs := d[1:]
		src, _ := a30Field(fs, "dead_entry_id")
		name := ""
		for n, id := range ids {
			if id == src {
				name = n
			}
		}
		if name == "" {
			t.Errorf("dead letter for unknown entry %s", src)
			continue
		}
		if _, dup := out[name]; dup {
			t.Errorf("%s (%s): dead-lettered twice", name, src)
		}
		out[name] = a32norm(fs, src)
		t.Logf("%s %s: %s", owner, name, a32short(out[name]))
	}
	if p, _ := rdb.XPending(ctx, q, "g").Result(); p == nil || p.Count != 0 {
		t.Errorf("still pending: %+v", p)
	}
	return out, h
}

// The verdict and the dead letter of an oversize entry are the same on a
// fresh read, after a reclaim (pending for a dead consumer "ghost") and after
// a re-read of the consumer's own entries (pending for "c", the consumer
// restarted under that name); entries within the limit run once on each path.
func TestAttack32_claimMatchesFreshRead(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	es := a32Entries()
	paths := []string{"", "ghost", "c"} // fresh, Sweep, ReadOwn
	got := map[string]map[string][]string{}
	runs := map[string]*hostileConsumer{}
	for _, p := range paths {
		got[p], runs[p] = a32Run(t, rdb, p, es)
	}
	for _, e := range es {
		for _, p := range paths {
			d, dead := got[p][e.name]
			if e.runs {
				if dead {
					t.Errorf("path %q: %s (within the limit) dead-lettered: %s", p, e.name, a32short(d))
				}
				if n := runs[p].ran(e.name); n != 1 {
					t.Errorf("path %q: %s ran %d times; want 1", p, e.name, n)
				}
				continue
			}
			if !dead {
				t.Errorf("path %q: %s not dead-lettered", p, e.name)
				continue
			}
			if n := runs[p].ran(e.name); n != 0 {
				t.Errorf("path %q: oversize %s ran %d times", p, e.name, n)
			}
			if r, _ := a30Field(d, "dead_reason"); r != "malformed" {
				t.Errorf("path %q: %s dead_reason %q; want malformed", p, e.name, r)
			}
			if tr, _ := a30Field(d, "dead_truncated"); tr != strconv.Itoa(e.size) {
				t.Errorf("path %q: %s dead_truncated %q; want %d", p, e.name, tr, e.size)
			}
			want := stream.OversizeError("<id>", e.field, e.size, 2000).Error()
			if de, _ := a30Field(d, "dead_error"); de != want {
				t.Errorf("path %q: %s dead_error %q; want %q", p, e.name, a32short([]string{de}), a32short([]string{want}))
			}
			for i := 0; i < len(d); i++ {
				if i%2 == 1 && strings.HasPrefix(d[i-1], "dead_") {
					continue // dead_error quotes the field name whole (bounded to 4 KiB)
				}
				if len(d[i]) > 1024 {
					t.Errorf("path %q: %s dead letter holds %d bytes at %d", p, e.name, len(d[i]), i)
					break
				}
			}
			if p != "" && !slices.Equal(d, got[""][e.name]) {
				t.Errorf("%s: dead letter after path %q differs from the fresh read's:\n claim: %s\n fresh: %s", e.name, p, a32short(d), a32short(got[""][e.name]))
				if fd := got[""][e.name]; fd != nil {
					for i := range min(len(d), len(fd)) {
						if d[i] != fd[i] {
							t.Errorf("  first difference at %d: claim %s, fresh %s (lengths %d, %d)", i, a32short(d[i:min(i+4, len(d))]), a32short(fd[i:min(i+4, len(fd))]), len(d), len(fd))
							break
						}
					}
				}
			}
		}
	}
}

// The slow link: entries too large for the reply of the read that carries
// them to arrive within the client's ReadTimeout, several in one batch among
// small jobs, with low Concurrency. Reclaim path: the first read times out,
// the sweep after the visibility timeout cuts them. ReadOwn path: the
// entries are already pending for "c" when "c" starts behind the slow link.
// Either way: one dead letter each (malformed, dead_truncated = size), every
// small job runs once, nothing stays pending. In the hugeName variants the
// bulk of the entry is one field name: this test found the cut entry's
// reported field (claim.Cut.Field, the longest value's name) carried whole,
// so the reply still carried the entry; it is now cut to stream.CutBytes.
func TestAttack32_slowLink(t *testing.T) {
	t.Parallel()
	for _, variant := range []string{"Sweep", "ReadOwn", "Sweep/hugeName", "ReadOwn/hugeName"} {
		path, hugeName := strings.CutSuffix(variant, "/hugeName")
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{})
			direct := srv.Client(t)
			ctx := context.Background()
			const q = "slow"
			keys, _ := stream.KeysFor(q)
			if err := direct.XGroupCreateMkStream(ctx, q, "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
			const hugeBytes = 3 << 20 // 3 huge entries: 9 MB, 9 s at 1 MB/s against a 2 s ReadTimeout
			huge := map[string]int{}
			var small []string
			for i := range 15 {
				name := fmt.Sprintf("j%02d", i)
				if hugeName && i == 7 {
					// One name of 3 MB whose value (200 bytes) is the
					// longest: the entry is mostly its name, which the
					// verdict names (claim.Cut.Field).
					fs := []string{"type", "t", "job_id", name, a32rep("N", hugeBytes), a32rep("v", 200)}
					id := rawXADD(t, direct, q, "*", fs...)
					huge[id] = 4 + 1 + 6 + 3 + hugeBytes + 200
					continue
				}
				if !hugeName && i%5 == 2 {
					// the longest value is an h.* header; the payload
					// given twice, the earlier value larger.
					fs := []string{"type", "t", "job_id", name, "payload", a32rep("p", 2*hugeBytes), "h.a", a32rep("a", hugeBytes), "payload", "{}"}
					id := rawXADD(t, direct, q, "*", fs...)
					huge[id] = 4 + 1 + 6 + 3 + 7 + 2 + 3 + hugeBytes
					continue
				}
				rawXADD(t, direct, q, "*", "type", "t", "job_id", name, "payload", "{}")
				small = append(small, name)
			}
			if path == "ReadOwn" {
				if err := direct.Do(ctx, "XREADGROUP", "GROUP", "g", "c", "COUNT", 100, "STREAMS", q, ">").Err(); err != nil {
					t.Fatal(err)
				}
			}
			p, err := faultproxy.Start(srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			p.Throttle(1 << 20)
			slow := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 2 * time.Second, MaxRetries: -1})
			t.Cleanup(func() { slow.Close() })
			start := time.Now()
			h := runHostile(t, slow, q, consumer.Config{
				Concurrency:       1,
				VisibilityTimeout: 3 * time.Second,
				Block:             300 * time.Millisecond,
				MaxEntryBytes:     1 << 20,
				KeepSettled:       true,
			})
			eventually(t, 90*time.Second, func() (bool, string) {
				pend, err := direct.XPending(ctx, q, "g").Result()
				if err != nil {
					return false, err.Error()
				}
				n, _ := direct.XLen(ctx, keys.Dead).Result()
				ran := 0
				for _, s := range small {
					if h.ran(s) > 0 {
						ran++
					}
				}
				return pend.Count == 0 && n == int64(len(huge)) && ran == len(small),
					fmt.Sprintf("pending %d, dead letters %d of %d, small jobs run %d of %d: %s", pend.Count, n, len(huge), ran, len(small), h.runsText())
			})
			took := time.Since(start)
			time.Sleep(4 * time.Second) // past another visibility timeout: no second run or dead letter
			for _, s := range small {
				if n := h.ran(s); n != 1 {
					t.Errorf("%s ran %d times; want 1", s, n)
				}
			}
			dead := a32rawEntries(t, direct, keys.Dead)
			if len(dead) != len(huge) {
				t.Errorf("%d dead letters; want %d", len(dead), len(huge))
			}
			seen := map[string]bool{}
			for _, d := range dead {
				fs := d[1:]
				src, _ := a30Field(fs, "dead_entry_id")
				size, ok := huge[src]
				if !ok || seen[src] {
					t.Errorf("dead letter for %s (unknown or twice): %s", src, a32short(fs))
					continue
				}
				seen[src] = true
				if r, _ := a30Field(fs, "dead_reason"); r != "malformed" {
					t.Errorf("%s: dead_reason %q", src, r)
				}
				if tr, _ := a30Field(fs, "dead_truncated"); tr != strconv.Itoa(size) {
					t.Errorf("%s: dead_truncated %q; want %d", src, tr, size)
				}
				if !hugeName {
					want := stream.OversizeError(src, "h.a", size, 1<<20).Error()
					if de, _ := a30Field(fs, "dead_error"); de != want {
						t.Errorf("%s: dead_error %q; want %q", src, de, want)
					}
				} else if de, _ := a30Field(fs, "dead_error"); !strings.Contains(de, "over the limit of 1048576") || len(de) > 4096 {
					t.Errorf("%s: dead_error %s; want an oversize error of at most 4 KiB", src, a32short([]string{de}))
				}
				for i, f := range fs {
					if i%2 == 1 && strings.HasPrefix(fs[i-1], "dead_") {
						continue
					}
					if len(f) > 1024 {
						t.Errorf("%s: dead letter holds a %d-byte field", src, len(f))
						break
					}
				}
				// every field in order, each cut: payload (cut), h.a (cut), payload "{}".
				var names []string
				for i := 0; i < len(fs); i += 2 {
					if !strings.HasPrefix(fs[i], "dead_") {
						names = append(names, fs[i])
					}
				}
				if w := []string{"type", "job_id", "payload", "h.a", "payload"}; !hugeName && !slices.Equal(names, w) {
					t.Errorf("%s: dead letter names %v; want %v", src, names, w)
				}
			}
			if pend, _ := direct.XPending(ctx, q, "g").Result(); pend == nil || pend.Count != 0 {
				t.Errorf("still pending: %+v", pend)
			}
			t.Logf("%s: settled in %v", path, took)
		})
	}
}
