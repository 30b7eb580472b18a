package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/guard"
)

// Defaults of [RedisConfig] and [SQLConfig].
const (
	// DefaultRetention is how long completed and failed records are kept.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultTable is the SQL store's table.
	DefaultTable = "pelican_idempotency"
)

// RedisConfig configures [NewRedisStore].
type RedisConfig struct {
	// Retention is how long completed and failed records are kept (their
	// TTL). Defaults to [DefaultRetention].
	Retention time.Duration
}

// RedisStore is a [Store] in Redis: one string per key, as small as the
// record allows. A processing record is "p" followed by its owner, with the
// lease as TTL; a finished one is "c" (completed) or "f" (failed), the
// owner's length and ':', the owner, then the result (or the reason), with
// the retention as TTL. The record of key k is the Redis key k itself:
// middleware.Idempotency gives keys in the job's queue namespace
// ("{orders}:idem:invoice-1", in the stream's cluster slot), or under the
// prefix its configuration shares across queues. Redis expires both kinds,
// so nothing needs purging. Operations of concurrent callers on one redis
// client are sent together, one script call per cluster slot in one round
// trip; each operation is atomic on its one key, so the store works on
// Redis Cluster. Records must not be evicted: run Redis with
// maxmemory-policy noeviction. Leases are Redis TTLs, measured by the
// server: on miniredis they pass only when the test moves its clock
// (FastForward).
type RedisStore struct {
	r         *guard.Runner
	retention time.Duration
}

// NewRedisStore returns a RedisStore on rdb.
func NewRedisStore(rdb redis.UniversalClient, cfg RedisConfig) *RedisStore {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	return &RedisStore{r: guard.Of(rdb), retention: cfg.Retention}
}

// Retention returns how long finished records are kept.
func (s *RedisStore) Retention() time.Duration { return s.retention }

func init() {
	guard.StoreOf = func(store any) (*guard.Runner, time.Duration, bool) {
		s, ok := store.(*RedisStore)
		if !ok {
			return nil, 0, false
		}
		return s.r, s.retention, true
	}
	guard.BeginOutcome = func(v any, owner string) (any, error) { return parseBegin(v, owner) }
}

// Begin implements [Store].
func (s *RedisStore) Begin(ctx context.Context, key, owner string, lease time.Duration) (Outcome, error) {
	if err := checkArgs(key, owner); err != nil {
		return Outcome{}, err
	}
	if err := checkLease(lease); err != nil {
		return Outcome{}, err
	}
	v, err := s.r.Do(ctx, guard.RecordBegin(key, owner, lease))
	if err != nil {
		return Outcome{}, fmt.Errorf("idem: begin %q: %w", key, err)
	}
	o, err := parseBegin(v, owner)
	if err != nil {
		return Outcome{}, fmt.Errorf("idem: begin %q: %w", key, err)
	}
	return o, nil
}

// parseBegin returns the Outcome of a begin reply of the guard script for
// owner: 1 (started for owner), or the record as it is, {status, owner,
// payload}.
func parseBegin(v any, owner string) (Outcome, error) {
	if n, ok := v.(int64); ok && n == 1 {
		return Outcome{Status: StatusStarted, Owner: owner}, nil
	}
	f, err := guard.Strings(v, 3)
	if err != nil {
		return Outcome{}, err
	}
	o := Outcome{Owner: f[1]}
	switch f[0] {
	case "in_progress":
		o.Status = StatusInProgress
	case "completed":
		o.Status = StatusCompleted
		if f[2] != "" {
			o.Result = []byte(f[2])
		}
	case "failed":
		o.Status = StatusFailed
		o.Reason = f[2]
	default:
		return Outcome{}, fmt.Errorf("record has unknown status %q", f[0])
	}
	return o, nil
}

// Complete implements [Store].
func (s *RedisStore) Complete(ctx context.Context, key, owner string, result []byte) error {
	return s.finish(ctx, key, owner, "c", result)
}

// Fail implements [Store].
func (s *RedisStore) Fail(ctx context.Context, key, owner, reason string) error {
	return s.finish(ctx, key, owner, "f", []byte(reason))
}

var finishNames = map[string]string{"c": "completed", "f": "failed"}

func (s *RedisStore) finish(ctx context.Context, key, owner, status string, val []byte) error {
	if err := checkArgs(key, owner); err != nil {
		return err
	}
	v, err := s.r.Do(ctx, guard.RecordFinish(key, owner, status, val, s.retention))
	if err != nil {
		return fmt.Errorf("idem: %s %q: %w", finishNames[status], key, err)
	}
	if n, _ := guard.Int(v); n != 1 {
		return ErrNotOwner
	}
	return nil
}

// Release implements [Store].
func (s *RedisStore) Release(ctx context.Context, key, owner string) error {
	if err := checkArgs(key, owner); err != nil {
		return err
	}
	v, err := s.r.Do(ctx, guard.RecordRelease(key, owner))
	if err != nil {
		return fmt.Errorf("idem: release %q: %w", key, err)
	}
	if n, _ := guard.Int(v); n != 1 {
		return ErrNotOwner
	}
	return nil
}

// Forget implements [Store].
func (s *RedisStore) Forget(ctx context.Context, key string, status Status) (bool, error) {
	if err := checkForget(key, status); err != nil {
		return false, err
	}
	letter := "c"
	if status == StatusFailed {
		letter = "f"
	}
	v, err := s.r.Do(ctx, guard.RecordForget(key, letter))
	if err != nil {
		return false, fmt.Errorf("idem: forget %q: %w", key, err)
	}
	n, _ := guard.Int(v)
	return n == 1, nil
}
