package lockx

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/internal/guard"
)

// Lock is a lock taken by [Client.TryAcquire] or [Client.Acquire]. Its
// methods are safe for concurrent use.
type Lock struct {
	r        *guard.Runner
	key      string
	redisKey string
	token    string
	fence    int64
	value    string // what the lock's Redis key holds: "<fence> <token>"

	ttl   atomic.Int64 // time.Duration of the last acquire or Extend
	lease guard.Lease  // renewal by the Runner's watchdog

	mu       sync.Mutex
	lost     chan struct{} // made by Lost, closed once err is set
	err      error
	onLost   []context.CancelCauseFunc
	kept     bool // KeepAlive was called
	released bool
	setAt    time.Time // when the last acquire or Extend was sent
}

func init() {
	guard.AdoptLock = func(r *guard.Runner, key, redisKey, token, fence string, ttl time.Duration, sent time.Time) any {
		l, err := newLock(r, key, redisKey, token, fence, ttl, sent)
		if err != nil {
			return err
		}
		return l
	}
	guard.GuardLock = func(ctx context.Context, lock any) (context.Context, context.CancelCauseFunc) {
		return lock.(*Lock).guard(ctx)
	}
	guard.TakeRelease = func(lock any) (string, string, time.Duration, bool) {
		l := lock.(*Lock)
		if !l.takeRelease() {
			return "", "", 0, false
		}
		return l.redisKey, l.value, time.Duration(l.ttl.Load()), true
	}
}

func newLock(r *guard.Runner, key, redisKey, token, fence string, ttl time.Duration, sent time.Time) (*Lock, error) {
	f, err := strconv.ParseInt(fence, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("lockx: acquire %q: fence %q: %w", key, fence, err)
	}
	l := &Lock{r: r, key: key, redisKey: redisKey, token: token, fence: f, value: guard.LockValue(fence, token),
		setAt: sent}
	l.ttl.Store(int64(ttl))
	l.lease.Held = (*lockLease)(l)
	return l, nil
}

// lockLease is a Lock as the watchdog's guard.Leased.
type lockLease Lock

// Renew implements guard.Leased.
func (l *lockLease) Renew(ttl time.Duration) *guard.Op {
	return guard.LockExtend(l.redisKey, l.value, ttl)
}

// Lost implements guard.Leased.
func (l *lockLease) Lost(err error) {
	if err == nil {
		(*Lock)(l).markLost(fmt.Errorf("%w: %q is no longer held", ErrLockLost, l.key))
		return
	}
	(*Lock)(l).markLost(fmt.Errorf("%w: %q could not be renewed before its TTL ran out: %w", ErrLockLost, l.key, err))
}

// Key returns the key the lock was taken on.
func (l *Lock) Key() string { return l.key }

// Token returns the lock's random holder token.
func (l *Lock) Token() string { return l.token }

// Fence returns the lock's fencing token: a number larger than the fence
// of every earlier acquisition of the key (see the package documentation
// for the exact guarantee). Pass it to the resource the lock protects,
// which should refuse writes with a token lower than one it has already
// seen.
func (l *Lock) Fence() int64 { return l.fence }

// TTL returns how long the lock has left, or [ErrNotHeld] if it is no
// longer the caller's.
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	v, err := l.r.Do(ctx, guard.LockTTL(l.redisKey, l.value))
	if err != nil {
		return 0, fmt.Errorf("lockx: ttl %q: %w", l.key, err)
	}
	ms, err := guard.Int(v)
	if err != nil {
		return 0, fmt.Errorf("lockx: ttl %q: %w", l.key, err)
	}
	if ms < 0 {
		// -3: not ours; -1 (no TTL) or -2 cannot happen for a lock we hold.
		return 0, ErrNotHeld
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Extend sets the lock's TTL to ttl from now if the lock is still the
// caller's, and returns [ErrNotHeld] (closing [Lock.Lost]) if it is not.
// KeepAlive uses the last ttl given.
func (l *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("lockx: ttl (%v) must be at least 1ms", ttl)
	}
	sent := time.Now()
	v, err := l.r.Do(ctx, guard.LockExtend(l.redisKey, l.value, ttl))
	if err != nil {
		return fmt.Errorf("lockx: extend %q: %w", l.key, err)
	}
	if n, _ := guard.Int(v); n != 1 {
		l.r.Drop(&l.lease)
		l.markLost(fmt.Errorf("%w: %q is no longer held", ErrLockLost, l.key))
		return ErrNotHeld
	}
	l.ttl.Store(int64(ttl))
	l.mu.Lock()
	l.setAt = sent
	l.mu.Unlock()
	l.r.Renewed(&l.lease, sent, ttl)
	return nil
}

