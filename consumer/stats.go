package consumer

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts what a Consumer has done since Run started.
type Stats struct {
	// Acked is the number of jobs acknowledged as done.
	Acked uint64
	// Cancelled is the number of jobs acknowledged as cancelled
	// (control.Cancel, [KindCancelled]).
	Cancelled uint64
	// Retried is the number of jobs rescheduled for a later attempt.
	Retried uint64
	// Snoozed is the number of jobs rescheduled without counting an
	// attempt ([Snooze]).
	Snoozed uint64
	// Suspects is the number of redelivered jobs run alone, as suspects of
	// having crashed their worker (see [Config.MaxCrashes]).
	Suspects uint64
	// DeadLettered is the number of entries moved to the dead-letter stream.
	DeadLettered uint64
	// Reclaimed is the number of entries taken over from other consumers (or
	// from this one) after the visibility timeout.
	Reclaimed uint64
	// Lost is the number of pending entries found deleted or trimmed from the
	// stream before they finished; their payload is gone.
	Lost uint64
	// Stale is the number of settlements refused because this consumer no
	// longer owned the entry: another consumer had reclaimed it (and runs
	// it again, or has already finished it).
	Stale uint64
	// LeaseLost is the number of jobs whose lease was lost: handlers
	// cancelled with ErrLeaseLost, and jobs not started because they were
	// delivered after their lease had ended (a reply held back).
	LeaseLost uint64
	// ReadErrors is the number of failed reads from Redis.
	ReadErrors uint64
	// DeadTrimmed is the number of dead-letter entries removed because the
	// dead-letter stream was over Config.DeadLetterMaxLen.
	DeadTrimmed uint64
	// Held is not a counter: the number of jobs held now because their
	// queue or type is paused (package control), parked or holding a worker
	// slot, read but not started.
	Held uint64
}

type counters struct {
	// Settlements and lease losses remember when the latest happened too
	// (Consumer.Health).
	acked, retried, snoozed, dead, leaseLost                  eventCount
	suspects, reclaimed, lost, stale, readErrors, deadTrimmed atomic.Uint64
	cancelled                                                 atomic.Uint64
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Acked: s.acked.Load(), Cancelled: s.cancelled.Load(), Retried: s.retried.Load(), Snoozed: s.snoozed.Load(), Suspects: s.suspects.Load(),
		DeadLettered: s.dead.Load(),
		Reclaimed:    s.reclaimed.Load(), Lost: s.lost.Load(), Stale: s.stale.Load(),
		LeaseLost: s.leaseLost.Load(), ReadErrors: s.readErrors.Load(), DeadTrimmed: s.deadTrimmed.Load(),
		Held: uint64(max(c.pause.held.Load(), 0)),
	}
}

// backoff is a capped exponential backoff with jitter for Redis errors.
type backoff struct{ n int }

const (
	backoffBase = 50 * time.Millisecond
	backoffCap  = 2 * time.Second
)

func (b *backoff) reset() { b.n = 0 }

// next returns the next delay: backoffBase doubled per call up to
// backoffCap, with equal jitter.
func (b *backoff) next() time.Duration {
	d := backoffCap
	if b.n < 6 {
		d = min(backoffBase<<b.n, backoffCap)
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

// wait sleeps for the next delay and reports whether ctx is still live.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// rateLog logs an error at most once per interval, counting the ones it
// held back, so that an outage does not flood the log.
type rateLog struct {
	log   *slog.Logger
	every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (r *rateLog) error(msg string, err error, attrs ...any) {
	n, ok := r.allow()
	if !ok {
		return
	}
	attrs = append(attrs, "error", err.Error())
	if n > 0 {
		attrs = append(attrs, "suppressed_errors", n)
	}
	r.log.Error(msg, attrs...)
}

// allow reports whether a record may be logged now, and how many were held
// back since the last one; it counts a record held back.
func (r *rateLog) allow() (suppressed int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.suppressed++
		return 0, false
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	return n, true
}
