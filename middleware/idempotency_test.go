package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// idemSetup returns a Redis idempotency store on the shared Redis and a
// queue of the test's own, whose keys are deleted at the end of the test.
func idemSetup(t *testing.T) (*idem.RedisStore, idemQueue) {
	t.Helper()
	rdb := redistest.Shared(t)
	q := idemQueue(redistest.Name(t))
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+string(q)+"}:*") })
	return idem.NewRedisStore(rdb, idem.RedisConfig{Retention: time.Hour}), q
}

// idemQueue is a stream name.
type idemQueue string

// job returns a job of the queue with idempotency key key.
func (q idemQueue) job(key string) *stream.Job {
	j := idemJob(key)
	j.Stream = string(q)
	return j
}

// record returns the key of the record of idempotency key key.
func (q idemQueue) record(key string) string { return "{" + string(q) + "}:idem:" + key }

// idemJob returns a job of queue "orders" with idempotency key key.
func idemJob(key string) *stream.Job {
	return &stream.Job{ID: "job-" + key, Type: "t", IdempotencyKey: key, EntryID: "1-0", Stream: "orders"}
}

func TestIdempotency_completedIsAHit(t *testing.T) {
	t.Parallel()
	store, q := idemSetup(t)
	var runs, hits atomic.Int64
	var hitResult atomic.Value
	h := middleware.Idempotency(store, middleware.IdempotencyConfig{
		OnHit: func(_ context.Context, _ *stream.Job, result []byte) {
			hits.Add(1)
			hitResult.Store(string(result))
		},
	})(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		runs.Add(1)
		c, ok := idem.ClaimFromContext(ctx)
		if !ok || c.Key != q.record("op-1") || !strings.HasPrefix(c.Owner, job.EntryID+":") || c.Store != idem.Store(store) {
			t.Errorf("claim in ctx = %+v, %v", c, ok)
		} else {
			c.SetResult([]byte("receipt-42"))
		}
		return nil
	}))
	ctx := context.Background()
	for i := range 3 {
		// Different job IDs, same business operation.
		j := q.job("op-1")
		j.ID = j.ID + string(rune('a'+i))
		if err := h.Process(ctx, j); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if runs.Load() != 1 || hits.Load() != 2 {
		t.Fatalf("runs %d, hits %d; want 1 run and 2 hits", runs.Load(), hits.Load())
	}
	if got := hitResult.Load(); got != "receipt-42" {
		t.Fatalf("OnHit result = %v, want the stored receipt-42", got)
	}
}

func TestIdempotency_inProgressSnoozes(t *testing.T) {
	t.Parallel()
	store, q := idemSetup(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := middleware.Idempotency(store, middleware.IdempotencyConfig{InProgressDelay: time.Second})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if runs.Add(1) == 1 {
				close(entered)
				<-release
			}
			return nil
		}))
	done := make(chan error, 1)
	go func() { done <- h.Process(context.Background(), q.job("op")) }()
	<-entered
	err := h.Process(context.Background(), q.job("op"))
	d, ok := snoozeDelay(err)
	if !ok || d < 750*time.Millisecond || d > 1250*time.Millisecond {
		t.Fatalf("concurrent duplicate: %v, want a snooze of 0.75-1.25s", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := h.Process(context.Background(), q.job("op")); err != nil || runs.Load() != 1 {
		t.Fatalf("after completion: %v, runs %d; want a hit", err, runs.Load())
	}
}

func TestIdempotency_permanentFailureFailsTheRecord(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]error{
		"Permanent":     consumer.Permanent(errors.New("card declined")),
		"Dead":          consumer.Dead(consumer.ReasonPermanent, errors.New("card declined")),
		"Dead no cause": consumer.Dead("", errors.New("card declined")),
		"ErrPayload":    fmt.Errorf("%w: card declined", stream.ErrPayload),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, q := idemSetup(t)
			var runs atomic.Int64
			h := middleware.Idempotency(store, middleware.IdempotencyConfig{})(
				consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
					runs.Add(1)
					return fail
				}))
			if err := h.Process(context.Background(), q.job("op")); err != fail {
				t.Fatalf("first run returned %v, want the handler's error unchanged", err)
			}
			err := h.Process(context.Background(), q.job("op"))
			var o *consumer.Outcome
			if !errors.As(err, &o) || !o.IsDead() || o.Reason() != consumer.ReasonPermanent ||
				!errors.Is(err, idem.ErrFailed) || !strings.Contains(err.Error(), "card declined") {
				t.Fatalf("duplicate of a failed operation: %v, want dead (permanent) wrapping idem.ErrFailed and the reason", err)
			}
			if runs.Load() != 1 {
				t.Fatalf("runs = %d, want 1", runs.Load())
			}
		})
	}
}

