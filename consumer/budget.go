package consumer

// Budget: the worker slots a Pool's queues share. A queue's worker that has
// a job to start (and a slot of its own consumer, see intake.go) asks the
// budget for one of the pool's slots; the budget decides, each time a slot
// is free, which waiting queue gets it: in strict mode the waiting queue of
// highest Priority, otherwise (and among equal priorities) the one whose
// starts are furthest behind its Weight (stride scheduling). A queue's Min
// slots are reserved: no other queue is granted a slot that would leave
// fewer free than the queues below their Min still lack. Only running jobs
// hold a slot: a job read and queued (prefetched) holds none, so a
// low-priority queue's prefetched jobs never keep a slot from a
// higher-priority job.

import (
	"context"
	"sync"
)

// strideUnit is the virtual time one start of a queue of weight 1 costs;
// a start of a queue of weight w costs strideUnit/w.
const strideUnit = 1 << 40

// budget is a Pool's shared slots.
type budget struct {
	mu     sync.Mutex
	free   int
	total  int
	strict bool
	// alone are the suspects waiting to run alone in the pool (see
	// acquireAll), first come first served; while one waits, no slot is
	// granted to anything else.
	alone  []*slotWaiter
	shares []*share
	// lacking is the sum over shares of max(0, min-used): slots reserved
	// for queues below their Min.
	lacking int
	// vt is the virtual time of the latest start: a queue that starts
	// waiting again does not bring credit from its idle time.
	vt uint64
}

func newBudget(n int, strict bool) *budget { return &budget{free: n, total: n, strict: strict} }

// share is one queue's part of the budget.
type share struct {
	b                 *budget
	min, weight, prio int
	used              int // slots held; guarded by b.mu
	pass              uint64
	waiters           []*slotWaiter
	contention        uint64 // grants made while every queue waited (for tests)
}

type slotWaiter struct {
	ch      chan struct{} // closed when granted
	granted bool
}

func (b *budget) add(min, weight, prio int) *share {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &share{b: b, min: min, weight: weight, prio: prio, pass: b.vt}
	b.shares = append(b.shares, s)
	b.lacking += min
	return s
}

// acquire waits for a slot of the budget. It returns false, holding none,
// when ctx is done first. A nil share (a consumer outside a pool) grants at
// once.
func (s *share) acquire(ctx context.Context) bool {
	if s == nil {
		return true
	}
	b := s.b
	w := &slotWaiter{ch: make(chan struct{})}
	b.mu.Lock()
	if len(s.waiters) == 0 && s.pass < b.vt {
		s.pass = b.vt
	}
	s.waiters = append(s.waiters, w)
	b.grant()
	b.mu.Unlock()
	select {
	case <-w.ch:
		return true
	case <-ctx.Done():
	}
	b.mu.Lock()
	if w.granted {
		b.mu.Unlock()
		s.release(1)
		return false
	}
	for i, x := range s.waiters {
		if x == w {
			s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
			break
		}
	}
	b.mu.Unlock()
	return false
}

// tryAcquire takes up to n slots that are free now, without waiting; it
// never takes a slot reserved for another queue, nor one an earlier waiter
// could have (a free slot means no waiter may have it).
func (s *share) tryAcquire(n int) int {
	if s == nil {
		return n
	}
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	got := 0
	for got < n && b.eligible(s) {
		b.take(s)
		got++
	}
	return got
}

// release returns n slots to the budget, each granted at once to the
// waiting queue the policy picks.
func (s *share) release(n int) {
	if s == nil || n <= 0 {
		return
	}
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		b.put(s)
	}
	b.grant()
}

// put takes one slot back from s. Call it with b.mu held, then grant (or
// take the slot again).
func (b *budget) put(s *share) {
	if s.used <= s.min {
		b.lacking++
	}
	s.used--
	b.free++
}

