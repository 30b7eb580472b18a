package consumer

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Poison isolation. A job that kills its worker (SIGKILL, OOM kill,
// os.Exit) takes the jobs running beside it down too, and after the crash
// all of them come back with a delivery count over 1, indistinguishable.
// Counting deliveries would blame them all. Instead, every redelivered job
// is a suspect, and its runs are counted in Redis before they start
// (suspect.lua); the count is deleted when the job settles, so a count left
// over is a run during which the worker stopped. A suspect's first counted
// run may be shared with other jobs (so that a restart after a crash re-runs
// its jobs at once); every later run is alone on its consumer: no fresh job
// starts while it waits or runs, and it starts only when the running jobs
// have finished. A suspect with Config.MaxCrashes counted runs is
// dead-lettered with reason "crashed" instead of running again. An innocent
// job that ran beside the culprit has at most one count (its shared run),
// and its runs alone settle, so it is never dead-lettered for it;
// Config.MaxCrashes is at least 2 for that reason.

var (
	//go:embed suspect.lua
	suspectLua    string
	suspectScript = redis.NewScript(suspectLua)
)

// crashCounterTTL is how long a suspect's crash counter lives after its
// last run: a job that crashes its worker less often than this is caught.
const crashCounterTTL = 7 * 24 * time.Hour

// suspectRun is a suspect waiting to run: its task is in the in-flight set
// (so the heartbeat extends it) but holds no worker slot.
type suspectRun struct {
	ctx   context.Context
	t     *task
	d     delivery
	alone bool // it has a counted run: it runs alone
}

// suspectQueue is the FIFO of suspects waiting to run.
type suspectQueue struct {
	mu    sync.Mutex
	q     []suspectRun
	ready chan struct{} // signalled (capacity 1) by push
}

func (q *suspectQueue) push(r suspectRun) {
	q.mu.Lock()
	q.q = append(q.q, r)
	q.mu.Unlock()
	q.signal()
}

// signal wakes the suspect runner.
func (q *suspectQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *suspectQueue) pop() (suspectRun, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.q) == 0 {
		return suspectRun{}, false
	}
	r := q.q[0]
	q.q[0] = suspectRun{}
	q.q = q.q[1:]
	return r, true
}

// waiting reports whether suspects wait to run.
func (q *suspectQueue) waiting() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.q) > 0
}

// runSuspects runs queued suspects until ctx is done, then gives back
// those still waiting, until intakeDone is closed (no more suspects can
// come) and none is left. A new suspect runs at once, beside other jobs,
// if it has no counted run yet; otherwise it waits for its turn to run
// alone.
func (c *Consumer) runSuspects(ctx context.Context, intakeDone <-chan struct{}) {
	for {
		r, ok := c.suspects.pop()
		if !ok {
			r, ok = c.alone.pop()
		}
		if ok {
			switch {
			case ctx.Err() != nil:
				c.abandonSuspect(r)
			case c.pause.holds(r.d.fields):
				c.parkSuspect(r) // before its run is counted (see pause.go)
			case r.alone:
				c.runAlone(ctx, r)
			default:
				c.runShared(ctx, r)
			}
			continue
		}
		select {
		case <-c.suspects.ready:
		case <-intakeDone:
			if !c.suspects.waiting() && !c.alone.waiting() {
				// A shared run in progress may still find that its job
				// must run alone, and queue it.
				c.shared.Wait()
				if !c.suspects.waiting() && !c.alone.waiting() {
					return
				}
			}
		}
	}
}

// runShared starts suspect r beside other jobs if it has no counted run
// yet, and queues it to run alone otherwise.
func (c *Consumer) runShared(ctx context.Context, r suspectRun) {
	select {
	case <-c.slots:
	case <-ctx.Done():
		c.abandonSuspect(r)
		return
	}
	if !c.share.acquire(ctx) { // a Pool's budget (budget.go)
		c.release(1)
		c.abandonSuspect(r)
		return
	}
	c.shared.Add(1)
	go func() {
		defer c.shared.Done()
		defer c.release(1)
		defer c.share.release(1)
		if !c.runSuspect(r, "shared") {
			r.alone = true
			c.alone.push(r)
			c.suspects.signal()
		}
	}()
}

// runAlone runs suspect r once no other job runs on this consumer: it
// closes the gate to fresh intake and takes every worker slot.
func (c *Consumer) runAlone(ctx context.Context, r suspectRun) {
	c.gate.Lock()
	defer c.gate.Unlock()
	for i := range c.r.Concurrency {
		select {
		case <-c.slots:
		case <-ctx.Done():
			c.release(i)
			c.abandonSuspect(r)
			return
		}
	}
	defer c.release(c.r.Concurrency)
	// In a Pool it runs alone in the whole pool: a crash stops every
	// queue's jobs, not only its own queue's.
	if !c.share.acquireAll(ctx) {
		c.abandonSuspect(r)
		return
	}
	defer c.share.releaseAll()
	c.runSuspect(r, "alone")
}