// takeRelease stops renewal and marks the lock released; false if it was.
func (l *Lock) takeRelease() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return false
	}
	l.released = true
	l.r.Drop(&l.lease)
	return true
}

// Release stops the lock's renewal and releases the lock if it is still
// the caller's (compare-and-release), leaving its fence behind for the
// lock's TTL (see the package documentation). It returns [ErrNotHeld] if
// the lock had expired or was already released: the lock of another
// holder is never touched.
func (l *Lock) Release(ctx context.Context) error {
	if !l.takeRelease() {
		return ErrNotHeld
	}
	v, err := l.r.Do(ctx, guard.LockRelease(l.redisKey, l.value, time.Duration(l.ttl.Load())))
	if err != nil {
		return fmt.Errorf("lockx: release %q: %w", l.key, err)
	}
	if n, _ := guard.Int(v); n != 1 {
		return ErrNotHeld
	}
	return nil
}

// KeepAlive has the lock renewed every TTL/3 (as Extend does) until
// Release is called or ctx is done, and returns at once. Renewal is done by
// one watchdog per redis client, which renews every lock kept alive in one
// round trip per tick: no goroutine or timer per lock. When a renewal finds
// the lock gone, or renewals fail (Redis unreachable) until the lock may
// have expired, renewal stops and [Lock.Lost] is closed. Calls after the
// first, or after Release, do nothing.
//
// Renewal shortens the time another process can take the lock of a holder
// that is still working, but cannot make it zero: a holder that stalls
// longer than the TTL loses the lock before it can notice. See the package
// documentation on fencing.
func (l *Lock) KeepAlive(ctx context.Context) {
	l.mu.Lock()
	if l.kept || l.released || l.err != nil {
		l.mu.Unlock()
		return
	}
	l.kept = true
	sent := l.setAt
	l.mu.Unlock()
	l.r.Hold(&l.lease, sent, time.Duration(l.ttl.Load()))
	if ctx.Done() != nil {
		context.AfterFunc(ctx, func() { l.r.Drop(&l.lease) })
	}
}

// Guard returns a copy of ctx that carries l ([FromContext]) and is
// cancelled, with [Lock.Err] as its cause, when l is lost, and the
// function that cancels it. It starts no goroutine: call KeepAlive for the
// lock to be renewed (and its loss noticed) while the work runs.
func (l *Lock) Guard(ctx context.Context) (context.Context, context.CancelFunc) {
	gctx, cancel := l.guard(ctx)
	return gctx, func() { cancel(nil) }
}

// guard is Guard, returning the context's own cancel function (for
// guard.GuardLock: one closure less, and a context that others may cancel
// with their own cause).
func (l *Lock) guard(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	gctx, cancel := context.WithCancelCause(NewContext(ctx, l))
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		cancel(err)
		return gctx, cancel
	}
	l.onLost = append(l.onLost, cancel)
	l.mu.Unlock()
	return gctx, cancel
}

// Lost returns a channel that is closed when the lock is known to be lost:
// a renewal (or Extend) found it no longer the caller's, or renewals failed
// for a whole TTL. Release does not close it.
func (l *Lock) Lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil { // made on demand: most locks are never asked
		l.lost = make(chan struct{})
		if l.err != nil {
			close(l.lost)
		}
	}
	return l.lost
}

// Err returns why Lost was closed (an error matching [ErrLockLost]), or nil
// while it is open.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lock) markLost(err error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	l.err = err
	if l.lost != nil {
		close(l.lost)
	}
	cancels := l.onLost
	l.onLost = nil
	l.mu.Unlock()
	for _, c := range cancels {
		c(err)
	}
}

type ctxKey struct{}

// NewContext returns a copy of ctx that carries l.
func NewContext(ctx context.Context, l *Lock) context.Context {
	return context.WithValue(ctx, ctxKey{}, l)
}

// FromContext returns the lock carried by ctx, if any.
func FromContext(ctx context.Context) (*Lock, bool) {
	l, ok := ctx.Value(ctxKey{}).(*Lock)
	return l, ok && l != nil
}