// TestIdempotency_deathWithoutVerdictReleases: a job that dies for a
// reason other than permanent (its attempts exhausted by a transient error,
// a panic, an expiry, a reason of the handler's own) leaves no failed
// record: the next delivery of the key, as a dead-letter replay after a fix
// makes, runs the operation.
func TestIdempotency_deathWithoutVerdictReleases(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{consumer.ReasonExhausted, consumer.ReasonPanic, middleware.ReasonExpired, "fraud_suspected"} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			store, q := idemSetup(t)
			fail := consumer.Dead(reason, errors.New("smtp: timeout"))
			var runs atomic.Int64
			h := middleware.Idempotency(store, middleware.IdempotencyConfig{})(
				consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
					if runs.Add(1) == 1 {
						return fail
					}
					return nil
				}))
			if err := h.Process(context.Background(), q.job("op")); err != fail {
				t.Fatalf("first run returned %v, want the handler's error unchanged", err)
			}
			if o, _ := store.Begin(context.Background(), q.record("op"), "probe", time.Minute); o.Status != idem.StatusStarted {
				t.Fatalf("record after a death with reason %s: %v, want none (released)", reason, o.Status)
			}
			_ = store.Release(context.Background(), q.record("op"), "probe")
			if err := h.Process(context.Background(), q.job("op")); err != nil || runs.Load() != 2 {
				t.Fatalf("next delivery: %v, runs %d; want a second run that completes", err, runs.Load())
			}
		})
	}
}

// TestIdempotency_exhaustedThroughRetry: with Retry inside, as the chain
// recommends, a transient error on the job's last attempt dies exhausted and
// releases the record; the replayed job (attempt 0 again) runs and
// completes, and only a permanent error fails the record.
func TestIdempotency_exhaustedThroughRetry(t *testing.T) {
	t.Parallel()
	store, q := idemSetup(t)
	var fixed atomic.Bool
	var runs atomic.Int64
	h := consumer.Chain(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		runs.Add(1)
		if job.Type == "bad" {
			return consumer.Permanent(errors.New("no such account"))
		}
		if !fixed.Load() {
			return errors.New("connection refused")
		}
		return nil
	}), middleware.Idempotency(store, middleware.IdempotencyConfig{}), middleware.Retry(middleware.RetryConfig{}))
	ctx := context.Background()

	last := q.job("op")
	last.Attempt, last.AttemptLimit = 2, 3
	err := h.Process(ctx, last)
	if d := consumer.Decide(ctx, last, err); d.Kind != consumer.KindDead || d.Reason != consumer.ReasonExhausted {
		t.Fatalf("last attempt: %v, want dead (exhausted)", err)
	}
	fixed.Store(true)
	if err := h.Process(ctx, q.job("op")); err != nil || runs.Load() != 2 {
		t.Fatalf("replayed job: %v, runs %d; want it run again and done", err, runs.Load())
	}
	if o, _ := store.Begin(ctx, q.record("op"), "probe", time.Minute); o.Status != idem.StatusCompleted {
		t.Fatalf("record after the replay: %v, want completed", o.Status)
	}

	bad := q.job("bad-op")
	bad.Type = "bad"
	for i := range 2 {
		err := h.Process(ctx, bad)
		if d := consumer.Decide(ctx, bad, err); d.Kind != consumer.KindDead || d.Reason != consumer.ReasonPermanent {
			t.Fatalf("permanent failure, delivery %d: %v, want dead (permanent)", i, err)
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("runs %d, want 3: the failed operation must not run again", runs.Load())
	}
	if ok, err := store.Forget(ctx, q.record("bad-op"), idem.StatusFailed); !ok || err != nil {
		t.Fatalf("Forget(failed) = %v, %v", ok, err)
	}
	_ = h.Process(ctx, bad)
	if runs.Load() != 4 {
		t.Fatalf("runs %d, want 4: a forgotten failure runs again", runs.Load())
	}
}

