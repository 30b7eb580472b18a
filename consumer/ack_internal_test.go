package consumer

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// ack.lua pages through the consumer's pending entries 1000 at a time.
// Producers may choose IDs whose sequence numbers are above 2^53, where a
// Lua number cannot step from one to the next (at 2^60, doubles are 256 apart): every entry of a batch that
// spans several pages must still be acknowledged, none skipped, no page read
// twice. Against real Redis (Lua numbers are doubles there).
func TestAckScript_pagesPastFloatPrecision(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	key := "{" + redistest.Prefix(t, rdb) + "}s"
	const n = 2500
	base := uint64(1) << 60 // doubles are 256 apart here
	pipe := rdb.Pipeline()
	ids := make([]string, n)
	for i := range uint64(n) {
		ids[i] = fmt.Sprintf("7-%d", base+i)
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: ids[i], Values: []any{"type", "t"}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupCreate(ctx, key, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, ">"}, Count: n, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	args := []any{"g", "c", "0", n, 0, 1000, ids[0], ids[n-1]}
	for _, id := range ids {
		args = append(args, id)
	}
	res, err := ackScript.Run(ctx, rdb, []string{key}, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if acked, _ := res[0].(int64); acked != n || len(replyStrings(res[1])) != 0 || len(replyStrings(res[2])) != 0 {
		t.Errorf("ack.lua = acked %v, not owned %v, not pending %v; want all %d acknowledged", res[0], res[1], res[2], n)
	}
	if p := rdb.XPending(ctx, key, "g").Val(); p.Count != 0 {
		t.Errorf("%d entries still pending", p.Count)
	}
}

// ack.lua acknowledges only what this consumer owns, also when the
// consumer's pending entries in the batch's range [lo, hi] are as many as
// the batch but not the same ones (its own job still running in the range,
// another consumer's entry in the batch), and when the IDs come out of
// order; it reports the others as owned by another consumer (stale) or no
// longer pending (gone). Against real Redis.
func TestAckScript_ownerCheckedRange(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// batch: indexes of the entries to acknowledge, in the order sent.
		batch []int
		// acked, stale, gone: what the script must report.
		acked       int64
		stale, gone []int
	}{
		{name: "exactly the pending entries", batch: []int{0, 1}, acked: 2},
		// c's pending entries in [1, 3] are 1, 2: as many as the batch.
		{name: "as many pending, not the same", batch: []int{1, 3}, acked: 1, stale: []int{3}},
		{name: "own entry running in the range", batch: []int{0, 2}, acked: 2},
		{name: "out of order", batch: []int{5, 0, 2}, acked: 3},
		{name: "stolen and gone among owned", batch: []int{0, 3, 4, 5}, acked: 2, stale: []int{3}, gone: []int{4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "{" + redistest.Prefix(t, rdb) + "}s"
			var ids []string
			for range 6 {
				ids = append(ids, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"type", "t"}}).Val())
			}
			if err := rdb.XGroupCreate(ctx, key, "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, ">"}, Count: 6, Block: -1}).Err(); err != nil {
				t.Fatal(err)
			}
			// 3 is another consumer's now, 4 was acknowledged by someone else.
			rdb.XClaimJustID(ctx, &redis.XClaimArgs{Stream: key, Group: "g", Consumer: "d", Messages: []string{ids[3]}})
			rdb.XAck(ctx, key, "g", ids[4])
			lo, hi := ids[tc.batch[0]], ids[tc.batch[0]]
			var batch []any
			for _, i := range tc.batch {
				batch = append(batch, ids[i])
				lo, hi = min(lo, ids[i]), max(hi, ids[i]) // same length: string order is ID order
			}
			args := append([]any{"g", "c", "0", len(batch), 0, 1000, lo, hi}, batch...)
			res, err := ackScript.Run(ctx, rdb, []string{key}, args...).Slice()
			if err != nil {
				t.Fatal(err)
			}
			want := func(idx []int) []string {
				out := []string{}
				for _, i := range idx {
					out = append(out, ids[i])
				}
				return out
			}
			acked, _ := res[0].(int64)
			if stale, gone := replyStrings(res[1]), replyStrings(res[2]); acked != tc.acked ||
				fmt.Sprint(stale) != fmt.Sprint(want(tc.stale)) || fmt.Sprint(gone) != fmt.Sprint(want(tc.gone)) {
				t.Errorf("ack.lua = acked %d, stale %v, gone %v; want %d, %v, %v", acked, stale, gone, tc.acked, want(tc.stale), want(tc.gone))
			}
			// Whatever was not acknowledged here is still pending where it was.
			for i, id := range ids {
				p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: "g", Start: id, End: id, Count: 1}).Val()
				owner := ""
				if len(p) == 1 {
					owner = p[0].Consumer
				}
				wantOwner := "c"
				switch {
				case i == 3:
					wantOwner = "d"
				case i == 4 || slices.Contains(tc.batch, i):
					wantOwner = ""
				}
				if owner != wantOwner {
					t.Errorf("entry %d pending under %q; want %q", i, owner, wantOwner)
				}
			}
		})
	}
}
