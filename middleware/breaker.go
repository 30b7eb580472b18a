package middleware

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [CircuitBreakerConfig].
const (
	// DefaultBreakerThreshold is how many consecutive failures open a
	// breaker.
	DefaultBreakerThreshold = 5
	// DefaultBreakerOpenFor is how long a breaker stays open.
	DefaultBreakerOpenFor = 30 * time.Second
	// DefaultBreakerHalfOpenProbes is how many probe jobs a half-open
	// breaker runs at once.
	DefaultBreakerHalfOpenProbes = 1
)

// BreakerState is the state of one key's circuit breaker.
type BreakerState int32

// The states of a circuit breaker.
const (
	// BreakerClosed: jobs run; consecutive failures are counted.
	BreakerClosed BreakerState = iota
	// BreakerOpen: jobs are snoozed without running until the open time
	// has passed.
	BreakerOpen
	// BreakerHalfOpen: a few probe jobs run; the others are snoozed. A
	// successful probe closes the breaker, a failed one opens it again.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	default:
		return fmt.Sprintf("BreakerState(%d)", int32(s))
	}
}

// CircuitBreakerConfig configures [CircuitBreaker].
type CircuitBreakerConfig struct {
	// HalfOpenProbes is how many jobs of a key may run at once as probes
	// when its breaker is half-open. Defaults to
	// [DefaultBreakerHalfOpenProbes].
	HalfOpenProbes int
	// IsFailure reports whether the consumer's decision about a job whose
	// handler returned an error ([consumer.Decide] over what the next
	// handler returned) is a failure of the kind the breaker counts, such
	// as a downstream that times out. A nil error is a success: it resets
	// the count of consecutive failures and closes a half-open breaker. An
	// error that is not a failure is neutral: it neither counts nor resets
	// (in half-open it frees the probe's place for another probe). The
	// default counts the failures a retry may fix: a retry, or a dead
	// letter with reason [consumer.ReasonExhausted]; not permanent errors,
	// other dead letters, snoozes (for example from an inner rate limit) or
	// jobs the consumer takes back. Defaults to that function.
	IsFailure func(d consumer.Decision) bool
	// Key returns the breaker key of a job, such as its type or the
	// downstream it calls. A job whose key is "" is not guarded. Each key
	// has its own breaker, kept for the life of the middleware, so keys
	// should be few. Defaults to the job's type.
	Key func(job *stream.Job) string
	// Now returns the current time; tests replace it. Defaults to
	// [time.Now].
	Now func() time.Time
	// OnStateChange, if set, is called on every change of a key's state,
	// with the key's lock held: it must be quick and must not process jobs
	// through the same breaker. Defaults to nil.
	OnStateChange func(key string, from, to BreakerState)
	// OpenFor is how long a breaker stays open before it lets probes
	// through. Defaults to [DefaultBreakerOpenFor].
	OpenFor time.Duration
	// Threshold is how many consecutive failures open a closed breaker.
	// Defaults to [DefaultBreakerThreshold].
	Threshold int
}

// Validate reports the first field of cfg that is out of range, named.
func (cfg CircuitBreakerConfig) Validate() error {
	switch {
	case cfg.HalfOpenProbes < 0:
		return fmt.Errorf("middleware: CircuitBreakerConfig.HalfOpenProbes (%d) must not be negative", cfg.HalfOpenProbes)
	case cfg.OpenFor < 0:
		return fmt.Errorf("middleware: CircuitBreakerConfig.OpenFor (%v) must not be negative", cfg.OpenFor)
	case cfg.Threshold < 0:
		return fmt.Errorf("middleware: CircuitBreakerConfig.Threshold (%d) must not be negative", cfg.Threshold)
	}
	return nil
}

// breakerBuckets is how many snooze delays an open breaker prepares.
const breakerBuckets = 16

// CircuitBreaker returns a middleware with one circuit breaker per key,
// kept in this process. A closed breaker runs jobs and counts consecutive
// failures (see [CircuitBreakerConfig.IsFailure]); cfg.Threshold of them
// open it. An open breaker reschedules every job with [consumer.Snooze]
// for the rest of the open time plus a jitter, without calling the handler
// and without counting an attempt. After cfg.OpenFor the breaker is
// half-open: up to cfg.HalfOpenProbes jobs run as probes, the others are
// snoozed for about cfg.OpenFor/16; a successful probe closes the
// breaker, a failed one opens it again for cfg.OpenFor.
//
// An open breaker is cheap: rejecting a job takes no lock, no Redis call
// and no allocation (the snooze errors are made when the breaker opens:
// one per sixteenth of the open time, each with its own jitter, so that
// the jobs rejected at different times come back at different times).
//
// An invalid cfg makes [consumer.Consumer.Run] fail (see
// [consumer.Invalid]).
func CircuitBreaker(cfg CircuitBreakerConfig) consumer.Middleware {
	if err := cfg.Validate(); err != nil {
		return consumer.Invalid(err)
	}
	if cfg.Threshold <= 0 {
		cfg.Threshold = DefaultBreakerThreshold
	}
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = DefaultBreakerOpenFor
	}
	if cfg.HalfOpenProbes <= 0 {
		cfg.HalfOpenProbes = DefaultBreakerHalfOpenProbes
	}
	if cfg.IsFailure == nil {
		cfg.IsFailure = breakerIsFailure
	}
	if cfg.Key == nil {
		cfg.Key = func(job *stream.Job) string { return job.Type }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b := &breaker{cfg: cfg, keys: make(map[string]*breakerKey)}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			k := b.cfg.Key(job)
			if k == "" {
				return next.Process(ctx, job)
			}
			st := b.key(k)
			now := b.cfg.Now().UnixNano()
			if o := st.open.Load(); o != nil && now < o.until {
				return o.snooze(o.until - now) // the open path: no lock, no allocation
			}
			probe, gen, err := b.admit(k, st, now)
			if err != nil {
				return err
			}
			panicked := true
			defer func() {
				if panicked {
					// The panic goes on to the core, which recovers it; a
					// probe that panicked must still free its place, or the
					// breaker would stay half-open with no probe forever.
					b.record(k, st, probe, gen, true, b.cfg.IsFailure(consumer.Decide(ctx, job, &consumer.PanicError{})))
				}
			}()
			err = next.Process(ctx, job)
			panicked = false
			b.record(k, st, probe, gen, err != nil, err != nil && b.cfg.IsFailure(consumer.Decide(ctx, job, err)))
			return err
		})
	}
}