func TestIdempotency_retryableFailureReleases(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]error{
		"plain":  errors.New("timeout"),
		"Retry":  consumer.Retry(time.Second, errors.New("timeout")),
		"Snooze": consumer.Snooze(time.Second),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, q := idemSetup(t)
			var runs atomic.Int64
			h := middleware.Idempotency(store, middleware.IdempotencyConfig{})(
				consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
					if runs.Add(1) == 1 {
						return fail
					}
					return nil
				}))
			if err := h.Process(context.Background(), q.job("op")); err != fail {
				t.Fatalf("first run returned %v, want the handler's error unchanged", err)
			}
			// The retry runs at once: the record was released, not left
			// in progress for the lease (5 min by default).
			if err := h.Process(context.Background(), q.job("op")); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if runs.Load() != 2 {
				t.Fatalf("runs = %d, want 2", runs.Load())
			}
		})
	}
}

func TestIdempotency_panicReleases(t *testing.T) {
	t.Parallel()
	store, q := idemSetup(t)
	var runs atomic.Int64
	h := middleware.Idempotency(store, middleware.IdempotencyConfig{})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			if runs.Add(1) == 1 {
				panic("boom")
			}
			return nil
		}))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_ = h.Process(context.Background(), q.job("op"))
	}()
	if err := h.Process(context.Background(), q.job("op")); err != nil || runs.Load() != 2 {
		t.Fatalf("after a panic: %v, runs %d; want a second run", err, runs.Load())
	}
}

func TestIdempotency_missingKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy middleware.MissingKeyPolicy
		runs   int64
	}{{"Skip", middleware.MissingSkip, 2}, {"UseJobID", middleware.MissingUseJobID, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store, q := idemSetup(t)
			var runs atomic.Int64
			var claimed atomic.Bool
			h := middleware.Idempotency(store, middleware.IdempotencyConfig{Missing: tc.policy})(
				consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
					runs.Add(1)
					if c, ok := idem.ClaimFromContext(ctx); ok && c.Key == q.record(job.ID) {
						claimed.Store(true)
					}
					return nil
				}))
			for range 2 {
				// Two deliveries of the same job (same ID), no key.
				if err := h.Process(context.Background(), &stream.Job{ID: "j1", Type: "t", EntryID: "1-0", Stream: string(q)}); err != nil {
					t.Fatal(err)
				}
			}
			if runs.Load() != tc.runs || claimed.Load() != (tc.policy == middleware.MissingUseJobID) {
				t.Fatalf("runs %d (want %d), keyed by job ID %v", runs.Load(), tc.runs, claimed.Load())
			}
		})
	}
}

// TestIdempotency_takenOverBeforeCompletion: a handler that outlives its
// lease finds the record taken over; the job is snoozed, and the next
// delivery follows the record (a hit once the taker completed).
func TestIdempotency_takenOverBeforeCompletion(t *testing.T) {
	t.Parallel()
	store, q := idemSetup(t)
	ctx := context.Background()
	var runs atomic.Int64
	h := middleware.Idempotency(store, middleware.IdempotencyConfig{Lease: 100 * time.Millisecond})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			runs.Add(1)
			c, _ := idem.ClaimFromContext(ctx)
			// The record's lease passes while this worker stalls (the
			// middleware renews it while the process runs, so the expiry is
			// simulated) and another delivery takes the record over.
			if err := redistest.Shared(t).Del(ctx, c.Key).Err(); err != nil {
				return err
			}
			o, err := store.Begin(ctx, c.Key, "taker", time.Minute)
			if err != nil {
				return err
			}
			if o.Status != idem.StatusStarted {
				return fmt.Errorf("taker's Begin: %v, want started", o.Status)
			}
			return store.Complete(ctx, c.Key, "taker", []byte("taker's"))
		}))
	err := h.Process(ctx, q.job("op"))
	if _, ok := snoozeDelay(err); !ok {
		t.Fatalf("completion after a takeover: %v, want a snooze", err)
	}
	if o, _ := store.Begin(ctx, q.record("op"), "x", time.Minute); o.Status != idem.StatusCompleted || string(o.Result) != "taker's" {
		t.Fatalf("record = %+v, want the taker's completion untouched", o)
	}
	if err := h.Process(ctx, q.job("op")); err != nil || runs.Load() != 1 {
		t.Fatalf("next delivery: %v, runs %d; want a hit", err, runs.Load())
	}
}

// TestIdempotency_handlerLostTheRecord: a handler whose own completion
// (CompleteTx) reported ErrNotOwner gets its job snoozed, not retried or
// failed, and the record is left alone.
func TestIdempotency_handlerLostTheRecord(t *testing.T) {
	t.Parallel()
	store, q := idemSetup(t)
	h := middleware.Idempotency(store, middleware.IdempotencyConfig{})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			c, _ := idem.ClaimFromContext(ctx)
			if err := c.Store.Complete(ctx, c.Key, "someone-else", nil); err != nil {
				return errors.Join(errors.New("rolled back"), err)
			}
			return nil
		}))
	err := h.Process(context.Background(), q.job("op"))
	if _, ok := snoozeDelay(err); !ok {
		t.Fatalf("handler returned ErrNotOwner: %v, want a snooze", err)
	}
}