// runSuspect counts a run of suspect r in Redis, then runs it, or
// dead-letters it when it has Config.MaxCrashes counted runs already. It
// returns false, having done nothing, when r must run alone (mode is
// "shared" and r has a counted run).
func (c *Consumer) runSuspect(r suspectRun, mode string) bool {
	key := c.crashKey(r.d)
	switch cause := context.Cause(r.ctx); {
	case errors.Is(cause, ErrCancelled):
		// Cancelled while it waited: settled without running.
		if c.work(r.ctx, r.t, r.d, "") == endSettled {
			c.clearCrashes(key, true)
		}
		return true
	case cause != nil:
		// Its lease ended while it waited: another consumer may run it.
		c.endTask(r.t)
		return true
	}
	keys := []string{c.r.Stream, key}
	if id := stream.Field(r.d.fields, stream.FieldJobID); id != "" && stream.Field(r.d.fields, stream.FieldTrack) == "1" {
		keys = append(keys, stream.JobKey(c.r.keys, id))
	}
	ctx, cancel := c.settleContext()
	res, err := suspectScript.Run(ctx, c.rdb, keys,
		c.r.Group, c.r.Consumer, r.d.id, c.r.MaxCrashes, crashCounterTTL.Milliseconds(), mode).Result()
	cancel()
	reply, _ := res.([]any)
	switch {
	case err != nil:
		// Redis is unreachable or full: the run cannot be counted, so it
		// does not start now; the job is given back for a later sweep.
		c.errLog.error("counting the run of a redelivered job failed; it is given back and will run later", err,
			anys(c.entryAttrs(r.d.id, errKindRetryable, ""))...)
		c.abandonSuspect(r)
		return true
	case len(reply) != 2:
		c.stats.stale.Add(1)
		c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "redelivered job was no longer owned by this consumer; not run here",
			c.entryAttrs(r.d.id, errKindLeaseLost, "")...)
		c.endTask(r.t)
		return true
	}
	runs, _ := reply[0].(int64)
	switch verdict, _ := reply[1].(int64); verdict {
	case 3:
		// Cancelled while another consumer ran it: settled without running.
		r.t.cancel(ErrCancelled)
		if c.work(r.ctx, r.t, r.d, "") == endSettled {
			c.clearCrashes(key, true)
		}
		return true
	case 2:
		return false
	case 0:
		end := c.work(r.ctx, r.t, r.d, fmt.Sprintf(
			"its worker stopped (crashed, was killed, or stalled past the visibility timeout) while running it, %d times; not run again (delivered %d times)",
			runs, r.d.deliveries))
		if end == endSettled {
			c.clearCrashes(key, true)
		}
		return true
	}
	c.stats.suspects.Add(1)
	end := c.work(r.ctx, r.t, r.d, "")
	// The run ended without a crash: it is not held against the job (a
	// lost lease is: the job's worker stalled or was cut off). A job done or
	// dead-lettered needs its count no more; one rescheduled keeps it, and
	// its next entry is a suspect too, so that a job that crashes only on
	// the runs after a snooze (its own crashed run's lock or idempotency
	// record made it snooze) is still caught.
	switch end {
	case endSettled:
		c.clearCrashes(key, true)
	case endRescheduled, endShutdown:
		c.clearCrashes(key, false)
	}
	return true
}

// crashKey returns the crash counter of delivery d's job: per group, per
// job ID (kept by retries and snoozes, which write new entries; the entry
// ID when the job has none), hashed when a producer chose a long one.
func (c *Consumer) crashKey(d delivery) string {
	id := stream.Field(d.fields, stream.FieldJobID)
	if id == "" {
		id = d.id
	}
	if len(id) > 128 {
		sum := sha256.Sum256([]byte(id))
		id = "sha256:" + hex.EncodeToString(sum[:])
	}
	return c.r.keys.Crashes + c.r.Group + ":" + id
}

// clearCrashes deletes a job's crash counter (all), or takes back the count
// of the run that just ended without a crash.
func (c *Consumer) clearCrashes(key string, all bool) {
	ctx, cancel := c.settleContext()
	defer cancel()
	var err error
	if all {
		err = c.rdb.Del(ctx, key).Err()
	} else {
		err = c.rdb.Decr(ctx, key).Err()
	}
	if err != nil {
		c.errLog.error("updating the crash counter of a job failed", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
	}
}

// abandonSuspect gives suspect r back to the group without running it.
func (c *Consumer) abandonSuspect(r suspectRun) {
	c.giveBack([]string{r.d.id})
	c.endTask(r.t)
}

// endTask removes t, which did not run, from the in-flight set.
func (c *Consumer) endTask(t *task) {
	c.mu.Lock()
	delete(c.inflight, t.id)
	c.mu.Unlock()
	t.cancel(nil)
	t.end()
}
