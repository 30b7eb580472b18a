package middleware

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/guard"
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

// Validate reports the first invalid field of cfg: a TTL under 3 ms, or a
// Prefix whose braces form no hash tag.
func (cfg LockConfig) Validate() error {
	if cfg.TTL != 0 && cfg.TTL < 3*time.Millisecond {
		return fmt.Errorf("middleware: LockConfig.TTL (%v) must be at least 3ms", cfg.TTL)
	}
	if err := (lockx.Config{Prefix: cfg.Prefix}).Validate(); err != nil {
		return fmt.Errorf("middleware: LockConfig.Prefix: %w", err)
	}
	return nil
}

// Lock returns a middleware that runs each job holding the lockx lock of
// its key on rdb, so that jobs of one key (a customer, an account) of one
// queue do not run at the same time across processes. Locks are per queue
// unless cfg.Prefix shares them.
//
// A job whose lock is held elsewhere is rescheduled with [consumer.Snooze]
// after a jittered cfg.ConflictDelay: it did not fail, so no attempt is
// counted; cfg.OnConflict is called. If Redis cannot be asked, the job
// fails with that error (a retryable failure, which counts an attempt).
//
// While the handler runs, the lock is renewed every cfg.TTL/3 and is in the
// handler's context ([lockx.FromContext]), fencing token included. Renewal
// is done by one watchdog per redis client, for every lock and idempotency
// lease it holds, in one round trip per tick: no goroutine or timer per
// job. If a renewal finds the lock gone (the process stalled past the TTL
// and another one took it), the handler's context is cancelled with a cause
// matching [lockx.ErrLockLost]. When the handler returns, or panics, the
// lock is released (compare-and-release) and the handler's result, or
// panic, passes through at once: the release is sent with the next batch
// (after at most a millisecond when no other operation comes), not waited
// for (a release that fails leaves the lock to expire after its TTL, as a
// crash would), and before any lock or record operation this process sends
// later, so a later job of the key here finds the lock free.
// The job may be acknowledged before the release reaches Redis. The
// commands of concurrent jobs go to Redis together (one script call per
// cluster slot and round trip).
//
// Directly outside [Idempotency] on an [idem.RedisStore] of the same rdb
// (the recommended order), the two are fused when a job's lock and record
// share a cluster slot, as they do under the per-queue namespaces (both in
// the stream's slot) or under Prefixes with the same hash tag: taking the
// lock and beginning the record is one script operation, and so are
// finishing the record and releasing the lock (the record first: a crash
// between the two cannot happen). The semantics are those of the two
// middlewares, except that a job whose record is finished or in progress
// elsewhere does not take the lock. Keys in different slots run the two
// steps separately.
//
// The lock is an efficiency lock: a stalled handler can still write after
// its lock passed to another process, before it notices the loss. Writes
// that must never overlap should carry the lock's Fence to a store that
// refuses stale tokens (see package lockx).
//
// An invalid cfg (see [LockConfig.Validate]) gives a [consumer.Invalid]
// middleware: the consumer's Run fails with the error before it touches
// Redis.
func Lock(rdb redis.UniversalClient, cfg LockConfig) consumer.Middleware {
	if err := cfg.Validate(); err != nil {
		return consumer.Invalid(err)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultLockTTL
	}
	if cfg.ConflictDelay <= 0 {
		cfg.ConflictDelay = DefaultLockConflictDelay
	}
	if cfg.Key == nil {
		cfg.Key = func(job *stream.Job) string { return job.LockKey }
	}
	locks := &lockClients{rdb: rdb, runner: guard.Of(rdb)}
	return func(next consumer.Handler) consumer.Handler {
		if ih, ok := next.(*idemHandler); ok && ih.redis && ih.runner == locks.runner {
			return &fusedHandler{cfg: cfg, locks: locks, idem: ih, plain: lockHandler{cfg: cfg, locks: locks, next: ih}}
		}
		return &lockHandler{cfg: cfg, locks: locks, next: next}
	}
}

// lockClients are the lockx Clients of one Lock middleware, one per prefix
// (one per queue by default), all on one redis client: they share its
// batcher and watchdog.
type lockClients struct {
	rdb    redis.UniversalClient
	runner *guard.Runner
	byPfx  sync.Map // prefix -> *lockx.Client
	ns     nsCache
}

func (c *lockClients) of(prefix string) *lockx.Client {
	if l, ok := c.byPfx.Load(prefix); ok {
		return l.(*lockx.Client)
	}
	l, _ := c.byPfx.LoadOrStore(prefix, lockx.New(c.rdb, lockx.Config{Prefix: prefix}))
	return l.(*lockx.Client)
}

// lockHandler is the handler Lock returns when the next handler is not
// Idempotency on a Redis store of the same client.
type lockHandler struct {
	cfg   LockConfig
	locks *lockClients
	next  consumer.Handler
}

// lockOf returns the lockx Client and Redis key of job's lock; key "" for
// a job without one.
func (h *lockHandler) lockOf(job *stream.Job) (c *lockx.Client, key, redisKey string, err error) {
	key = h.cfg.Key(job)
	if key == "" {
		return nil, "", "", nil
	}
	prefix, err := h.locks.ns.get(h.cfg.Prefix, job, lockPrefix)
	if err != nil {
		return nil, "", "", err
	}
	c = h.locks.of(prefix)
	redisKey, err = c.RedisKey(key)
	return c, key, redisKey, err
}

// conflict is what a job whose lock is held returns.
func (h *lockHandler) conflict(key string) error {
	if h.cfg.OnConflict != nil {
		h.cfg.OnConflict(key)
	}
	return consumer.Snooze(lockJitter(h.cfg.ConflictDelay))
}

