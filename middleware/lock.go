package middleware

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [LockConfig].
const (
	// DefaultLockConflictDelay is how long a job that found its lock held
	// is snoozed, before jitter.
	DefaultLockConflictDelay = time.Second
	// DefaultLockTTL is the lock's TTL; it is renewed every TTL/3.
	DefaultLockTTL = 30 * time.Second
)

// lockReleaseTimeout bounds the release of a lock after the handler returns.
const lockReleaseTimeout = 5 * time.Second

// LockConfig configures [Lock].
type LockConfig struct {
	// ConflictDelay is how long a job that found its lock held elsewhere
	// is snoozed, jittered to between 0.5 and 1.5 times. Defaults to
	// [DefaultLockConflictDelay].
	ConflictDelay time.Duration
	// Key returns the lock key of a job; a job whose key is "" runs without
	// a lock. Defaults to the job's lock_key field (job.LockKey).
	Key func(job *stream.Job) string
	// OnConflict, if set, is called with the lock key of every job snoozed
	// because its lock was held (a counter hook). Defaults to nil.
	OnConflict func(key string)
	// Prefix starts the Redis key of every lock, as lockx.Config.Prefix
	// does: the lock of key k is Prefix + "{" + k + "}". Defaults to the
	// namespace of the job's queue, stream.KeysFor(job.Stream).Lock
	// ("{orders}:lock:"): jobs of two queues never exclude each other, even
	// with the same key, and each lock lives in its stream's cluster slot.
	// Set it to share locks across queues on purpose: the jobs of every
	// queue whose Lock has the same Prefix (lockx.DefaultPrefix, say)
	// exclude each other by key. Its braces, if any, must form a hash tag.
	Prefix string
	// TTL is the lock's time to live; the lock is renewed every TTL/3
	// while the handler runs, so it bounds how long the lock of a crashed
	// or stalled process stays taken. Defaults to [DefaultLockTTL].
	TTL time.Duration
}

// Lock returns a middleware that runs each job holding the lockx lock of
// its key on rdb, so that jobs of one key (a customer, an account) of one
// queue do not run at the same time across processes. Locks are per queue
// unless cfg.Prefix shares them.
//
// A job whose lock is held elsewhere is rescheduled with [consumer.Snooze]
// after a jittered cfg.ConflictDelay: it did not fail, so no attempt is
// counted; cfg.OnConflict is called. If Redis cannot be asked, the job
// fails with that error (a retryable failure, which counts an attempt). A
// key that lockx refuses ([lockx.ErrInvalidKey]: under a cfg.Prefix
// without a hash tag, a key starting with '}') can never be locked: the
// job fails with a [consumer.Permanent] error, dead-lettered at once.
//
// While the handler runs, the lock is renewed every cfg.TTL/3 and is in the
// handler's context ([lockx.FromContext]), fencing token included. If a
// renewal finds the lock gone (the process stalled past the TTL and another
// one took it), the handler's context is cancelled with a cause matching
// [lockx.ErrLockLost]. When the handler returns, or panics, the lock is
// released (compare-and-delete, under a context of its own), and the
// handler's result, or panic, passes through.
//
// The lock is an efficiency lock: a stalled handler can still write after
// its lock passed to another process, before it notices the loss. Writes
// that must never overlap should carry the lock's Fence to a store that
// refuses stale tokens (see package lockx).
//
// It panics if cfg.TTL is under 3 ms or cfg.Prefix has braces that form
// no hash tag.
func Lock(rdb redis.UniversalClient, cfg LockConfig) consumer.Middleware {
	if cfg.TTL == 0 {
		cfg.TTL = DefaultLockTTL
	}
	if cfg.TTL < 3*time.Millisecond {
		panic(fmt.Sprintf("middleware: LockConfig.TTL (%v) must be at least 3ms", cfg.TTL))
	}
	if err := (lockx.Config{Prefix: cfg.Prefix}).Validate(); err != nil {
		panic(fmt.Sprintf("middleware: LockConfig.Prefix: %v", err))
	}
	if cfg.ConflictDelay <= 0 {
		cfg.ConflictDelay = DefaultLockConflictDelay
	}
	if cfg.Key == nil {
		cfg.Key = func(job *stream.Job) string { return job.LockKey }
	}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			key := cfg.Key(job)
			if key == "" {
				return next.Process(ctx, job)
			}
			prefix, err := namespace(cfg.Prefix, job, lockPrefix)
			if err != nil {
				return err
			}
			l, err := lockx.New(rdb, lockx.Config{Prefix: prefix}).TryAcquire(ctx, key, cfg.TTL)
			if errors.Is(err, lockx.ErrInvalidKey) {
				return consumer.Permanent(fmt.Errorf("middleware: lock %q: %w", key, err))
			}
			if errors.Is(err, lockx.ErrNotObtained) {
				if cfg.OnConflict != nil {
					cfg.OnConflict(key)
				}
				return consumer.Snooze(lockJitter(cfg.ConflictDelay))
			}
			if err != nil {
				return fmt.Errorf("middleware: lock %q: %w", key, err)
			}
			hctx, cancel := context.WithCancelCause(lockx.NewContext(ctx, l))
			// Renew until the handler returns, even if ctx ends first: the
			// handler may still be running.
			l.KeepAlive(context.WithoutCancel(ctx))
			stop := make(chan struct{})
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				select {
				case <-l.Lost():
					cancel(fmt.Errorf("middleware: lock %q: %w", key, l.Err()))
				case <-stop:
				}
			}()
			defer func() {
				close(stop)
				<-watched
				cancel(nil)
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), lockReleaseTimeout)
				defer rcancel()
				// Not an error of the job: a lock not released expires.
				_ = l.Release(rctx)
			}()
			return next.Process(hctx, job)
		})
	}
}

// lockPrefix picks the queue's lock namespace from its keys.
func lockPrefix(k stream.Keys) string { return k.Lock }

// lockJitter returns d scaled by a random factor in [0.5, 1.5].
func lockJitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}
