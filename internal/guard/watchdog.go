package guard

import (
	"context"
	"sync"
	"time"
)

// Lease is a held lock or processing record that the [Runner]'s watchdog
// renews every third of its TTL until it is dropped or lost.
type Lease struct {
	// Held renews the lease and hears of its loss.
	Held Leased

	// Guarded by the watchdog's mutex.
	ttl        time.Duration
	due        time.Time // next renewal
	validUntil time.Time // the lease ends at the latest, unless renewed
	held       bool      // in the watchdog's set
}

// Leased is what a [Lease] renews: a lock or a record, usually the struct
// that holds the Lease (no closure to allocate).
type Leased interface {
	// Renew returns the operation that extends the lease by ttl: its reply
	// is 1 while the lease is held, 0 once it is not.
	Renew(ttl time.Duration) *Op
	// Lost is called once, from the watchdog, when the lease is lost: with
	// nil when a renewal found it no longer held, or with the last renewal
	// error when renewals failed until the lease may have expired. It must
	// not block.
	Lost(err error)
}

// Renewed records that the lease was set to ttl by a command sent at sent
// (its acquisition, or an Extend of the caller's own).
func (w *watchdog) renewed(l *Lease, sent time.Time, ttl time.Duration) {
	l.ttl = ttl
	l.validUntil = sent.Add(ttl)
	l.due = sent.Add(max(ttl/3, time.Millisecond))
}

type watchdog struct {
	r       *Runner
	mu      sync.Mutex
	leases  map[*Lease]struct{}
	running bool
	wake    chan struct{}
	target  time.Time // when the loop sleeps until
	ticks   uint64
}

// Hold starts renewing l, whose lease was set to ttl by a command sent at
// sent. Holding a held lease only records the renewal.
func (r *Runner) Hold(l *Lease, sent time.Time, ttl time.Duration) {
	w := &r.wd
	w.mu.Lock()
	defer w.mu.Unlock()
	w.renewed(l, sent, ttl)
	if l.held {
		return
	}
	l.held = true
	if w.leases == nil {
		w.leases = make(map[*Lease]struct{})
		w.wake = make(chan struct{}, 1)
	}
	w.leases[l] = struct{}{}
	if !w.running {
		w.running = true
		go w.loop()
		return
	}
	if l.due.Before(w.target) {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Renewed records a renewal of l made by its holder (Extend).
func (r *Runner) Renewed(l *Lease, sent time.Time, ttl time.Duration) {
	r.wd.mu.Lock()
	r.wd.renewed(l, sent, ttl)
	r.wd.mu.Unlock()
}

// Drop stops renewing l. It reports whether l was held (not lost, not
// dropped before).
func (r *Runner) Drop(l *Lease) bool {
	w := &r.wd
	w.mu.Lock()
	defer w.mu.Unlock()
	if !l.held {
		return false
	}
	l.held = false
	delete(w.leases, l)
	if len(w.leases) == 0 { // let the loop end now, not at its next tick
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// Ticks returns how many renewal round trips the watchdog has made.
func (r *Runner) Ticks() uint64 {
	r.wd.mu.Lock()
	defer r.wd.mu.Unlock()
	return r.wd.ticks
}

// idleGrace is how long the watchdog's loop waits for a lease once it has
// none before it ends: leases of jobs that follow each other closely then
// share one goroutine and timer instead of starting one each.
const idleGrace = 100 * time.Millisecond

func (w *watchdog) loop() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	idle := false // idleGrace passed without a lease, nor a Hold or Drop
	for {
		w.mu.Lock()
		if len(w.leases) == 0 {
			if idle {
				w.running = false
				w.mu.Unlock()
				return
			}
			w.target = time.Now().Add(idleGrace) // a Hold due before wakes the loop
			w.mu.Unlock()
			t.Reset(idleGrace)
			select {
			case <-t.C:
				idle = true
			case <-w.wake:
				t.Stop()
			}
			continue
		}
		idle = false
		var next time.Time
		for l := range w.leases {
			if next.IsZero() || l.due.Before(next) {
				next = l.due
			}
		}
		w.target = next
		w.mu.Unlock()
		if d := time.Until(next); d > 0 {
			t.Reset(d)
			select {
			case <-t.C:
			case <-w.wake:
				if !t.Stop() {
					<-t.C
				}
				continue
			}
		}
		w.tick()
	}
}

// tick renews, in one round trip, every lease due or past half its
// interval, so that leases taken at different times share ticks.
func (w *watchdog) tick() {
	now := time.Now()
	w.mu.Lock()
	var due []*Lease
	var ops []*Op
	timeout := time.Duration(0)
	for l := range w.leases {
		interval := max(l.ttl/3, time.Millisecond)
		if l.due.After(now.Add(interval / 2)) {
			continue
		}
		due = append(due, l)
		ops = append(ops, l.Held.Renew(l.ttl))
		if timeout == 0 || interval < timeout {
			timeout = interval
		}
	}
	if len(ops) > 0 {
		w.ticks++
	}
	w.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	var lost []func()
	for start := 0; start < len(ops); start += MaxBatch {
		end := min(start+MaxBatch, len(ops))
		ctx, cancel := context.WithTimeout(context.Background(), max(timeout, 100*time.Millisecond))
		replies, errs := w.r.Send(ctx, ops[start:end])
		cancel()
		w.mu.Lock()
		for i, l := range due[start:end] {
			if !l.held {
				continue // dropped meanwhile
			}
			n, err := replies[i], errs[i]
			switch {
			case err == nil && n == int64(1):
				w.renewed(l, now, l.ttl)
			case err == nil:
				l.held = false
				delete(w.leases, l)
				lost = append(lost, func() { l.Held.Lost(nil) })
			case !time.Now().Before(l.validUntil):
				l.held = false
				delete(w.leases, l)
				lost = append(lost, func() { l.Held.Lost(err) })
			default:
				// Try again at the next tick, sooner than the interval.
				l.due = now.Add(max(l.ttl/10, time.Millisecond))
			}
		}
		w.mu.Unlock()
	}
	for _, f := range lost {
		f()
	}
}