// Process implements consumer.Handler.
func (h *lockHandler) Process(ctx context.Context, job *stream.Job) error {
	c, key, _, err := h.lockOf(job)
	if err != nil {
		return err
	}
	if key == "" {
		return h.next.Process(ctx, job)
	}
	l, err := c.TryAcquire(ctx, key, h.cfg.TTL)
	if errors.Is(err, lockx.ErrNotObtained) {
		return h.conflict(key)
	}
	if err != nil {
		return fmt.Errorf("middleware: lock %q: %w", key, err)
	}
	return h.hold(ctx, job, l, h.next.Process, func() { h.release(l) })
}

// release releases l (compare-and-release) without waiting: the job's
// result does not depend on it (a lock not released expires), and the
// release is sent before any operation this process queues after it, so a
// later job of the key here finds the lock free.
func (h *lockHandler) release(l *lockx.Lock) {
	if rk, value, ttl, ok := guard.TakeRelease(l); ok {
		h.locks.runner.Post(guard.LockRelease(rk, value, ttl))
	}
}

// hold runs run holding l: renewed by the client's watchdog (even if ctx
// ends first: the handler may still be running), in run's context, which
// is cancelled with a cause matching lockx.ErrLockLost if l is lost; then
// release, even if run panics.
func (h *lockHandler) hold(ctx context.Context, job *stream.Job, l *lockx.Lock,
	run func(context.Context, *stream.Job) error, release func()) error {
	l.KeepAlive(context.Background()) // no end but release and loss
	// l.Guard, without the closure it wraps around the cancel function.
	hctx, cancel := guard.GuardLock(ctx, l)
	defer func() {
		cancel(nil)
		release()
	}()
	return run(hctx, job)
}

// fusedHandler is Lock directly outside Idempotency on an idem.RedisStore
// of the same redis client: when the job's lock and record share a cluster
// slot (the per-queue namespaces do: both are in the stream's slot), it
// takes the lock and begins the record in one script operation, and
// finishes the record and releases the lock in another, both batched with
// other jobs' operations; otherwise it runs as the two middlewares would.
type fusedHandler struct {
	cfg   LockConfig
	locks *lockClients
	idem  *idemHandler
	plain lockHandler // the two steps apart
}

// Process implements consumer.Handler.
func (h *fusedHandler) Process(ctx context.Context, job *stream.Job) error {
	lh := &h.plain
	_, key, lockKey, err := lh.lockOf(job)
	if err != nil || key == "" {
		return lh.Process(ctx, job)
	}
	recKey, err := h.idem.recordKey(job)
	if err != nil || recKey == "" || !guard.SameSlot(lockKey, recKey) {
		return lh.Process(ctx, job)
	}
	r := h.locks.runner
	token, owner := newLockToken(), idemOwner(job)
	sent := time.Now()
	v, err := r.Do(ctx, guard.LockBegin(lockKey, token, h.cfg.TTL, recKey, owner, h.idem.cfg.Lease))
	if err != nil {
		return fmt.Errorf("middleware: lock %q and idempotency begin %q: %w", key, recKey, err)
	}
	fence, started := v.(string) // both taken
	if !started {
		if n, ok := v.(int64); ok && n == 0 {
			return lh.conflict(key)
		}
		o, err := guard.BeginOutcome(v, owner)
		if err != nil {
			return fmt.Errorf("middleware: idempotency begin %q: %w", recKey, err)
		}
		if done, err := h.idem.notStarted(ctx, job, recKey, o.(idem.Outcome)); done {
			return err
		}
		return fmt.Errorf("middleware: idempotency begin %q: %w %v", recKey, guard.ErrReply, v)
	}
	adopted := guard.AdoptLock(r, key, lockKey, token, fence, h.cfg.TTL, sent)
	l, ok := adopted.(*lockx.Lock)
	if !ok {
		return fmt.Errorf("middleware: lock %q: %v", key, adopted)
	}
	// The record's settlement releases the lock in the same operation;
	// release is left with the lock only if that did not happen (a panic).
	var lockGone bool
	finish := func(sctx context.Context, act idemAction, val []byte) error {
		rk, value, ttl, ok := guard.TakeRelease(l)
		lockGone = true
		if !ok { // the handler released the lock itself
			return h.idem.settle(sctx, recKey, owner, act, val)
		}
		var st string
		switch act {
		case idemNone:
			r.Post(guard.LockRelease(rk, value, ttl))
			return nil
		case idemComplete:
			st = "c"
		case idemFail:
			st = "f"
		default:
			st = "r"
		}
		v, err := r.Settle(sctx, guard.FinishRelease(rk, value, ttl, recKey, st, owner, val, h.idem.retention), idemStoreTimeout)
		if err != nil {
			return err
		}
		if n, _ := guard.Int(v); n&1 != 1 { // the record's reply
			return idem.ErrNotOwner
		}
		return nil
	}
	// As hold, with one cancellable context for the lock's loss and the
	// record's (the record's lease cancels the lock's Guard context).
	l.KeepAlive(context.Background())
	hctx, cancel := guard.GuardLock(ctx, l)
	defer func() {
		cancel(nil)
		if !lockGone {
			lh.release(l)
		}
	}()
	return h.idem.run(hctx, cancel, job, recKey, owner, sent, finish)
}

// newLockToken returns a random lock holder token, as lockx's.
func newLockToken() string { return guard.Token() }

// lockPrefix picks the queue's lock namespace from its keys.
func lockPrefix(k stream.Keys) string { return k.Lock }

// lockJitter returns d scaled by a random factor in [0.5, 1.5].
func lockJitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}
