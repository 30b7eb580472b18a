package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A running job's lease: the consumer owns the job's entry in the group's
// pending-entries list, and no other consumer takes the entry over while its
// idle time stays under the visibility timeout. Redis resets the idle time
// when it executes the read that delivers the entry and each heartbeat
// (claim.Claimer.Extend), so the lease is counted from the moment the read
// or the heartbeat was sent, never from its reply: a reply held back by the
// network or by a stalled process cannot make a lease look longer than it
// is. The handler's context is cancelled, with cause [ErrLeaseLost], once
// the lease is within a margin of its end (VisibilityTimeout/leaseMarginDiv),
// so that it has stopped before another consumer can start the job, even
// when Redis cannot be reached to learn that it did.
//
// With the heartbeat disabled a lease is never renewed: it ends
// VisibilityTimeout after the delivery, and the handler is cancelled then.
//
// Two goroutines keep the leases: the heartbeat extends them (it may block
// on Redis), and the watcher, which does no I/O, cancels the handlers whose
// lease has ended, at the end of each lease, or at once after the process
// was stopped past it.

// leaseMarginDiv: a handler is cancelled VisibilityTimeout/leaseMarginDiv
// before its entry's idle time can reach VisibilityTimeout.
const leaseMarginDiv = 10

// Causes of lease loss; both match ErrLeaseLost.
var (
	errReclaimed    = fmt.Errorf("%w: the job was reclaimed by another consumer", ErrLeaseLost)
	errLeaseExpired = fmt.Errorf("%w: not extended within the visibility timeout (Redis unreachable, or the process stalled)", ErrLeaseLost)
)

// lease is a running job's lease. Guarded by Consumer.mu.
type lease struct {
	// renewed is when the last successful heartbeat of the entry was sent
	// or, before one, when the read that delivered it was sent.
	renewed time.Time
	// lost: the handler's context has been cancelled with ErrLeaseLost.
	lost bool
}

// leases is the consumer's lease keeping.
type leases struct {
	// wake is when the watcher wakes next; guarded by Consumer.mu. A lease
	// that ends earlier kicks it.
	wake time.Time
	kick chan struct{}
	// log rate-limits the heartbeat's errors on their own, so that other
	// Redis errors do not hide them.
	log rateLog
}

// leaseTime is how long a handler runs after its lease was last renewed.
func (c *Consumer) leaseTime() time.Duration {
	return c.r.VisibilityTimeout - c.r.VisibilityTimeout/leaseMarginDiv
}

// leaseEnd is when t's handler is cancelled unless its lease is renewed.
func (c *Consumer) leaseEnd(t *task) time.Time { return t.lease.renewed.Add(c.leaseTime()) }

// holdsLease reports whether t's lease is kept: its handler is running (or
// about to), its entry is still in the stream, and the lease is not lost.
// Call it with Consumer.mu held.
func (t *task) holdsLease() bool { return !t.finished && !t.orphaned && !t.lease.lost }

// newLeases returns the lease keeping of a consumer that logs to log.
func newLeases(log *slog.Logger) leases {
	return leases{kick: make(chan struct{}, 1), log: rateLog{log: log, every: 10 * time.Second}}
}

// startLeases starts the lease watcher and, unless it is disabled, the
// heartbeat, in g, until ctx is done.
func (c *Consumer) startLeases(ctx context.Context, g *sync.WaitGroup) {
	g.Go(func() { c.watchLeases(ctx) })
	if c.r.HeartbeatInterval > 0 {
		g.Go(func() { c.every(ctx, max(c.r.HeartbeatInterval/2, time.Millisecond), c.heartbeat) })
	}
}

// trackLease wakes the watcher if t's lease ends before the watcher's next
// wake-up (t came from a read sent before the watcher last looked). Call it
// with Consumer.mu held, after adding t to the in-flight set.
func (c *Consumer) trackLease(t *task) {
	if c.leaseEnd(t).Before(c.leases.wake) {
		select {
		case c.leases.kick <- struct{}{}:
		default:
		}
	}
}

// lateDelivery reports whether the lease of d, counted from when its read
// was sent, ended by now, before d could start (its reply was held back, or
// no slot was free in time). Such a job is not started: its entry stays
// pending, for whichever consumer reclaims it first.
func (c *Consumer) lateDelivery(d delivery, now time.Time) bool {
	if now.Before(d.at.Add(c.leaseTime())) {
		return false
	}
	c.stats.leaseLost.Add(1)
	c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "job delivered after its lease had ended; not starting it here",
		c.entryAttrs(d.id, errKindLeaseLost, "")...)
	return true
}

// watchLeases cancels, with errLeaseExpired, the handlers whose lease ends
// without being renewed, as each lease ends, until ctx is done. It sleeps on
// a timer (which fires at once in a process resumed after being stopped past
// it) and does no I/O, so a heartbeat blocked on an unreachable Redis does
// not delay it.
func (c *Consumer) watchLeases(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-c.leases.kick:
		}
		timer.Reset(time.Until(c.expireLeases(time.Now())))
	}
}

