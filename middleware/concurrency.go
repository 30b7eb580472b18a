package middleware

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// DefaultConcurrencySnoozeFor is how long a job that found no free slot is
// snoozed by [Concurrency] and [DistributedConcurrency], before jitter.
const DefaultConcurrencySnoozeFor = time.Second

// ConcurrencyConfig configures [Concurrency].
type ConcurrencyConfig struct {
	// Default is the limit of a job type absent from Limits. Zero or less
	// means unlimited. Defaults to 0.
	Default int
	// Limits caps the jobs of each type running at once in this process. A
	// type listed with a limit of zero or less is unlimited (whatever
	// Default says); a type not listed gets Default. Defaults to nil.
	Limits map[string]int
	// SnoozeFor is how long a job that found no free slot is snoozed. The
	// delay is jittered to between 0.75 and 1.25 times SnoozeFor so that
	// snoozed jobs do not come back together. Defaults to
	// [DefaultConcurrencySnoozeFor].
	SnoozeFor time.Duration
	// Wait is how long a job waits for a free slot before it is snoozed.
	// Zero snoozes it at once. Defaults to 0.
	Wait time.Duration
}

// Concurrency returns a middleware that limits how many jobs of each type
// run at once in this process, with one semaphore per job type. A job that
// finds its type's slots taken waits up to cfg.Wait for one, then is
// rescheduled with [consumer.Snooze], which does not count an attempt. A
// job whose context ends while it waits returns the context's cause.
//
// The limit is per process: for a limit across processes, use
// [DistributedConcurrency].
func Concurrency(cfg ConcurrencyConfig) consumer.Middleware {
	if cfg.SnoozeFor <= 0 {
		cfg.SnoozeFor = DefaultConcurrencySnoozeFor
	}
	limits := make(map[string]int, len(cfg.Limits))
	for typ, n := range cfg.Limits {
		limits[typ] = n
	}
	var sems sync.Map // job type -> chan struct{}
	sem := func(typ string) chan struct{} {
		if s, ok := sems.Load(typ); ok {
			return s.(chan struct{})
		}
		n, listed := limits[typ]
		if !listed {
			n = cfg.Default
		}
		if n <= 0 {
			return nil
		}
		s, _ := sems.LoadOrStore(typ, make(chan struct{}, n))
		return s.(chan struct{})
	}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			s := sem(job.Type)
			if s == nil {
				return next.Process(ctx, job)
			}
			if err := concAcquire(ctx, s, cfg.Wait); err != nil {
				if err == errConcFull {
					return consumer.Snooze(concJitter(cfg.SnoozeFor))
				}
				return err
			}
			defer func() { <-s }()
			return next.Process(ctx, job)
		})
	}
}

// errConcFull is returned by concAcquire when no slot freed up in time.
var errConcFull = errors.New("middleware: concurrency limit reached")

// concAcquire takes a slot of s, waiting up to wait. It returns errConcFull
// when none freed up, or ctx's cause when ctx ended first.
func concAcquire(ctx context.Context, s chan struct{}, wait time.Duration) error {
	select {
	case s <- struct{}{}:
		return nil
	default:
	}
	if wait <= 0 {
		return errConcFull
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s <- struct{}{}:
		return nil
	case <-t.C:
		return errConcFull
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// concJitter returns d scaled by a random factor in [0.75, 1.25).
func concJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d*3/4 + time.Duration(rand.Int64N(int64(d/2)+1))
}