// acquireAll waits until no job of any queue of the pool runs, and takes
// every slot of the budget, for a suspect that must run alone: a crash
// stops the whole process, so a suspect alone on its own queue's consumer
// would still take the other queues' running jobs down with it and have
// them blamed for its crashes. While it waits, no slot is granted to
// anything else. It returns false, holding none, when ctx is done first.
// A nil share (a consumer outside a pool) grants at once.
func (s *share) acquireAll(ctx context.Context) bool {
	if s == nil {
		return true
	}
	b := s.b
	w := &slotWaiter{ch: make(chan struct{})}
	b.mu.Lock()
	b.alone = append(b.alone, w)
	b.grant()
	b.mu.Unlock()
	select {
	case <-w.ch:
		return true
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		b.free = b.total
	} else {
		for i, x := range b.alone {
			if x == w {
				b.alone = append(b.alone[:i], b.alone[i+1:]...)
				break
			}
		}
	}
	b.grant()
	return false
}

// releaseAll returns the slots acquireAll took.
func (s *share) releaseAll() {
	if s == nil {
		return
	}
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.free = b.total
	b.grant()
}

// keep is release(1) followed by acquire, in one step, for a worker that
// holds a slot and has its queue's next job to start: it keeps the slot
// when no waiting queue goes before its own, and otherwise hands it over
// and waits for another. So a queue whose workers are all running is not
// passed over in the instant between one job and the next. It returns
// false, holding none, when ctx is done first.
func (s *share) keep(ctx context.Context) bool {
	if s == nil {
		return true
	}
	b := s.b
	b.mu.Lock()
	b.put(s)
	if b.eligible(s) {
		if t, all := b.pick(s); t == nil || !b.before(t, s) {
			if all {
				s.contention++
			}
			b.take(s)
			b.mu.Unlock()
			return true
		}
	}
	b.grant()
	b.mu.Unlock()
	return s.acquire(ctx)
}

// pick returns the waiting share, other than except, that the policy gives
// the next free slot to (nil: none may take one), and whether every share
// but except has waiters. Call it with b.mu held.
func (b *budget) pick(except *share) (pick *share, all bool) {
	all = true
	for _, s := range b.shares {
		if s == except {
			continue
		}
		if len(s.waiters) == 0 {
			all = false
			continue
		}
		if b.eligible(s) && (pick == nil || b.before(s, pick)) {
			pick = s
		}
	}
	return pick, all
}

// eligible reports whether s may take a slot now: one is free, and taking
// it leaves enough for the queues below their Min (s's own reservation
// counts for s).
func (b *budget) eligible(s *share) bool {
	if b.free == 0 || len(b.alone) > 0 {
		return false
	}
	return s.used < s.min || b.free > b.lacking
}

// take gives s one slot.
func (b *budget) take(s *share) {
	if s.used < s.min {
		b.lacking--
	}
	s.used++
	b.free--
	if s.pass > b.vt {
		b.vt = s.pass
	}
	s.pass += strideUnit / uint64(s.weight)
}

// grant hands free slots to waiters until no waiter may take one. Call it
// with b.mu held.
func (b *budget) grant() {
	if len(b.alone) > 0 {
		// A suspect waits to run alone: it gets every slot once all are
		// free, and nothing else is granted before it.
		if b.free == b.total {
			w := b.alone[0]
			b.alone[0] = nil
			b.alone = b.alone[1:]
			b.free = 0
			w.granted = true
			close(w.ch)
		}
		return
	}
	for b.free > 0 {
		pick, all := b.pick(nil)
		if pick == nil {
			return
		}
		if all {
			pick.contention++
		}
		w := pick.waiters[0]
		pick.waiters[0] = nil
		pick.waiters = pick.waiters[1:]
		b.take(pick)
		w.granted = true
		close(w.ch)
	}
}

// before reports whether s goes before t: in strict mode a higher
// priority first, then (and in weighted mode) the lower virtual time.
func (b *budget) before(s, t *share) bool {
	if b.strict && s.prio != t.prio {
		return s.prio > t.prio
	}
	return s.pass < t.pass
}