// expireLeases cancels the handlers whose lease ended by now, and returns
// when the next lease ends (or, with none running, the earliest end of a
// lease that starts now).
func (c *Consumer) expireLeases(now time.Time) time.Time {
	next := now.Add(c.leaseTime())
	var ids []string
	c.mu.Lock()
	for id, t := range c.inflight {
		if !t.holdsLease() {
			continue
		}
		end := c.leaseEnd(t)
		if now.Before(end) {
			if end.Before(next) {
				next = end
			}
			continue
		}
		c.loseLease(t, errLeaseExpired)
		ids = append(ids, id)
	}
	c.leases.wake = next
	c.mu.Unlock()
	if len(ids) > 0 {
		c.r.Logger.Warn("leases of running jobs ended without a successful heartbeat; cancelling their handlers (another consumer may take the jobs over)",
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "count", len(ids), "entry_ids", ids)
	}
	return next
}

// loseLease cancels t's handler with cause. Call it with Consumer.mu held.
func (c *Consumer) loseLease(t *task, cause error) {
	t.lease.lost = true
	c.stats.leaseLost.Add(1)
	t.cancel(cause)
}

// heartbeat renews the leases of running jobs last renewed at least half a
// heartbeat interval ago (it runs every half interval, so each lease is
// renewed every half to whole interval), and cancels the handlers of jobs
// another consumer took over. A renewal whose reply comes after the lease
// ended renews nothing: the handler is cancelled.
func (c *Consumer) heartbeat(ctx context.Context) {
	now := time.Now()
	var ids []string
	c.mu.Lock()
	for id, t := range c.inflight {
		if t.holdsLease() && now.Sub(t.lease.renewed) >= c.r.HeartbeatInterval/2 {
			ids = append(ids, id)
		}
	}
	c.mu.Unlock()
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), 512)]
		ids = ids[len(chunk):]
		sent := time.Now()
		sctx, cancel := context.WithTimeout(ctx, c.r.HeartbeatInterval)
		lost, err := c.claimer.Extend(sctx, chunk...)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				c.leases.log.error("heartbeat failed: could not extend the leases of running jobs; a handler is cancelled when its lease ends",
					err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "jobs", len(chunk)+len(ids),
					"visibility_timeout", c.r.VisibilityTimeout)
			}
			return
		}
		gone := make(map[string]bool, len(lost))
		for _, id := range lost {
			gone[id] = true
		}
		deleted := c.deletedFromStream(ctx, lost)
		var orphans []string
		c.mu.Lock()
		now := time.Now()
		for _, id := range chunk {
			t := c.inflight[id]
			if t == nil || t.finished || t.orphaned {
				continue
			}
			switch {
			case !t.lease.lost && !now.Before(c.leaseEnd(t)):
				// Its lease ended first (the process stalled past it):
				// another consumer may have run and settled it, deleting
				// the entry, so the handler is cancelled, not left to go on.
				c.loseLease(t, errLeaseExpired)
			case deleted[id]:
				// Deleted or trimmed from the stream while running: no
				// other consumer has it or can ever run it (its body is
				// gone), and XCLAIM has just dropped it from the PEL. The
				// handler goes on, so its work is not thrown away; the
				// entry is reported lost, since nothing is left to settle.
				t.orphaned = true
				orphans = append(orphans, id)
			case t.lease.lost:
			case gone[id]:
				c.loseLease(t, errReclaimed)
			default:
				t.lease.renewed = sent
			}
		}
		c.mu.Unlock()
		c.reportLost(orphans, "extending the visibility of running jobs")
	}
}

// deletedFromStream returns which of ids are no longer entries of the
// stream. On an error it returns none.
func (c *Consumer) deletedFromStream(ctx context.Context, ids []string) map[string]bool {
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.r.HeartbeatInterval)
	defer cancel()
	cmds := make([]*redis.XMessageSliceCmd, len(ids))
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.XRangeN(ctx, c.r.Stream, id, id, 1)
		}
		return nil
	})
	if err != nil {
		return nil
	}
	deleted := make(map[string]bool)
	for i, cmd := range cmds {
		if len(cmd.Val()) == 0 {
			deleted[ids[i]] = true
		}
	}
	return deleted
}

// giveBack releases entries this consumer will not finish, so that the next
// sweep of any consumer takes them at once.
func (c *Consumer) giveBack(ids []string) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	gone, err := c.claimer.Release(ctx, c.r.VisibilityTimeout, ids...)
	switch {
	case err != nil && len(ids) == 1:
		c.errLog.error("giving back an unfinished job failed; it will be reclaimed after the visibility timeout", err,
			anys(c.entryAttrs(ids[0], errKindShutdown, ""))...)
	case err != nil:
		c.errLog.error("giving back unfinished jobs failed; they will be reclaimed after the visibility timeout", err,
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "entry_ids", ids)
	default:
		for _, id := range gone {
			c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "unfinished job to give back was no longer owned by this consumer (reclaimed by another, or deleted from the stream)",
				c.entryAttrs(id, errKindShutdown, "")...)
		}
	}
}
