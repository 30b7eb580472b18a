package middleware

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/guard"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [IdempotencyConfig].
const (
	// DefaultIdempotencyLease is how long a processing record is held.
	DefaultIdempotencyLease = 5 * time.Minute
	// DefaultIdempotencyInProgressDelay is how long a job whose operation
	// runs elsewhere is snoozed.
	DefaultIdempotencyInProgressDelay = 2 * time.Second
)

// idemStoreTimeout bounds the store calls made after the handler returned
// (Complete, Fail, Release), which run without the job's cancellation.
const idemStoreTimeout = 5 * time.Second

// MissingKeyPolicy is what [Idempotency] does with a job without an
// idempotency_key.
type MissingKeyPolicy int

const (
	// MissingSkip runs the job without a record: no deduplication. It is
	// the default.
	MissingSkip MissingKeyPolicy = iota
	// MissingUseJobID uses the job's ID as the key: redeliveries and retries
	// of one job are deduplicated, duplicate enqueues (new job IDs) are not.
	MissingUseJobID
)

// IdempotencyConfig configures [Idempotency].
type IdempotencyConfig struct {
	// InProgressDelay is how long a job whose operation is in progress
	// under another owner is snoozed, jittered to between 0.75 and 1.25
	// times. Defaults to [DefaultIdempotencyInProgressDelay].
	InProgressDelay time.Duration
	// Lease is how long a processing record is held. With an
	// idem.RedisStore it is renewed every Lease/3 while the handler runs
	// (by one watchdog per redis client, with the locks), so it bounds how
	// long the record of a crashed or stalled worker stays taken; if a
	// renewal finds the record taken over, the handler's context is
	// cancelled with a cause matching idem.ErrNotOwner. With other stores
	// it is not renewed and must exceed the handler's longest run (the
	// consumer's MaxRuntime, or a Timeout middleware's limit): a record
	// whose lease passes is taken over by the next delivery of the key, and
	// the operation runs twice. A crashed worker's record is taken over
	// after it. Defaults to [DefaultIdempotencyLease].
	Lease time.Duration
	// Logger receives the store errors that do not change the job's
	// outcome (a failed Release: the lease frees the record). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Missing is what to do with jobs without an idempotency_key. Defaults
	// to [MissingSkip].
	Missing MissingKeyPolicy
	// OnHit, if set, is called for every job acknowledged without running
	// because its operation completed earlier (an idempotency hit), with the
	// stored result. It must not block. Defaults to nil.
	OnHit func(ctx context.Context, job *stream.Job, result []byte)
	// Prefix starts the key of every record in the store: the record of a
	// job is Prefix + its idempotency key ([IdempotencyKey]). Defaults to
	// the namespace of the job's queue, stream.KeysFor(job.Stream).Idem
	// ("{orders}:idem:"): an operation completed in one queue never makes
	// another queue skip a job of the same key, and each record lives in
	// its stream's cluster slot. Set it to share records across queues on
	// purpose: every queue whose Idempotency has the same Prefix and store
	// runs an operation of a given key once, whichever queue it came from.
	Prefix string
	// RetryHorizon, if positive, is checked against the store's retention
	// when the store has a Retention() time.Duration method (both Pelican
	// stores do): Idempotency panics unless the retention exceeds it, since
	// a job delivered after its record expired runs again. Use
	// [idem.RetryHorizon]. Defaults to 0: no check.
	RetryHorizon time.Duration
}

// Validate reports the first invalid field of cfg: an unknown Missing
// policy. The check of RetryHorizon against a store's retention needs the
// store: [Idempotency] makes it.
func (cfg IdempotencyConfig) Validate() error { return cfg.validate(nil) }

func (cfg IdempotencyConfig) validate(store idem.Store) error {
	if cfg.Missing != MissingSkip && cfg.Missing != MissingUseJobID {
		return fmt.Errorf("middleware: IdempotencyConfig.Missing (%d) is not a MissingKeyPolicy", cfg.Missing)
	}
	if cfg.RetryHorizon > 0 && store != nil {
		if r, ok := store.(interface{ Retention() time.Duration }); ok {
			if err := idem.ValidateRetention(r.Retention(), cfg.RetryHorizon); err != nil {
				return fmt.Errorf("middleware: IdempotencyConfig.RetryHorizon: the store's %w", err)
			}
		}
	}
	return nil
}

