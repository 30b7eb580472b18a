package consumer

// Maintenance: the consumer group itself (created, recovered when lost),
// delayed jobs promoted when due, idle consumers reaped.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

// createGroup creates the consumer group (and the stream) if missing.
func (c *Consumer) createGroup(ctx context.Context, start string) error {
	err := c.rdb.XGroupCreateMkStream(ctx, c.r.Stream, c.r.Group, start).Err()
	if err == nil || strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return nil
	}
	// Redis over maxmemory refuses XGROUP CREATE (OOM) before it finds that
	// the group exists; a consumer must start then, to drain the backlog.
	if groups, gerr := c.rdb.XInfoGroups(ctx, c.r.Stream).Result(); gerr == nil {
		for _, g := range groups {
			if g.Name == c.r.Group {
				return nil
			}
		}
	}
	return fmt.Errorf("consumer: create group %s on %s: %w", c.r.Group, c.r.Stream, err)
}

// checkEviction warns when Redis may evict keys under memory pressure: an
// evicted stream, pending-entries list or delayed set loses jobs silently.
// A user that may not run CONFIG GET is warned that the policy could not be
// checked; a server without it (managed services, miniredis) is not
// checked.
func (c *Consumer) checkEviction(ctx context.Context) {
	policy, err := c.rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		if strings.HasPrefix(err.Error(), "NOPERM") {
			c.r.Logger.Warn("could not check that Redis never evicts keys: the Redis user may not run CONFIG GET; make sure maxmemory-policy is noeviction (evicted streams or delayed sets lose jobs without a trace)",
				"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
		}
		return
	}
	if p, ok := policy["maxmemory-policy"]; ok && p != "noeviction" {
		c.r.Logger.Warn("Redis may evict keys under memory pressure (maxmemory-policy is not noeviction); evicted streams or delayed sets lose jobs without a trace",
			"stream", c.r.Stream, "maxmemory_policy", p)
	}
}

// recoverGroup recreates a group that vanished (Redis restarted without
// persistence, or the stream was deleted), from the first entry.
func (c *Consumer) recoverGroup(ctx context.Context, err error) {
	if err == nil || !strings.Contains(err.Error(), "NOGROUP") {
		return
	}
	if cerr := c.createGroup(ctx, "0"); cerr == nil {
		c.r.Logger.Warn("consumer group was missing and has been recreated from the first entry",
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
	}
}

func (c *Consumer) promote(ctx context.Context) {
	const limit = 256
	for range 8 {
		n, err := stream.PromoteDue(ctx, c.rdb, c.r.Stream, limit)
		if err != nil {
			if ctx.Err() == nil { // not an error of the consumer's own stop
				c.errLog.error("moving due jobs from the delayed set failed", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
			}
			return
		}
		if n < limit {
			return
		}
	}
}

func (c *Consumer) reap(ctx context.Context) {
	names, err := c.claimer.Reap(ctx, c.r.IdleConsumerTimeout)
	if err != nil {
		c.recoverGroup(ctx, err)
		if ctx.Err() == nil {
			c.errLog.error("removing idle consumers failed", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
		}
		return
	}
	if len(names) > 0 {
		c.r.Logger.Info("removed idle consumers with no pending jobs", "stream", c.r.Stream, "group", c.r.Group, "consumers", names)
	}
}

// every calls f every d until ctx is done.
func (c *Consumer) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}
