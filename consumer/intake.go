package consumer

// Intake: the read loop takes jobs into the consumer: its own pending entries
// after a restart and entries reclaimed from dead workers (suspects, see
// suspect.go), as many as there are free worker slots, and new entries into
// the workers' queue (work.go), as many as it has room for: Concurrency
// running plus Prefetch queued.

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// acquire waits for one free worker slot, then takes up to max-1 more
// without waiting. It returns 0 when ctx is done.
func (c *Consumer) acquire(ctx context.Context, max int) int {
	select {
	case <-c.slots:
	case <-ctx.Done():
		return 0
	}
	return 1 + c.tryAcquire(max-1)
}

// tryAcquire takes up to max free slots without waiting.
func (c *Consumer) tryAcquire(max int) int { return tryTake(c.slots, max) }

func (c *Consumer) release(n int) {
	for range n {
		c.slots <- struct{}{}
	}
}

// readLoop is the consumer's one intake of work: it first re-reads this
// consumer's own pending entries (left by an earlier run under the same
// name), then reads new entries into the workers' queue, each time as many
// as it has room for (see takeRoom), and every SweepInterval sweeps for
// entries idle past the visibility timeout. Reads and sweeps share the loop
// so that a blocked read never holds the slots a sweep needs; a read blocks
// no longer than until the next sweep is due.
func (c *Consumer) readLoop(ctx context.Context, reader xreader) {
	var backoff backoff
	after := "0"
	for ctx.Err() == nil {
		n := c.acquire(ctx, c.r.Concurrency)
		if n == 0 {
			return
		}
		// Entries re-read here were delivered before: all are suspects,
		// queued without taking a slot, so no gate is needed.
		at := time.Now()
		entries, deleted, err := c.claimer.ReadOwn(ctx, after, n)
		if err != nil {
			c.release(n)
			c.readError(ctx, err, &backoff)
			continue
		}
		backoff.reset()
		c.reportLost(deleted, "re-reading own pending entries")
		if len(entries) == 0 && len(deleted) == 0 {
			c.release(n)
			break
		}
		for _, id := range deleted {
			after = laterID(after, id)
		}
		c.dispatchOwned(n, entries, at)
		for _, e := range entries {
			after = laterID(after, e.ID)
		}
	}
	nextSweep := time.Now()
	for ctx.Err() == nil {
		if !c.intake(ctx, reader, &nextSweep, &backoff) {
			return
		}
	}
}

// fastRoom is how many fresh entries, running or queued, a consumer with
// the default Prefetch may hold while its jobs are short: reads of 50 (half
// the room, see takeRoom) to 100 entries (the room less the jobs still
// held, often none when the workers empty the queue first), where a read
// and an ack script cost little per job (REDIS-NOTES §10).
const fastRoom = 100

// prefetchWait is how long, at most, the default Prefetch lets a queued
// job wait for a worker on average: the room grows beyond Concurrency plus
// Prefetch only while that many queued jobs would run within it.
const prefetchWait = 5 * time.Millisecond

// roomSize is the most fresh entries the consumer may hold at once, running
// or queued for a worker: Concurrency plus Prefetch, or with the default
// Prefetch what short jobs earn (see roomLimit).
func (c *Consumer) roomSize() int { return c.r.Concurrency + c.r.prefetchMax }

// roomLimit is how many fresh entries the consumer holds at most now:
// Concurrency plus Prefetch; with the default Prefetch, as many more (up to
// roomSize) as its workers run within prefetchWait at the handlers' recent
// average run time, and no more than twice as many more as jobs finished
// since the last read: fast jobs are read in large batches, and jobs that
// are slow, or stop finishing, are not held from other consumers (a burst
// after an idle spell is read at Concurrency plus Prefetch first).
func (c *Consumer) roomLimit() int {
	size, base := c.roomSize(), c.r.Concurrency+c.r.Prefetch
	if size == base {
		return size
	}
	avg := time.Duration(c.jobTime.Load())
	if avg <= 0 {
		return base // no job has finished yet
	}
	byTime := int64(c.r.Concurrency) + int64(c.r.Concurrency)*int64(prefetchWait)/int64(avg)
	byDone := int64(base) + 2*(c.finished.Load()-c.finishedAtRead)
	return int(min(int64(size), max(int64(base), min(byTime, byDone))))
}

// noteRunTime adds a handler's run time to the running average roomLimit
// reads (an exponential moving average; concurrent updates may lose one),
// and counts a finished job.
func (c *Consumer) noteRunTime(d time.Duration) {
	c.finished.Add(1)
	old := c.jobTime.Load()
	if old == 0 {
		c.jobTime.Store(max(int64(d), 1))
		return
	}
	c.jobTime.Store(max(old+(int64(d)-old)/8, 1))
}

