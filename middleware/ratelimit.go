package middleware

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

//go:embed ratelimit.lua
var rateLua string

var rateScript = redis.NewScript(rateLua)

// RateLimitConfig configures [RateLimit] and [NewRateLimiter].
type RateLimitConfig struct {
	// Burst is how many jobs of one key may start at once after the key was
	// idle; the steady rate is Rate per Per whatever Burst is, and over any
	// window of length W at most Burst + W*Rate/Per jobs start. Defaults to
	// Rate, as go-redis/redis_rate's PerSecond does: a snoozed job comes
	// back when the consumer promotes delayed jobs, in batches, and a
	// burst of 1 would let only one job of each batch through. Set it to 1
	// for strictly evenly spaced starts.
	Burst int
	// Key returns the rate limit key of a job, such as the downstream API it
	// calls. A job whose key is "" is not limited. Defaults to the job's
	// type.
	Key func(job *stream.Job) string
	// Per is the period of Rate. Required.
	Per time.Duration
	// Prefix starts the Redis key of every rate limit key: the limiter of
	// key k is Prefix + k. Defaults to the namespace of the job's queue,
	// stream.KeysFor(job.Stream).Rate ("{orders}:rate:"): each queue has
	// its own limits, in its stream's cluster slot. Set it to share limits
	// across queues on purpose (one budget for a downstream API that
	// several queues call): every queue whose RateLimit has the same Prefix
	// takes from the same budget per key.
	Prefix string
	// Rate is how many jobs of one key may start per Per, across every
	// process sharing the Redis. Required.
	Rate int
}

// RateLimiter is a distributed GCRA rate limiter in Redis, the one that
// [RateLimit] uses: each decision is one Lua script timed by Redis TIME, so
// any number of processes share one limit per key and their clocks do not
// matter. It is safe for concurrent use.
type RateLimiter struct {
	rdb      redis.Scripter
	burst    string
	interval string
	every    time.Duration
}

// NewRateLimiter returns a limiter of cfg.Rate per cfg.Per with burst
// cfg.Burst. cfg.Key and cfg.Prefix are not used: [RateLimiter.Allow] takes
// the Redis key. It returns an error naming the field if
// cfg.Rate, cfg.Per or cfg.Burst is invalid, or if the emission interval
// Per/Rate is under a microsecond.
func NewRateLimiter(rdb redis.UniversalClient, cfg RateLimitConfig) (*RateLimiter, error) {
	if cfg.Rate <= 0 {
		return nil, fmt.Errorf("middleware: RateLimitConfig.Rate (%d) must be positive", cfg.Rate)
	}
	if cfg.Per <= 0 {
		return nil, fmt.Errorf("middleware: RateLimitConfig.Per (%v) must be positive", cfg.Per)
	}
	if cfg.Burst < 0 {
		return nil, fmt.Errorf("middleware: RateLimitConfig.Burst (%d) must not be negative", cfg.Burst)
	}
	if cfg.Burst == 0 {
		cfg.Burst = cfg.Rate
	}
	every := cfg.Per / time.Duration(cfg.Rate)
	if every < time.Microsecond {
		return nil, fmt.Errorf("middleware: RateLimitConfig.Rate (%d) per RateLimitConfig.Per (%v) is more than one per microsecond", cfg.Rate, cfg.Per)
	}
	return &RateLimiter{
		rdb:      rdb,
		burst:    strconv.Itoa(cfg.Burst),
		interval: strconv.FormatInt(every.Microseconds(), 10),
		every:    every,
	}, nil
}

// Allow takes one start from the budget kept in the Redis key key (a
// string with a TTL; [RateLimit] uses Prefix + the job's rate limit key).
// When the budget is spent it returns false and how long to wait before the
// next start can pass; nothing is taken then. err is non-nil only if Redis
// could not decide.
func (l *RateLimiter) Allow(ctx context.Context, key string) (allowed bool, retryAfter time.Duration, err error) {
	res, err := rateScript.Run(ctx, l.rdb, []string{key}, l.burst, l.interval).Int64Slice()
	if err != nil {
		return false, 0, fmt.Errorf("middleware: rate limit %q: %w", key, err)
	}
	if len(res) != 2 {
		return false, 0, fmt.Errorf("middleware: rate limit %q: unexpected script reply %v", key, res)
	}
	if res[0] == 1 {
		return true, 0, nil
	}
	return false, time.Duration(res[1]) * time.Microsecond, nil
}

// RateLimit returns a middleware that lets at most cfg.Rate jobs of each
// key of a queue start per cfg.Per across every process, with a
// [RateLimiter]. Limits are per queue unless cfg.Prefix shares them. A job
// over the limit is not run: it is rescheduled with [consumer.Snooze]
// after the limiter's retry-after plus a small jitter, which does not count
// an attempt. If Redis cannot decide, the job fails with that error (a
// retryable failure, which counts an attempt).
//
// The limit bounds starts, not jobs running at once: combine it with
// [Concurrency] or [DistributedConcurrency] for that. An invalid cfg (see
// [NewRateLimiter]) gives a [consumer.Invalid] middleware: the consumer's
// Run fails with the error before it touches Redis.
func RateLimit(rdb redis.UniversalClient, cfg RateLimitConfig) consumer.Middleware {
	l, err := NewRateLimiter(rdb, cfg)
	if err != nil {
		return consumer.Invalid(err)
	}
	key := cfg.Key
	if key == nil {
		key = func(job *stream.Job) string { return job.Type }
	}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			k := key(job)
			if k == "" {
				return next.Process(ctx, job)
			}
			prefix, err := namespace(cfg.Prefix, job, ratePrefix)
			if err != nil {
				return err
			}
			ok, after, err := l.Allow(ctx, prefix+k)
			if err != nil {
				return err
			}
			if !ok {
				return consumer.Snooze(after + rateJitter(after, l.every))
			}
			return next.Process(ctx, job)
		})
	}
}

// ratePrefix picks the queue's rate limit namespace from its keys.
func ratePrefix(k stream.Keys) string { return k.Rate }

// rateJitter returns a random delay in [0, after/10 + every), so that jobs
// limited at the same moment do not all come back at the same moment.
func rateJitter(after, every time.Duration) time.Duration {
	return time.Duration(rand.Int64N(int64(after/10+every) + 1))
}