// Idempotency returns a middleware that runs each business operation, named
// by the job's idempotency_key ([IdempotencyKey]), once per queue, however
// many times it is delivered or enqueued. For each job it begins the key's
// record in store (under the queue's namespace, or cfg.Prefix) with a fresh
// owner token (the entry ID and random bytes) and then:
//
//   - completed earlier: returns nil without calling the next handler, so
//     the job is acknowledged; OnHit gets the stored result;
//   - in progress under another owner: returns [consumer.Snooze] with the
//     jittered InProgressDelay (no attempt counted);
//   - failed earlier: returns consumer.Dead with reason
//     [consumer.ReasonPermanent] and an error wrapping [idem.ErrFailed] and
//     the stored reason, without running: a verdict that the operation can
//     never succeed holds for every job of the key, as a success does. To
//     run it again after all (a dead-letter replay after fixing the data),
//     forget the record ([idem.Store.Forget]; pelican dlq replay
//     --forget-failed-idempotency) or give the job a new key;
//   - started: calls the next handler with an [idem.Claim] in its context
//     (idem.ClaimFromContext); the handler may set a result with
//     Claim.SetResult, or complete the record itself inside its own
//     transaction with [idem.SQLStore.CompleteTx].
//
// What becomes of a started record follows what the next handler returned
// (with Retry inside this middleware, as recommended, Retry's decision):
//
//   - nil: the record is completed before the job is acknowledged
//     (completion first, then ack: a crash between the two leaves a
//     completed record, and the redelivery is a hit). If the completion
//     fails the job fails with a retryable error: the record stays
//     processing until its lease passes and the operation may run again. If
//     the store answers [idem.ErrNotOwner] (the lease passed and another
//     delivery took the record over) the job is snoozed, and its next
//     delivery follows the record.
//   - A verdict that the operation can never succeed, the one outcome that
//     fails the record (with the error's text, its first 1 KiB, as reason):
//     consumer.Dead with reason [consumer.ReasonPermanent], which Retry makes
//     of a [consumer.Permanent] error or a [stream.ErrPayload] (and which,
//     without Retry, such an error becomes in the consumer).
//   - An error wrapping idem.ErrNotOwner (a CompleteTx that lost the record,
//     whose transaction rolled back): the job is snoozed.
//   - Everything else releases the record, so that the next delivery of the
//     key runs the operation again: a retry, a snooze, and the deaths that
//     are no verdict on the operation: reason exhausted (a transient failure
//     that ran out of attempts), panic (a bug), expired (too old to run,
//     [ReasonExpired]) and reasons of your own given to [consumer.Dead] (use
//     ReasonPermanent for a verdict). So a dead-letter replay after a fix
//     runs those jobs again. A panic that reaches this middleware (no Retry
//     inside it) releases the record and panics on. A job the consumer
//     dead-letters itself (crashed: it killed its workers) never
//     returns here; its processing record is freed by its lease.
//
// The next handler's error is returned unchanged.
//
// Place it after tracing and locks and before Retry (see the package
// documentation), so that a job that must not run is skipped or snoozed
// before it uses an attempt, and so that it sees Retry's decisions.
//
// A job without an idempotency_key is handled by cfg.Missing. A store error
// in Begin fails the job (retryable). A nil store or an invalid cfg (see
// [IdempotencyConfig.Validate]) gives a [consumer.Invalid] middleware: the
// consumer's Run fails with the error before it touches Redis.
func Idempotency(store idem.Store, cfg IdempotencyConfig) consumer.Middleware {
	if store == nil {
		return consumer.Invalid(errors.New("middleware: Idempotency needs a store"))
	}
	if err := cfg.validate(store); err != nil {
		return consumer.Invalid(err)
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultIdempotencyLease
	}
	if cfg.InProgressDelay <= 0 {
		cfg.InProgressDelay = DefaultIdempotencyInProgressDelay
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return func(next consumer.Handler) consumer.Handler {
		h := &idemHandler{store: store, cfg: cfg, next: next}
		h.runner, h.retention, h.redis = guard.StoreOf(store)
		return h
	}
}

// idemHandler is the handler Idempotency returns; Lock recognizes it as its
// next handler to fuse its lock with the record (see fusedHandler).
type idemHandler struct {
	store     idem.Store
	cfg       IdempotencyConfig
	next      consumer.Handler
	ns        nsCache
	redis     bool          // store is an *idem.RedisStore: its leases are renewed
	runner    *guard.Runner // the RedisStore's
	retention time.Duration // the RedisStore's
}

// recordKey returns the store key of job's record, or "" without one.
func (h *idemHandler) recordKey(job *stream.Job) (string, error) {
	key := IdempotencyKey(job, h.cfg.Missing)
	if key == "" {
		return "", nil
	}
	prefix, err := h.ns.get(h.cfg.Prefix, job, idemPrefix)
	if err != nil {
		return "", err
	}
	return prefix + key, nil
}

// Process implements consumer.Handler.
func (h *idemHandler) Process(ctx context.Context, job *stream.Job) (err error) {
	key, err := h.recordKey(job)
	if err != nil {
		return err
	}
	if key == "" {
		return h.next.Process(ctx, job)
	}
	owner := idemOwner(job)
	out, err := h.store.Begin(ctx, key, owner, h.cfg.Lease)
	if err != nil {
		return fmt.Errorf("middleware: idempotency begin %q: %w", key, err)
	}
	if done, err := h.notStarted(ctx, job, key, out); done {
		return err
	}
	sent := time.Now()
	return h.run(ctx, nil, job, key, owner, sent, func(ctx context.Context, act idemAction, val []byte) error {
		return h.settle(ctx, key, owner, act, val)
	})
}

// settle applies act to owner's record of key in the store, without ctx's
// cancellation (the handler has returned) and within idemStoreTimeout. On
// an idem.RedisStore it sends the store's operation itself, through the
// Runner's Settle: no context or timer to make unless it has to wait.
func (h *idemHandler) settle(ctx context.Context, key, owner string, act idemAction, val []byte) error {
	if h.redis {
		var op *guard.Op
		switch act {
		case idemComplete:
			op = guard.RecordFinish(key, owner, "c", val, h.retention)
		case idemFail:
			op = guard.RecordFinish(key, owner, "f", val, h.retention)
		case idemRelease:
			op = guard.RecordRelease(key, owner)
		default:
			return nil
		}
		v, err := h.runner.Settle(ctx, op, idemStoreTimeout)
		if err != nil {
			return err
		}
		if n, _ := guard.Int(v); n != 1 {
			return idem.ErrNotOwner
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), idemStoreTimeout)
	defer cancel()
	switch act {
	case idemComplete:
		return h.store.Complete(ctx, key, owner, val)
	case idemFail:
		return h.store.Fail(ctx, key, owner, string(val))
	case idemRelease:
		return h.store.Release(ctx, key, owner)
	}
	return nil
}

// notStarted handles a Begin that did not start the operation: done is
// true, with what the job returns, unless out.Status is StatusStarted.
func (h *idemHandler) notStarted(ctx context.Context, job *stream.Job, key string, out idem.Outcome) (done bool, err error) {
	switch out.Status {
	case idem.StatusCompleted:
		if h.cfg.OnHit != nil {
			h.cfg.OnHit(ctx, job, out.Result)
		}
		return true, nil
	case idem.StatusInProgress:
		return true, consumer.Snooze(concJitter(h.cfg.InProgressDelay))
	case idem.StatusFailed:
		return true, consumer.Dead(consumer.ReasonPermanent,
			fmt.Errorf("%w: record %q: %s", idem.ErrFailed, key, out.Reason))
	case idem.StatusStarted:
		return false, nil
	default:
		return true, fmt.Errorf("middleware: idempotency begin %q: unknown status %v", key, out.Status)
	}
}

// idemAction is what becomes of a started record.
type idemAction int

const (
	idemNone     idemAction = iota // the handler lost the record: leave it
	idemComplete                   // with the result
	idemFail                       // with the reason
	idemRelease
)

// run calls the next handler for a started record (owner's, begun by a
// command sent at sent), with the record's lease renewed meanwhile when
// the store is Redis (its loss cancels ctx with cancel, ctx's own cancel
// function, or, for cancel nil, a context run makes), and settles the record with finish: finish(ctx, act,
// val) applies act, without ctx's cancellation and within
// idemStoreTimeout, and returns the store's error (idem.ErrNotOwner when
// the caller no longer owns the record).
func (h *idemHandler) run(ctx context.Context, cancel context.CancelCauseFunc, job *stream.Job, key, owner string, sent time.Time,
	finish func(ctx context.Context, act idemAction, val []byte) error) error {
	held := &struct { // one allocation for the two
		claim idem.Claim
		rl    recordLease
	}{claim: idem.Claim{Key: key, Owner: owner, Store: h.store}}
	claim := &held.claim
	hctx := idem.NewContext(ctx, claim)
	var lease *guard.Lease
	if h.redis {
		if cancel == nil {
			hctx, cancel = context.WithCancelCause(hctx)
			defer cancel(nil)
		}
		rl := &held.rl
		rl.key, rl.owner, rl.cancel = key, owner, cancel
		lease = &rl.lease
		lease.Held = rl
		h.runner.Hold(lease, sent, h.cfg.Lease)
	}
	stop := func() {
		if lease != nil {
			h.runner.Drop(lease)
		}
	}
	returned := false
	defer func() {
		if r := recover(); r != nil {
			if !returned {
				stop()
				h.warnOn(job, key, "releasing the record", finish(ctx, idemRelease, nil))
			}
			panic(r)
		}
	}()
	herr := h.next.Process(hctx, job)
	returned = true // from here on, a panic is not the handler's
	stop()
	act, val := h.decide(ctx, job, herr, claim)
	err := finish(ctx, act, val)
	switch act {
	case idemNone:
		return consumer.Snooze(concJitter(h.cfg.InProgressDelay))
	case idemComplete:
		if errors.Is(err, idem.ErrNotOwner) {
			h.cfg.Logger.Warn("idempotency: record taken over before completion; the lease is shorter than the handler's run",
				"job_id", consumer.BoundLogValue(job.ID), "idempotency_key", consumer.BoundLogValue(job.IdempotencyKey),
				"record", consumer.BoundLogValue(key), "lease", h.cfg.Lease)
			return consumer.Snooze(concJitter(h.cfg.InProgressDelay))
		}
		if err != nil {
			return consumer.Retryable(fmt.Errorf("middleware: idempotency complete %q: %w", key, err))
		}
		return nil
	case idemFail:
		h.warnOn(job, key, "failing the record", err)
	default:
		h.warnOn(job, key, "releasing the record", err)
	}
	return herr
}

// recordLease is the lease of a started record in an idem.RedisStore,
// renewed by the Runner's watchdog while the handler runs; its loss
// cancels the handler's context.
type recordLease struct {
	lease      guard.Lease
	key, owner string
	cancel     context.CancelCauseFunc
}

// Renew implements guard.Leased.
func (l *recordLease) Renew(ttl time.Duration) *guard.Op {
	return guard.RecordExtend(l.key, l.owner, ttl)
}

// Lost implements guard.Leased.
func (l *recordLease) Lost(err error) {
	l.cancel(fmt.Errorf("middleware: idempotency record %q lost (taken over, or not renewed before its lease ran out: %v): %w", l.key, err, idem.ErrNotOwner))
}

// decide returns what becomes of the record given the next handler's
// result (see Idempotency).
func (h *idemHandler) decide(ctx context.Context, job *stream.Job, herr error, claim *idem.Claim) (idemAction, []byte) {
	switch {
	case herr == nil:
		return idemComplete, claim.Result()
	case errors.Is(herr, idem.ErrNotOwner):
		return idemNone, nil
	case idemPermanent(ctx, job, herr):
		return idemFail, []byte(idemTruncate(herr.Error()))
	default:
		return idemRelease, nil
	}
}

func (h *idemHandler) warnOn(job *stream.Job, key, what string, err error) {
	if err != nil {
		h.cfg.Logger.Warn("idempotency: "+what, "job_id", consumer.BoundLogValue(job.ID),
			"idempotency_key", consumer.BoundLogValue(job.IdempotencyKey), "record", consumer.BoundLogValue(key), "error", err)
	}
}

// idemPrefix picks the queue's idempotency namespace from its keys.
func idemPrefix(k stream.Keys) string { return k.Idem }

// IdempotencyKey returns the key under which [Idempotency] with policy
// missing records job's operation: its idempotency_key, else under
// [MissingUseJobID] its ID, else "" (the job runs without a record). The
// record's key in the store is that key after IdempotencyConfig.Prefix
// (by default the queue's stream.KeysFor(stream).Idem). Tools that act on a
// job's record (pelican dlq replay) use it with MissingUseJobID: a job
// without an idempotency_key has no other record.
func IdempotencyKey(job *stream.Job, missing MissingKeyPolicy) string {
	if job.IdempotencyKey != "" || missing != MissingUseJobID {
		return job.IdempotencyKey
	}
	return job.ID
}

// idemPermanent reports whether err, returned by the next handler, is a
// verdict that the operation can never succeed: the consumer dead-letters
// the job with reason permanent (consumer.Decide). Other dead reasons
// (exhausted, panic, expired, the handler's own) are not verdicts.
func idemPermanent(ctx context.Context, job *stream.Job, err error) bool {
	d := consumer.Decide(ctx, job, err)
	return d.Kind == consumer.KindDead && d.Reason == consumer.ReasonPermanent
}

// idemMaxReason bounds the failure reason stored in a record.
const idemMaxReason = 1024

// idemTruncate cuts s to idemMaxReason bytes.
func idemTruncate(s string) string {
	if len(s) <= idemMaxReason {
		return s
	}
	return s[:idemMaxReason]
}

// idemOwner returns a fresh owner token for one delivery of job: its entry
// ID and 48 random bits (8 characters: the owner is kept in every record,
// for the record's retention, so it is short) of math/rand/v2, seeded from
// the system once (no system call per job, as guard.Token).
func idemOwner(job *stream.Job) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	var buf [48]byte // an entry ID of up to 39 bytes: no allocation but the string's
	owner := append(append(buf[:0], job.EntryID...), ':')
	return string(base64.RawURLEncoding.AppendEncode(owner, b[:6]))
}