// room counts the places in the workers' queue: a fresh job holds one
// from its read until its worker is done with it. Only the read loop takes
// places; it sleeps until enough are free, and the workers that free them
// wake it once, not at each place (see takeRoom).
type room struct {
	free atomic.Int64 // places free, not taken by the read loop
	// want is, while the read loop waits, how many free places end its
	// wait (0: it does not wait); an empty workers' queue ends it at once.
	want atomic.Int64
	kick chan struct{} // wakes the waiting read loop; capacity 1
}

// fitRoom parks places, or frees parked ones, so that the room the read
// loop may take matches roomLimit. Only the read loop calls it.
func (c *Consumer) fitRoom() {
	want := c.roomSize() - c.roomLimit()
	switch {
	case c.parked > want:
		c.freeRoom(c.parked - want)
		c.parked = want
	case c.parked < want:
		c.parked += c.tryTakeRoom(want - c.parked)
	}
}

// freeRoom returns n places in the workers' queue, and wakes the read loop
// if it waits for them (see takeRoom).
func (c *Consumer) freeRoom(n int) {
	if n <= 0 {
		return
	}
	free := c.room.free.Add(int64(n))
	if want := c.room.want.Load(); want > 0 && (free >= want || len(c.ready) == 0) {
		select {
		case c.room.kick <- struct{}{}:
		default:
		}
	}
}

// tryTakeRoom takes up to max free places without waiting. Only the read
// loop calls it: the others only free places, so the places it sees free
// stay free.
func (c *Consumer) tryTakeRoom(max int) int {
	n := min(c.room.free.Load(), int64(max))
	if n <= 0 {
		return 0
	}
	c.room.free.Add(-n)
	return int(n)
}

// takeRoom takes places for the entries of the next read: at least one,
// waiting for it, and as many more as are free within roomLimit. While fresh jobs are still
// queued for the workers (so no worker waits for the read), it waits until
// half of the room is free, so that reads come in batches instead of one per
// finished job. The room is fitted to roomLimit again each time the loop
// wakes: jobs finished while it waited count toward it, so that the room
// reached while jobs are short is not held back by a limit measured just
// after the previous read. It returns 0 and true when the next sweep is due
// first, and 0 and false when ctx is done.
func (c *Consumer) takeRoom(ctx context.Context, until time.Time) (int, bool) {
	n := 0
	var timer *time.Timer
	defer func() {
		c.room.want.Store(0)
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		c.fitRoom()
		size := c.roomSize() - c.parked
		half := (size + 1) / 2
		if n += c.tryTakeRoom(size - n); n > 0 && (n >= half || len(c.ready) == 0) {
			return n, true
		}
		// Published before looking again, so that a worker freeing a
		// place after that look sees it and wakes this loop.
		c.room.want.Store(int64(max(half-n, 1)))
		if n += c.tryTakeRoom(size - n); n > 0 && (n >= half || len(c.ready) == 0) {
			return n, true
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(until))
		}
		select {
		case <-c.room.kick: // fitted and taken again above
		case <-ctx.Done():
			c.room.want.Store(0)
			c.freeRoom(n)
			return 0, false
		case <-timer.C:
			if n == 0 {
				return 0, true
			}
			return n, true // read what there is room for; the sweep follows
		}
	}
}

// tryTake takes up to max tokens from ch without waiting.
func tryTake(ch chan struct{}, max int) int {
	n := 0
	for n < max {
		select {
		case <-ch:
			n++
		default:
			return n
		}
	}
	return n
}