// breaker is the state of one CircuitBreaker middleware.
type breaker struct {
	cfg  CircuitBreakerConfig
	mu   sync.RWMutex
	keys map[string]*breakerKey
}

// breakerKey is the breaker of one key.
type breakerKey struct {
	// open is set while the breaker is open or half-open.
	open atomic.Pointer[breakerOpen]

	mu       sync.Mutex
	state    BreakerState
	gen      uint64 // incremented on every change of state
	failures int    // consecutive failures while closed
	probes   int    // probes running while half-open
}

// breakerOpen is one opening of a breaker.
type breakerOpen struct {
	until int64 // Unix nanoseconds
	width int64 // nanoseconds per bucket
	// snoozes[i] is the outcome for a job rejected with the rest of the
	// open time in (i*width, (i+1)*width]: a snooze of (i+1)*width plus a
	// jitter in [0, width).
	snoozes [breakerBuckets]error
}

func (o *breakerOpen) snooze(remaining int64) error {
	i := (remaining+o.width-1)/o.width - 1
	i = max(0, min(i, breakerBuckets-1))
	return o.snoozes[i]
}

func (b *breaker) key(k string) *breakerKey {
	b.mu.RLock()
	st := b.keys[k]
	b.mu.RUnlock()
	if st != nil {
		return st
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if st = b.keys[k]; st == nil {
		st = &breakerKey{}
		b.keys[k] = st
	}
	return st
}

// admit decides whether a job runs, and if so whether as a probe and in
// which generation of the state. A job that does not run gets a snooze
// error.
func (b *breaker) admit(k string, st *breakerKey, now int64) (probe bool, gen uint64, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.state == BreakerOpen {
		o := st.open.Load()
		if now < o.until {
			return false, 0, o.snooze(o.until - now)
		}
		b.transition(k, st, BreakerHalfOpen)
	}
	if st.state == BreakerHalfOpen {
		if st.probes >= b.cfg.HalfOpenProbes {
			return false, 0, st.open.Load().snoozes[0]
		}
		st.probes++
		return true, st.gen, nil
	}
	return false, st.gen, nil
}

// record counts the result of a job admitted by admit.
func (b *breaker) record(k string, st *breakerKey, probe bool, gen uint64, errored, failed bool) {
	if errored && !failed {
		if probe {
			st.mu.Lock()
			st.probes--
			st.mu.Unlock()
		}
		return // neutral
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if probe {
		st.probes--
	}
	if gen != st.gen {
		return // the result of a job admitted before the last change of state
	}
	switch {
	case probe && failed:
		b.openKey(k, st)
	case probe:
		b.transition(k, st, BreakerClosed)
	case failed:
		st.failures++
		if st.failures >= b.cfg.Threshold {
			b.openKey(k, st)
		}
	default:
		st.failures = 0
	}
}

// openKey opens st for OpenFor from now. st.mu is held.
func (b *breaker) openKey(k string, st *breakerKey) {
	openFor := int64(b.cfg.OpenFor)
	o := &breakerOpen{
		until: b.cfg.Now().UnixNano() + openFor,
		width: max(openFor/breakerBuckets, 1),
	}
	for i := range o.snoozes {
		d := int64(i+1)*o.width + rand.Int64N(o.width)
		o.snoozes[i] = consumer.Snooze(time.Duration(d))
	}
	st.open.Store(o)
	b.transition(k, st, BreakerOpen)
}

// transition moves st to state to. st.mu is held.
func (b *breaker) transition(k string, st *breakerKey, to BreakerState) {
	from := st.state
	st.state = to
	st.gen++
	st.failures = 0
	if to == BreakerClosed {
		st.open.Store(nil)
	}
	if b.cfg.OnStateChange != nil {
		b.cfg.OnStateChange(k, from, to)
	}
}

// breakerIsFailure is the default CircuitBreakerConfig.IsFailure.
func breakerIsFailure(d consumer.Decision) bool {
	return d.Kind == consumer.KindRetry || (d.Kind == consumer.KindDead && d.Reason == consumer.ReasonExhausted)
}
