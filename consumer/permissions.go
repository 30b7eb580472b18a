package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/perm"
	"github.com/pelicanqueue/pelican/stream"
)

// errPermission marks a start-up permission check that failed: waiting
// cannot fix it.
var errPermission = errors.New("consumer: the Redis user may not send commands this consumer needs (see docs/acl.md)")

// needs lists the commands this consumer sends, with its own keys, as
// docs/acl.md lists them for the consumer role. Without them it cannot work,
// or a script fails after its first write, except for those marked
// Optional, without which it works with a documented loss. Commands of
// middleware are not listed: the consumer does not know them.
func (c *Consumer) needs() (needs []perm.Need) {
	s, g, me, dead, keys := c.r.Stream, c.r.Group, c.r.Consumer, c.r.DeadLetterStream, c.r.keys
	crash := keys.Crashes + "0-1"
	need := func(use, key string, args ...string) {
		needs = append(needs, perm.Need{Args: args, Key: key, Use: use})
	}
	need("creating the group", s, "XGROUP", "CREATE", s, g, "$", "MKSTREAM")
	need("checking the group, retention", s, "XINFO", "GROUPS", s)
	need("reading jobs", s, "XREADGROUP", "GROUP", g, me, "COUNT", "1", "STREAMS", s, ">")
	need("owner checks", s, "XPENDING", s, g, "-", "+", "1", me)
	need("acknowledging", s, "XACK", s, g, "0-1")
	need("the visibility-timeout sweep", s, "XAUTOCLAIM", s, g, me, "0", "0-0", "COUNT", "1")
	need("heartbeats", s, "XCLAIM", s, g, me, "0", "0-1", "IDLE", "0", "RETRYCOUNT", "1", "JUSTID")
	need("leases, dead-lettering", s, "XRANGE", s, "0-1", "0-1")
	need("retries, promoting delayed jobs", s, "XADD", s, "*", "f", "v")
	need("dead-lettering", dead, "XADD", dead, "*", "f", "v")
	if c.r.DeadLetterMaxLen > 0 {
		need("Config.DeadLetterMaxLen", dead, "XTRIM", dead, "MAXLEN", "=", "1")
	}
	if keys.Dead != dead {
		need("setting aside malformed delayed jobs", keys.Dead, "XADD", keys.Dead, "*", "f", "v")
	}
	if !c.r.KeepSettled {
		need("deleting settled entries", s, "XTRIM", s, "MINID", "~", "0-1")
		need("deleting settled entries", s, "XDEL", s, "0-1")
		need("deleting settled entries", s, "XLEN", s)
	}
	need("retries", keys.Delayed, "ZADD", keys.Delayed, "0", "m")
	need("promoting delayed jobs", keys.Delayed, "ZRANGEBYSCORE", keys.Delayed, "-inf", "0", "LIMIT", "0", "1")
	need("promoting delayed jobs", keys.Delayed, "ZREM", keys.Delayed, "m")
	need("counting suspect runs", crash, "GET", crash)
	need("counting suspect runs", crash, "SET", crash, "1", "PX", "1")
	need("counting suspect runs", crash, "DEL", crash)
	rec := stream.JobKey(keys, "0")
	need("cancel checks of tracked jobs", rec, "GET", rec)
	need("the Redis clock", "", "TIME")
	need("scripts", s, "EVALSHA", "0000000000000000000000000000000000000000", "1", s)
	need("scripts", s, "EVAL", "return 0", "1", s)
	if c.r.IdleConsumerTimeout > 0 {
		need("Config.IdleConsumerTimeout", s, "XINFO", "CONSUMERS", s, g)
		need("Config.IdleConsumerTimeout", s, "XGROUP", "DELCONSUMER", s, g, me)
	}
	if _, ok := c.rdb.(*redis.Client); ok { // see blockingReader
		use := "ending a blocked read at shutdown"
		needs = append(needs,
			perm.Need{Args: []string{"CLIENT", "ID"}, Use: use, Optional: true},
			perm.Need{Args: []string{"CLIENT", "UNBLOCK", "1"}, Use: use, Optional: true})
	}
	return needs
}

// checkPermissions asks Redis whether the client's user may send every
// command the consumer needs (Redis 7; older servers and miniredis cannot
// tell, and the consumer then starts unchecked). A command denied is an
// error naming it, which waiting cannot fix; an optional one is logged
// at Warn with what the consumer loses.
func (c *Consumer) checkPermissions(ctx context.Context) error {
	denied, checked, err := perm.Check(ctx, c.rdb, c.r.Stream, c.needs())
	if err != nil {
		if strings.HasPrefix(err.Error(), "NOPERM") {
			return fmt.Errorf("%w: EVALSHA, EVAL on %q (scripts): %w", errPermission, c.r.Stream, err)
		}
		return fmt.Errorf("consumer: check permissions: %w", err)
	}
	if !checked {
		return nil
	}
	var fatal, warn []perm.Need
	for _, d := range denied {
		if d.Optional {
			warn = append(warn, d)
		} else {
			fatal = append(fatal, d)
		}
	}
	if len(fatal) > 0 {
		return fmt.Errorf("%w: %s", errPermission, perm.Describe(fatal))
	}
	if len(warn) > 0 {
		c.r.Logger.Warn("the Redis user may not end a blocked read (CLIENT ID, CLIENT UNBLOCK): shutdown waits up to Config.Block for it",
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "denied", perm.Describe(warn))
	}
	return nil
}