// intake reads or sweeps once, holding the gate shared so that no fresh job
// is taken in while a suspect waits to run alone. It returns false when the
// consumer stops.
func (c *Consumer) intake(ctx context.Context, reader xreader, nextSweep *time.Time, backoff *backoff) bool {
	if !time.Now().Before(*nextSweep) {
		c.gate.RLock()
		c.sweep(ctx)
		c.gate.RUnlock()
		*nextSweep = time.Now().Add(c.r.SweepInterval)
		return true
	}
	if c.waitQueuePaused(ctx, *nextSweep) {
		return true // paused: no read (see pause.go)
	}
	// The room is taken before the gate: a suspect waiting to run alone
	// holds the gate until the fresh jobs running free their slots, and
	// those jobs free room too.
	n, ok := c.takeRoom(ctx, *nextSweep)
	if !ok {
		return false
	}
	if n == 0 {
		return true
	}
	c.gate.RLock()
	defer c.gate.RUnlock()
	at := time.Now()
	c.finishedAtRead = c.finished.Load()
	c.health.readSent(at)
	block := max(min(c.r.Block, time.Until(*nextSweep)), time.Millisecond)
	if !c.health.answered() {
		// The first read does not block: Reading is closed at its answer,
		// and a program waiting for it to enqueue (a test, a bench) should
		// not wait a Block on an empty stream.
		block = -1
	}
	res, err := reader.read(ctx, &redis.XReadGroupArgs{
		Group:    c.r.Group,
		Consumer: c.r.Consumer,
		Streams:  []string{c.r.Stream, ">"},
		Count:    int64(n),
		Block:    block,
	})
	c.health.readDone(at, res, err)
	if err != nil {
		c.freeRoom(n)
		if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			c.readError(ctx, err, backoff)
		}
		return true
	}
	backoff.reset()
	var msgs []entry
	if len(res) > 0 {
		msgs = res[0].entries
	}
	c.freeRoom(n - len(msgs))
	c.caughtUp.Store(len(msgs) < n)
	if ctx.Err() != nil {
		// Read after the stop: give the entries back for the next sweep.
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.id
		}
		c.giveBack(ids)
		c.freeRoom(len(msgs))
		return false
	}
	// Dispatching a fresh entry never waits: one clock reading serves the
	// whole read's lease checks.
	now := time.Now()
	for _, m := range msgs {
		c.dispatch(delivery{id: m.id, fields: m.fields, deliveries: 1, at: at}, true, now)
	}
	return true
}

// dispatchOwned dispatches entries for which reserved slots are held (their
// tracked jobs cancelled meanwhile are marked first, see markCancelled),
// waiting for more slots if there are more entries than that (miniredis
// ignores COUNT when reading history).
func (c *Consumer) dispatchOwned(reserved int, entries []claim.Entry, at time.Time) {
	ds := make([]delivery, len(entries))
	for i, e := range entries {
		ds[i] = delivery{id: e.ID, fields: e.Fields, deliveries: e.Deliveries, at: at, cut: e.Cut}
	}
	c.markCancelled(ds)
	for i, d := range ds {
		if i >= reserved {
			<-c.slots // wait until a slot frees up
		}
		c.dispatch(d, false, time.Now()) // it may have waited for a slot
	}
	if len(entries) < reserved {
		c.release(reserved - len(entries))
	}
}

func (c *Consumer) readError(ctx context.Context, err error, b *backoff) {
	c.stats.readErrors.Add(1)
	c.recoverGroup(ctx, err)
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		// go-redis reloads its slot map on MOVED and every
		// ClusterStateReloadInterval (60 s by default), not when a node stops
		// answering: after a failover the dead master's slots would stay
		// unreachable until then. The backoff below bounds how often.
		cc.ReloadState(ctx)
	}
	if ctx.Err() == nil { // not an error of the consumer's own stop
		c.errLog.error("reading from Redis failed; backing off", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
	}
	b.wait(ctx)
}

// sweep takes over jobs idle longer than the visibility timeout, as many as
// there are free slots.
func (c *Consumer) sweep(ctx context.Context) {
	var at time.Time // Sweep calls take just before each XAUTOCLAIM
	take := func(n int) int {
		at = time.Now()
		// A sweep cut off from Redis holds up the reads after it: health
		// counts it as a read (see health.go).
		c.health.read.sent(at)
		return c.tryAcquire(n)
	}
	err := c.claimer.Sweep(ctx, c.r.VisibilityTimeout, take, func(reserved int, claimed []claim.Entry, deleted []string) {
		c.health.read.done(at, nil)
		c.reportLost(deleted, "reclaiming")
		c.stats.reclaimed.Add(uint64(len(claimed)))
		if len(claimed) > 0 {
			c.r.Logger.Info("reclaimed jobs idle past the visibility timeout", "stream", c.r.Stream, "group", c.r.Group,
				"consumer", c.r.Consumer, "count", len(claimed))
		}
		c.dispatchOwned(reserved, claimed, at)
	})
	if !at.IsZero() {
		c.health.read.done(at, err)
	}
	if err != nil {
		c.recoverGroup(ctx, err)
		if ctx.Err() == nil {
			c.errLog.error("sweeping for idle jobs failed", err, "stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
		}
	}
}

func (c *Consumer) reportLost(ids []string, when string) {
	if len(ids) == 0 {
		return
	}
	c.stats.lost.Add(uint64(len(ids)))
	for _, id := range ids {
		c.r.Logger.LogAttrs(c.base, slog.LevelError, "pending job was deleted or trimmed from the stream before it finished; it is lost",
			append(c.entryAttrs(id, errKindLost, ""), slog.String("when", when))...)
	}
}

// laterID returns the later of two stream entry IDs.
func laterID(a, b string) string {
	if stream.CompareIDs(a, b) < 0 {
		return b
	}
	return a
}