// TestIdempotency_handlerCompletedItself: a handler that completed the
// record (as with CompleteTx) keeps its result; the middleware's own
// Complete is a no-op.
func TestIdempotency_handlerCompletedItself(t *testing.T) {
	t.Parallel()
	store, q := idemSetup(t)
	h := middleware.Idempotency(store, middleware.IdempotencyConfig{})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			c, _ := idem.ClaimFromContext(ctx)
			return c.Store.Complete(ctx, c.Key, c.Owner, []byte("in-tx"))
		}))
	if err := h.Process(context.Background(), q.job("op")); err != nil {
		t.Fatal(err)
	}
	if o, _ := store.Begin(context.Background(), q.record("op"), "x", time.Minute); o.Status != idem.StatusCompleted || string(o.Result) != "in-tx" {
		t.Fatalf("record = %+v, want the handler's completion", o)
	}
}

// idemBroken is a store whose every call fails.
type idemBroken struct{ idem.Store }

var errIdemDown = errors.New("store down")

func (idemBroken) Begin(context.Context, string, string, time.Duration) (idem.Outcome, error) {
	return idem.Outcome{}, errIdemDown
}

func TestIdempotency_storeErrorFailsTheJob(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h := middleware.Idempotency(idemBroken{}, middleware.IdempotencyConfig{})(
		consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error { runs.Add(1); return nil }))
	err := h.Process(context.Background(), idemJob("op"))
	var o *consumer.Outcome
	if !errors.Is(err, errIdemDown) || errors.As(err, &o) || runs.Load() != 0 {
		t.Fatalf("Begin failed: %v (runs %d), want a plain (retryable) error without running", err, runs.Load())
	}
}

func TestIdempotency_retentionCheckedAgainstHorizon(t *testing.T) {
	t.Parallel()
	store := idem.NewRedisStore(nil, idem.RedisConfig{Retention: time.Hour})
	mw := middleware.Idempotency(store, middleware.IdempotencyConfig{RetryHorizon: idem.RetryHorizon(25, 10*time.Minute, 0)})
	err := mw(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })).Process(t.Context(), &stream.Job{Stream: "s"})
	if err == nil || !strings.Contains(err.Error(), "IdempotencyConfig.RetryHorizon") {
		t.Fatalf("Process = %v, want an error naming IdempotencyConfig.RetryHorizon", err)
	}
}

func TestIdempotency_retentionAboveHorizonAccepted(t *testing.T) {
	t.Parallel()
	store := idem.NewRedisStore(nil, idem.RedisConfig{})
	middleware.Idempotency(store, middleware.IdempotencyConfig{RetryHorizon: idem.RetryHorizon(25, 10*time.Minute, 72*time.Hour)})
}

// By default records are per queue: an operation completed in one queue is
// no hit in another queue with the same key. An explicit Prefix shares them.
func TestIdempotency_perQueue(t *testing.T) {
	t.Parallel()
	store, payments := idemSetup(t)
	rdb := redistest.Shared(t)
	orders := idemQueue(redistest.Name(t))
	shared := redistest.Prefix(t, rdb)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+string(orders)+"}:*") })
	for _, tc := range []struct {
		name   string
		prefix string
		runs   int64
	}{{"Default", "", 2}, {"SharedPrefix", shared, 1}} {
		var runs atomic.Int64
		h := middleware.Idempotency(store, middleware.IdempotencyConfig{Prefix: tc.prefix})(
			consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error { runs.Add(1); return nil }))
		for _, q := range []idemQueue{payments, orders} {
			if err := h.Process(context.Background(), q.job(tc.name+"-invoice-1")); err != nil {
				t.Fatal(err)
			}
		}
		if runs.Load() != tc.runs {
			t.Errorf("%s: invoice-1 in payments then orders ran %d times, want %d", tc.name, runs.Load(), tc.runs)
		}
	}
	if o, _ := store.Begin(context.Background(), shared+"SharedPrefix-invoice-1", "x", time.Minute); o.Status != idem.StatusCompleted {
		t.Errorf("shared record = %+v, want completed under the prefix", o)
	}
}
