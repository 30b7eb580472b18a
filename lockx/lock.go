package lockx

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Lock is a lock taken by [Client.TryAcquire] or [Client.Acquire]. Its
// methods are safe for concurrent use.
type Lock struct {
	c        *Client
	key      string
	redisKey string
	token    string
	fence    int64

	ttl        atomic.Int64 // time.Duration of the last acquire or Extend
	validUntil atomic.Int64 // Unix ns: when the lock expires at the latest unless extended

	mu      sync.Mutex
	lost    chan struct{} // closed with err set
	err     error
	stop    chan struct{} // closed by Release to stop KeepAlive
	renewer chan struct{} // closed when the KeepAlive goroutine has returned
}

// Key returns the key the lock was taken on.
func (l *Lock) Key() string { return l.key }

// Token returns the lock's random holder token.
func (l *Lock) Token() string { return l.token }

// Fence returns the lock's fencing token: a number that grows with every
// acquisition of the key. Pass it to the resource the lock protects, which
// should refuse writes with a token lower than one it has already seen
// (see the package documentation).
func (l *Lock) Fence() int64 { return l.fence }

// TTL returns how long the lock has left, or [ErrNotHeld] if it is no
// longer the caller's.
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	ms, err := pttlScript.Run(ctx, l.c.rdb, []string{l.redisKey}, l.token).Int64()
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
	n, err := extendScript.Run(ctx, l.c.rdb, []string{l.redisKey}, l.token, ttlArg(ttl)).Int64()
	if err != nil {
		return fmt.Errorf("lockx: extend %q: %w", l.key, err)
	}
	if n != 1 {
		l.markLost(fmt.Errorf("%w: %q is no longer held", ErrLockLost, l.key))
		return ErrNotHeld
	}
	l.ttl.Store(int64(ttl))
	l.validUntil.Store(sent.Add(ttl).UnixNano())
	return nil
}

// Release stops the lock's renewal and deletes the lock if it is still the
// caller's (compare-and-delete). It returns [ErrNotHeld] if the lock had
// expired or was already released: the lock of another holder is never
// deleted.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.stop == nil {
		l.stop = make(chan struct{})
		close(l.stop)
	} else {
		select {
		case <-l.stop:
		default:
			close(l.stop)
		}
	}
	renewer := l.renewer
	l.mu.Unlock()
	if renewer != nil {
		<-renewer
	}
	n, err := releaseScript.Run(ctx, l.c.rdb, []string{l.redisKey}, l.token).Int64()
	if err != nil {
		return fmt.Errorf("lockx: release %q: %w", l.key, err)
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

// KeepAlive starts renewing the lock every TTL/3 (with Extend) until
// Release is called or ctx is done, and returns at once. When a renewal
// finds the lock gone, or renewals fail (Redis unreachable) until the lock
// may have expired, renewal stops and [Lock.Lost] is closed. Calls after
// the first, or after Release, do nothing.
//
// Renewal shortens the time another process can take the lock of a holder
// that is still working, but cannot make it zero: a holder that stalls
// longer than the TTL loses the lock before it can notice. See the package
// documentation on fencing.
func (l *Lock) KeepAlive(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stop != nil {
		return
	}
	l.stop = make(chan struct{})
	l.renewer = make(chan struct{})
	go l.renew(ctx, l.stop, l.renewer)
}

func (l *Lock) renew(ctx context.Context, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		interval := max(time.Duration(l.ttl.Load())/3, time.Millisecond)
		t := time.NewTimer(interval)
		select {
		case <-stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		err := l.Extend(rctx, time.Duration(l.ttl.Load()))
		cancel()
		switch {
		case err == nil:
		case l.Err() != nil: // not held: Extend closed Lost
			return
		case ctx.Err() != nil:
			return
		case time.Now().UnixNano() >= l.validUntil.Load():
			l.markLost(fmt.Errorf("%w: %q could not be renewed before its TTL ran out: %w", ErrLockLost, l.key, err))
			return
		}
	}
}

// Lost returns a channel that is closed when the lock is known to be lost:
// a renewal (or Extend) found it no longer the caller's, or renewals failed
// for a whole TTL. Release does not close it.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err returns why Lost was closed (an error matching [ErrLockLost]), or nil
// while it is open.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lock) markLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.lost)
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
