package middleware

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [DistributedConcurrencyConfig].
const (
	// DefaultDistributedConcurrencyLease is how long a slot is held without
	// renewal.
	DefaultDistributedConcurrencyLease = 30 * time.Second
)

// distReleaseTimeout bounds the release of a slot after the handler returns.
const distReleaseTimeout = 5 * time.Second

// ErrLimitLeaseLost is the cause with which [DistributedConcurrency] cancels
// a handler's context when the handler's slot lease could not be renewed
// (it expired, for example because the process stalled or lost Redis for
// longer than the lease): another job may hold the slot now.
var ErrLimitLeaseLost = errors.New("middleware: distributed concurrency lease lost")

var (
	//go:embed distlimit_acquire.lua
	distAcquireLua string
	//go:embed distlimit_renew.lua
	distRenewLua string

	distAcquireScript = redis.NewScript(distAcquireLua)
	distRenewScript   = redis.NewScript(distRenewLua)
)

// DistributedConcurrencyConfig configures [DistributedConcurrency].
type DistributedConcurrencyConfig struct {
	// Key returns the limit key of a job. A job whose key is "" is not
	// limited. Defaults to "type:" + the job's type.
	Key func(job *stream.Job) string
	// Lease is how long a slot stays held without renewal, so how long the
	// slot of a crashed process stays taken. The middleware renews it every
	// Lease/3 while the handler runs. Defaults to
	// [DefaultDistributedConcurrencyLease].
	Lease time.Duration
	// Limit is how many jobs of one key may run at once across every
	// process sharing the Redis. Required.
	Limit int
	// Prefix starts the Redis key of every limit key: the slots of key k
	// are the sorted set Prefix + k. Defaults to the namespace of the job's
	// queue, stream.KeysFor(job.Stream).Limit ("{orders}:limit:"): each
	// queue has its own limits, in its stream's cluster slot. Set it to
	// share limits across queues on purpose (one pool of connections to a
	// downstream that several queues use): every queue whose
	// DistributedConcurrency has the same Prefix counts against the same
	// Limit per key.
	Prefix string
	// SnoozeFor is how long a job that found every slot held is snoozed,
	// jittered to between 0.75 and 1.25 times. Defaults to
	// [DefaultConcurrencySnoozeFor].
	SnoozeFor time.Duration
}

// Validate reports the first invalid field of cfg: a Limit that is not
// positive, or a Lease under 3 ms.
func (cfg DistributedConcurrencyConfig) Validate() error {
	if cfg.Limit <= 0 {
		return fmt.Errorf("middleware: DistributedConcurrencyConfig.Limit (%d) must be positive", cfg.Limit)
	}
	if cfg.Lease != 0 && cfg.Lease < 3*time.Millisecond {
		return fmt.Errorf("middleware: DistributedConcurrencyConfig.Lease (%v) must be at least 3ms", cfg.Lease)
	}
	return nil
}

// DistributedConcurrency returns a middleware that lets at most cfg.Limit
// jobs of each key of a queue run at once across every process sharing rdb.
// Limits are per queue unless cfg.Prefix shares them.
//
// Each key is a sorted set of lease holders scored by lease expiry in Redis
// TIME. Taking a slot removes expired holders, then admits the job if fewer
// than cfg.Limit remain; a job that finds every slot held is rescheduled
// with [consumer.Snooze], which does not count an attempt. While the
// handler runs its lease is renewed every cfg.Lease/3; when the handler
// returns the slot is released. Nothing counts up and down, so nothing can
// drift: the slot of a process that crashed frees itself when its lease
// expires. If a renewal finds the lease gone, or renewals fail for a whole
// lease, the handler's context is cancelled with cause [ErrLimitLeaseLost].
// If Redis cannot take the slot, the job fails with that error (a
// retryable failure, which counts an attempt).
//
// An invalid cfg (see [DistributedConcurrencyConfig.Validate]) gives a
// [consumer.Invalid] middleware: the consumer's Run fails with the error
// before it touches Redis.
func DistributedConcurrency(rdb redis.UniversalClient, cfg DistributedConcurrencyConfig) consumer.Middleware {
	if err := cfg.Validate(); err != nil {
		return consumer.Invalid(err)
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultDistributedConcurrencyLease
	}
	if cfg.SnoozeFor <= 0 {
		cfg.SnoozeFor = DefaultConcurrencySnoozeFor
	}
	if cfg.Key == nil {
		cfg.Key = func(job *stream.Job) string { return "type:" + job.Type }
	}
	d := &distLimiter{
		rdb:   rdb,
		limit: strconv.Itoa(cfg.Limit),
		lease: cfg.Lease,
		ms:    strconv.FormatInt(cfg.Lease.Milliseconds(), 10),
	}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			k := cfg.Key(job)
			if k == "" {
				return next.Process(ctx, job)
			}
			prefix, err := namespace(cfg.Prefix, job, limitPrefix)
			if err != nil {
				return err
			}
			key := prefix + k
			token := distToken()
			ok, err := d.acquire(ctx, key, token)
			if err != nil {
				return fmt.Errorf("middleware: distributed concurrency %q: %w", k, err)
			}
			if !ok {
				return consumer.Snooze(concJitter(cfg.SnoozeFor))
			}
			hctx, cancel := context.WithCancelCause(ctx)
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				d.keep(hctx, key, token, stop, cancel)
			}()
			defer func() {
				close(stop)
				<-done
				cancel(nil)
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), distReleaseTimeout)
				defer rcancel()
				// A failed release is not an error of the job: the lease expires.
				_ = d.rdb.ZRem(rctx, key, token).Err()
			}()
			return next.Process(hctx, job)
		})
	}
}

// limitPrefix picks the queue's concurrency limit namespace from its keys.
func limitPrefix(k stream.Keys) string { return k.Limit }

// distLimiter holds a DistributedConcurrency's normalised configuration.
type distLimiter struct {
	rdb   redis.UniversalClient
	limit string
	lease time.Duration
	ms    string
}

func (d *distLimiter) acquire(ctx context.Context, key, token string) (bool, error) {
	res, err := distAcquireScript.Run(ctx, d.rdb, []string{key}, token, d.limit, d.ms).Int64Slice()
	if err != nil {
		return false, err
	}
	if len(res) != 2 {
		return false, fmt.Errorf("unexpected script reply %v", res)
	}
	return res[0] == 1, nil
}

// keep renews the lease every lease/3 until stop is closed, and cancels the
// handler with ErrLimitLeaseLost when the lease is gone or could not be
// renewed for a whole lease.
func (d *distLimiter) keep(ctx context.Context, key, token string, stop <-chan struct{}, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(d.lease / 3)
	defer tick.Stop()
	renewed := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-tick.C: // even after ctx ends: the handler may still run
		}
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), d.lease/3)
		n, err := distRenewScript.Run(rctx, d.rdb, []string{key}, token, d.ms).Int64()
		rcancel()
		switch {
		case err == nil && n == 1:
			renewed = time.Now()
		case err == nil:
			cancel(ErrLimitLeaseLost)
			return
		case time.Since(renewed) >= d.lease:
			cancel(fmt.Errorf("%w: %w", ErrLimitLeaseLost, err))
			return
		}
	}
}

// distToken returns a random holder token.
func distToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}
