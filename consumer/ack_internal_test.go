package consumer

import (
	"context"
	"fmt"
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
	args := []any{"g", "c", "0", n, 0, 1000}
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
