package stream

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed trim.lua
var trimLua string

var trimScript = redis.NewScript(trimLua)

// TrimAcked removes from stream the entries that every consumer group has
// already read and that none holds pending, keeping those younger than keep
// (measured by the Redis server's clock). It returns how many entries it
// removed. It is the safe retention policy: run it periodically instead of
// [ProducerConfig.MaxLen].
//
// The horizon is MINID, which keeps the entry it names: the last entry every
// group has read stays even when all have acknowledged it (consumers delete
// settled entries themselves; see consumer.Config.KeepSettled).
//
// The decision and the trim run in one script, so a group cannot read or
// claim entries in between. A stream without consumer groups is left alone:
// nothing has read it yet.
func TrimAcked(ctx context.Context, rdb redis.Scripter, stream string, keep time.Duration) (int64, error) {
	res, err := trimScript.Run(ctx, rdb, []string{stream}, keep.Milliseconds()).Slice()
	if err != nil {
		return 0, fmt.Errorf("stream: trim %s: %w", stream, err)
	}
	n, _ := res[0].(int64)
	return n, nil
}
