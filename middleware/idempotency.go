package middleware

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
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
	// Lease is how long a processing record is held. It must exceed the
	// handler's longest run (the consumer's MaxRuntime, or a Timeout
	// middleware's limit): a record whose lease passes is taken over by the
	// next delivery of the key, and the operation runs twice. A crashed
	// worker's record is taken over after it. Defaults to
	// [DefaultIdempotencyLease].
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
// in Begin fails the job (retryable). It panics if cfg.RetryHorizon is set
// and the store's retention does not exceed it, or if cfg.Missing is
// unknown.
func Idempotency(store idem.Store, cfg IdempotencyConfig) consumer.Middleware {
	if store == nil {
		panic("middleware: Idempotency needs a store")
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
	if cfg.Missing != MissingSkip && cfg.Missing != MissingUseJobID {
		panic(fmt.Sprintf("middleware: IdempotencyConfig.Missing (%d) is not a MissingKeyPolicy", cfg.Missing))
	}
	if cfg.RetryHorizon > 0 {
		if r, ok := store.(interface{ Retention() time.Duration }); ok {
			if err := idem.ValidateRetention(r.Retention(), cfg.RetryHorizon); err != nil {
				panic(fmt.Sprintf("middleware: IdempotencyConfig.RetryHorizon: the store's %v", err))
			}
		}
	}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) (err error) {
			key := IdempotencyKey(job, cfg.Missing)
			if key == "" {
				return next.Process(ctx, job)
			}
			prefix, err := namespace(cfg.Prefix, job, idemPrefix)
			if err != nil {
				return err
			}
			key = prefix + key
			owner := idemOwner(job)
			out, err := store.Begin(ctx, key, owner, cfg.Lease)
			if err != nil {
				return fmt.Errorf("middleware: idempotency begin %q: %w", key, err)
			}
			switch out.Status {
			case idem.StatusCompleted:
				if cfg.OnHit != nil {
					cfg.OnHit(ctx, job, out.Result)
				}
				return nil
			case idem.StatusInProgress:
				return consumer.Snooze(concJitter(cfg.InProgressDelay))
			case idem.StatusFailed:
				return consumer.Dead(consumer.ReasonPermanent,
					fmt.Errorf("%w: record %q: %s", idem.ErrFailed, key, out.Reason))
			case idem.StatusStarted:
			default:
				return fmt.Errorf("middleware: idempotency begin %q: unknown status %v", key, out.Status)
			}
			claim := &idem.Claim{Key: key, Owner: owner, Store: store}
			settle := func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.WithoutCancel(ctx), idemStoreTimeout)
			}
			returned := false
			defer func() {
				if r := recover(); r != nil {
					if !returned {
						sctx, cancel := settle()
						idemRelease(sctx, cfg.Logger, store, job, key, owner)
						cancel()
					}
					panic(r)
				}
			}()
			herr := next.Process(idem.NewContext(ctx, claim), job)
			returned = true // from here on, a panic is not the handler's
			sctx, cancel := settle()
			defer cancel()
			switch {
			case herr == nil:
				cerr := store.Complete(sctx, key, owner, claim.Result())
				if errors.Is(cerr, idem.ErrNotOwner) {
					cfg.Logger.Warn("idempotency: record taken over before completion; the lease is shorter than the handler's run",
						"job_id", consumer.BoundLogValue(job.ID), "idempotency_key", consumer.BoundLogValue(job.IdempotencyKey),
						"record", consumer.BoundLogValue(key), "lease", cfg.Lease)
					return consumer.Snooze(concJitter(cfg.InProgressDelay))
				}
				if cerr != nil {
					return consumer.Retryable(fmt.Errorf("middleware: idempotency complete %q: %w", key, cerr))
				}
				return nil
			case errors.Is(herr, idem.ErrNotOwner):
				return consumer.Snooze(concJitter(cfg.InProgressDelay))
			case idemPermanent(ctx, job, herr):
				if ferr := store.Fail(sctx, key, owner, idemTruncate(herr.Error())); ferr != nil {
					cfg.Logger.Warn("idempotency: failing the record", "job_id", consumer.BoundLogValue(job.ID),
						"idempotency_key", consumer.BoundLogValue(job.IdempotencyKey), "record", consumer.BoundLogValue(key), "error", ferr)
				}
				return herr
			default:
				idemRelease(sctx, cfg.Logger, store, job, key, owner)
				return herr
			}
		})
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

func idemRelease(ctx context.Context, log *slog.Logger, store idem.Store, job *stream.Job, key, owner string) {
	if err := store.Release(ctx, key, owner); err != nil {
		log.Warn("idempotency: releasing the record", "job_id", consumer.BoundLogValue(job.ID),
			"idempotency_key", consumer.BoundLogValue(job.IdempotencyKey), "record", consumer.BoundLogValue(key), "error", err)
	}
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

// idemOwner returns a fresh owner token for one delivery of job.
func idemOwner(job *stream.Job) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return job.EntryID + ":" + hex.EncodeToString(b[:])
}
