package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// MinRedisVersion is the oldest Redis the consumer runs on. Redis 7.0 is the
// first whose XAUTOCLAIM reports the pending entries that were deleted or
// trimmed from the stream (and drops them from the pending-entries list),
// so that the sweep reports them lost instead of reclaiming them forever,
// and whose XINFO GROUPS reports each group's lag, which the deletion of
// settled entries needs to know what every group has read. Redis 6.2 (the
// first with XAUTOCLAIM, XTRIM MINID and exclusive ranges) lacks both.
// Valkey reports itself as Redis 7.2 and passes.
const MinRedisVersion = "7.0.0"

// errVersion marks a server older than MinRedisVersion: waiting cannot fix
// it.
var errVersion = errors.New("consumer: Redis version too old")

// checkVersion asks the server its version (INFO server) and refuses one
// older than MinRedisVersion. A server that does not say (INFO denied by an
// ACL, a server without the field, such as miniredis) is not refused: the
// consumer then finds out from the first command it cannot run.
func (c *Consumer) checkVersion(ctx context.Context) error {
	info, err := c.rdb.Info(ctx, "server").Result()
	var reply redis.Error
	switch {
	case errors.As(err, &reply):
		return nil // refused (NOPERM, unknown section): cannot tell
	case err != nil:
		return err // Redis did not answer: startup waits and tries again
	}
	return versionError(info)
}

// versionError returns an error when INFO text info names a Redis older than
// MinRedisVersion, nil otherwise (and when it names none).
func versionError(info string) error {
	v := infoField(info, "redis_version")
	if v == "" {
		return nil
	}
	if compareVersions(v, MinRedisVersion) >= 0 {
		return nil
	}
	return fmt.Errorf("%w: the server is Redis %s; Pelican needs Redis %s or later (XAUTOCLAIM that reports deleted pending entries, XINFO GROUPS with lag; see the README's version matrix)",
		errVersion, v, MinRedisVersion)
}

// infoField returns the value of field in INFO text, or "".
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// compareVersions compares dotted versions numerically ("7.0.15" < "7.2"),
// a part that is not a number counting as 0.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}
