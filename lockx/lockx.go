package lockx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/guard"
	"github.com/pelicanqueue/pelican/internal/keyslot"
)

// DefaultPrefix is the default [Config.Prefix].
const DefaultPrefix = "pelican:lock:"

// Errors of the package, for errors.Is.
var (
	// ErrNotObtained: the lock is held by someone else (TryAcquire), or
	// was still held when Acquire stopped waiting.
	ErrNotObtained = errors.New("lockx: not obtained")
	// ErrNotHeld: the lock no longer holds the caller's token: it expired,
	// and may belong to someone else now, or it was released.
	ErrNotHeld = errors.New("lockx: not held")
	// ErrLockLost is the cause given by [Lock.Err] once [Lock.Lost] is
	// closed: renewal found the lock gone, or could not renew it for a
	// whole TTL.
	ErrLockLost = errors.New("lockx: lock lost")
	// ErrInvalidKey: the key is empty.
	ErrInvalidKey = errors.New("lockx: invalid key")
)

// Config configures a [Client].
type Config struct {
	// Prefix starts the Redis key of every lock: the lock of key k is
	// Prefix + "{" + k + "}". Without a hash tag, each lock hashes by its
	// key k and locks spread over a Redis Cluster. With a hash tag (the
	// middleware's per-queue prefix "{orders}:lock:"), every lock of the
	// Client lives in that tag's slot, beside the queue. Braces that form no
	// hash tag ("a{b", "x}", "{}") are refused. Defaults to [DefaultPrefix].
	Prefix string
}

// Validate returns an error naming Config.Prefix if its braces form no hash
// tag. The zero Config is valid.
func (c Config) Validate() error {
	if _, ok := keyslot.Tag(c.Prefix); !ok && strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("lockx: Config.Prefix (%q) has braces that form no hash tag; use a prefix without braces or with a non-empty {tag}", c.Prefix)
	}
	return nil
}

// Client takes locks on one Redis (single node, Sentinel or Cluster). It is
// safe for concurrent use. Every Client of one redis client shares one
// batcher (the commands of concurrent callers go in one round trip) and one
// watchdog (it renews every lock kept alive in one round trip per tick).
type Client struct {
	r      *guard.Runner
	prefix string
	err    error // what Validate said of the Config; every call returns it
}

// New returns a Client of rdb. It does not fail: when cfg does not pass
// [Config.Validate], every call of the client returns that error, naming
// the field, before Redis is touched.
func New(rdb redis.UniversalClient, cfg Config) *Client {
	if err := cfg.Validate(); err != nil {
		return &Client{err: err}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Client{r: guard.Of(rdb), prefix: cfg.Prefix}
}

// RedisKey returns the Redis key of key's lock, or an error matching
// [ErrInvalidKey] for an empty key.
func (c *Client) RedisKey(key string) (string, error) {
	if c.err != nil {
		return "", c.err
	}
	if key == "" {
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	return c.prefix + "{" + key + "}", nil
}

// TryAcquire takes the lock of key for ttl if nobody holds it, and returns
// [ErrNotObtained] if somebody does. The lock is not renewed unless
// [Lock.KeepAlive] is called. ttl is rounded down to milliseconds and must
// be at least 1 ms.
func (c *Client) TryAcquire(ctx context.Context, key string, ttl time.Duration) (*Lock, error) {
	lockKey, err := c.RedisKey(key)
	if err != nil {
		return nil, err
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("lockx: ttl (%v) must be at least 1ms", ttl)
	}
	token := newToken()
	sent := time.Now()
	v, err := c.r.Do(ctx, guard.LockAcquire(lockKey, token, ttl))
	if err != nil {
		// The script may have run (a lost reply): the lock then expires.
		return nil, fmt.Errorf("lockx: acquire %q: %w", key, err)
	}
	fence, ok := v.(string)
	if !ok {
		return nil, ErrNotObtained
	}
	return newLock(c.r, key, lockKey, token, fence, ttl, sent)
}

// AcquireOptions configures [Client.Acquire].
type AcquireOptions struct {
	// Backoff returns how long to wait after the n-th failed attempt (n
	// from 1). Defaults to [DefaultBackoff].
	Backoff func(n int) time.Duration
	// Wait is how long to keep trying. Defaults to 0: until ctx is done.
	Wait time.Duration
}

// DefaultBackoff is the default [AcquireOptions.Backoff]: 10 ms doubled per
// attempt up to 500 ms, each delay drawn between half and all of that.
func DefaultBackoff(n int) time.Duration {
	d := 500 * time.Millisecond
	if n >= 1 && n <= 6 {
		d = min(10*time.Millisecond<<(n-1), d)
	}
	return d/2 + rand.N(d/2+1)
}

// Acquire takes the lock of key for ttl, trying again with opts.Backoff
// while it is held, for at most opts.Wait (0: until ctx is done). It
// returns an error matching [ErrNotObtained] when it stops waiting, which
// also matches ctx's error if ctx ended the wait. Other errors (Redis
// unreachable) are returned at once.
func (c *Client) Acquire(ctx context.Context, key string, ttl time.Duration, opts AcquireOptions) (*Lock, error) {
	if c.err != nil {
		return nil, c.err
	}
	if opts.Backoff == nil {
		opts.Backoff = DefaultBackoff
	}
	var deadline <-chan time.Time
	if opts.Wait > 0 {
		t := time.NewTimer(opts.Wait)
		defer t.Stop()
		deadline = t.C
	}
	for n := 1; ; n++ {
		l, err := c.TryAcquire(ctx, key, ttl)
		if !errors.Is(err, ErrNotObtained) {
			if err != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", ErrNotObtained, context.Cause(ctx))
			}
			return l, err
		}
		t := time.NewTimer(opts.Backoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: %w", ErrNotObtained, context.Cause(ctx))
		case <-deadline:
			t.Stop()
			return nil, ErrNotObtained
		case <-t.C:
		}
	}
}

// newToken returns a random holder token.
func newToken() string { return guard.Token() }
