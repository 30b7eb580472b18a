package idem

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of [RedisConfig] and [SQLConfig].
const (
	// DefaultRetention is how long completed and failed records are kept.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultTable is the SQL store's table.
	DefaultTable = "pelican_idempotency"
)

var (
	//go:embed begin.lua
	beginLua string
	//go:embed finish.lua
	finishLua string
	//go:embed release.lua
	releaseLua string
	//go:embed forget.lua
	forgetLua string

	beginScript   = redis.NewScript(beginLua)
	finishScript  = redis.NewScript(finishLua)
	releaseScript = redis.NewScript(releaseLua)
	forgetScript  = redis.NewScript(forgetLua)
)

// RedisConfig configures [NewRedisStore].
type RedisConfig struct {
	// Retention is how long completed and failed records are kept (their
	// TTL). Defaults to [DefaultRetention].
	Retention time.Duration
}

// RedisStore is a [Store] in Redis: one hash per key holding status, owner,
// result and reason. The record of key k is the Redis key k itself:
// middleware.Idempotency gives keys in the job's queue namespace
// ("{orders}:idem:invoice-1", in the stream's cluster slot), or under the
// prefix its configuration shares across queues. A processing record's TTL
// is its lease, a finished
// record's TTL the retention, so Redis expires both and nothing needs
// purging. Every operation is one Lua script on one key, so the store works
// on Redis Cluster. Records must not be evicted: run Redis with
// maxmemory-policy noeviction. Leases are Redis TTLs, measured by the server:
// on miniredis they pass only when the test moves its clock (FastForward).
type RedisStore struct {
	rdb       redis.UniversalClient
	retention time.Duration
}

// NewRedisStore returns a RedisStore on rdb.
func NewRedisStore(rdb redis.UniversalClient, cfg RedisConfig) *RedisStore {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	return &RedisStore{rdb: rdb, retention: cfg.Retention}
}

// Retention returns how long finished records are kept.
func (s *RedisStore) Retention() time.Duration { return s.retention }

// Begin implements [Store].
func (s *RedisStore) Begin(ctx context.Context, key, owner string, lease time.Duration) (Outcome, error) {
	if err := checkArgs(key, owner); err != nil {
		return Outcome{}, err
	}
	if err := checkLease(lease); err != nil {
		return Outcome{}, err
	}
	v, err := beginScript.Run(ctx, s.rdb, []string{key}, owner, lease.Milliseconds()).Slice()
	if err != nil {
		return Outcome{}, fmt.Errorf("idem: begin %q: %w", key, err)
	}
	if len(v) != 4 {
		return Outcome{}, fmt.Errorf("idem: begin %q: unexpected reply %v", key, v)
	}
	f := make([]string, 4)
	for i, x := range v {
		str, ok := x.(string)
		if !ok {
			return Outcome{}, fmt.Errorf("idem: begin %q: unexpected reply %v", key, v)
		}
		f[i] = str
	}
	o := Outcome{Owner: f[1], Reason: f[3]}
	if f[2] != "" {
		o.Result = []byte(f[2])
	}
	switch f[0] {
	case "started":
		o.Status = StatusStarted
	case "in_progress":
		o.Status = StatusInProgress
	case "completed":
		o.Status = StatusCompleted
	case "failed":
		o.Status = StatusFailed
	default:
		return Outcome{}, fmt.Errorf("idem: begin %q: record has unknown status %q", key, f[0])
	}
	return o, nil
}

// Complete implements [Store].
func (s *RedisStore) Complete(ctx context.Context, key, owner string, result []byte) error {
	return s.finish(ctx, key, owner, "completed", "result", result)
}

// Fail implements [Store].
func (s *RedisStore) Fail(ctx context.Context, key, owner, reason string) error {
	return s.finish(ctx, key, owner, "failed", "reason", []byte(reason))
}

func (s *RedisStore) finish(ctx context.Context, key, owner, status, field string, val []byte) error {
	if err := checkArgs(key, owner); err != nil {
		return err
	}
	n, err := finishScript.Run(ctx, s.rdb, []string{key},
		owner, status, field, val, max(s.retention.Milliseconds(), 1)).Int()
	if err != nil {
		return fmt.Errorf("idem: %s %q: %w", status, key, err)
	}
	if n != 1 {
		return ErrNotOwner
	}
	return nil
}

// Release implements [Store].
func (s *RedisStore) Release(ctx context.Context, key, owner string) error {
	if err := checkArgs(key, owner); err != nil {
		return err
	}
	n, err := releaseScript.Run(ctx, s.rdb, []string{key}, owner).Int()
	if err != nil {
		return fmt.Errorf("idem: release %q: %w", key, err)
	}
	if n != 1 {
		return ErrNotOwner
	}
	return nil
}

// Forget implements [Store].
func (s *RedisStore) Forget(ctx context.Context, key string, status Status) (bool, error) {
	if err := checkForget(key, status); err != nil {
		return false, err
	}
	n, err := forgetScript.Run(ctx, s.rdb, []string{key}, status.String()).Int()
	if err != nil {
		return false, fmt.Errorf("idem: forget %q: %w", key, err)
	}
	return n == 1, nil
}
