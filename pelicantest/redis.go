package pelicantest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// EnvRedis is the environment variable that points [NewRedis] at a real
// Redis: a redis:// or rediss:// URL, such as redis://127.0.0.1:6379/0.
// Unset or empty: an embedded miniredis.
const EnvRedis = "PELICAN_TEST_REDIS"

// TB is the part of testing.TB that this package uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Redis is a Redis for one test (or one program, with [Open]).
type Redis struct {
	// Client is connected to the server.
	Client redis.UniversalClient
	// Where says where Client points, without a password: "embedded
	// (miniredis)" or the server's address.
	Where string

	mini *miniredis.Miniredis
	ns   string // "" embedded; "{pt-<hex>}:" on a shared server

	mu    sync.Mutex
	names map[string]bool // what Name returned, on a real server
}

// NewRedis returns a Redis for the test t: the server at $PELICAN_TEST_REDIS
// when it is set, or a new embedded miniredis, started with keys expiring
// by the wall clock as on Redis. On a real server the test's keys live
// under a namespace of its own (name them with [Redis.Name]); NewRedis
// never flushes a database. At the end of the test the client is closed,
// the embedded server stopped, and on a real server every key under the
// namespace deleted.
func NewRedis(t TB) *Redis {
	t.Helper()
	r, err := Open(os.Getenv(EnvRedis))
	if err != nil {
		t.Fatalf("pelicantest: %s: %v", EnvRedis, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// Open is [NewRedis] for a program that is not a test (an example, a
// demo): the server at url, or an embedded miniredis when url is "". Close
// it when done.
func Open(url string) (*Redis, error) {
	if url == "" {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			return nil, err
		}
		return &Redis{
			Client: redis.NewClient(&redis.Options{Addr: m.Addr()}),
			Where:  "embedded (in-memory miniredis; nothing is kept after exit)",
			mini:   m,
		}, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		// The URL may hold a password: never quote it.
		return nil, fmt.Errorf("not a Redis URL (redis://host:port/db): %v", redactedParseError(err))
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("Redis at %s: %w", opt.Addr, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Redis{Client: c, Where: opt.Addr, ns: "{pt-" + hex.EncodeToString(b[:]) + "}:"}, nil
}

// redactedParseError keeps go-redis's reason but not the URL it may quote.
func redactedParseError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "://"); i >= 0 {
		return "invalid URL"
	}
	return msg
}

// Embedded reports whether r is an embedded miniredis.
func (r *Redis) Embedded() bool { return r.mini != nil }

// Name returns the key to use for name in this Redis: name itself on an
// embedded server, which the test has to itself, and name under the test's
// namespace on a real one ("{pt-1a2b3c4d5e6f}:orders" for "orders"), so that
// the queue's derived keys (dead letters, delayed jobs, the middleware's
// locks and records, see stream.KeysFor) share the namespace too and tests
// running at once never meet. Middleware given an explicit Prefix keep
// their keys outside it; name those with Name too.
//
// On a real server, Run, Advance and the listing of what a handler
// enqueued see the queues named with Name only (a SCAN of a large shared
// database for each would be slow); the cleanup deletes every key of the
// namespace.
func (r *Redis) Name(name string) string {
	if r.ns == "" {
		return name
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names == nil {
		r.names = map[string]bool{}
	}
	r.names[r.ns+name] = true
	return r.ns + name
}

// Close closes the client and stops an embedded server; on a real server
// it first deletes every key under the namespace.
func (r *Redis) Close() error {
	if r.mini != nil {
		err := r.Client.Close()
		r.mini.Close()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := r.keys(ctx)
	for len(keys) > 0 && err == nil {
		n := min(len(keys), 500)
		err = r.Client.Del(ctx, keys[:n]...).Err()
		keys = keys[n:]
	}
	if cerr := r.Client.Close(); err == nil {
		err = cerr
	}
	return err
}

// keys returns every key of this test: all of an embedded server's, the
// namespace's on a real one.
func (r *Redis) keys(ctx context.Context) ([]string, error) {
	pattern := "*"
	if r.ns != "" {
		pattern = r.ns + "*" // braces are not special in a SCAN pattern
	}
	var out []string
	var cursor uint64
	for {
		keys, next, err := r.Client.Scan(ctx, cursor, pattern, 10000).Result()
		if err != nil {
			return nil, err
		}
		out = append(out, keys...)
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// queueKeys returns the test's streams and delayed sets that exist, with
// their types: every one of an embedded server; on a real one, those of the
// queues named with Name.
func (r *Redis) queueKeys(ctx context.Context) (map[string]string, error) {
	var keys []string
	if r.ns == "" {
		var err error
		if keys, err = r.keys(ctx); err != nil {
			return nil, err
		}
	} else {
		r.mu.Lock()
		for n := range r.names {
			keys = append(keys, n)
			if k, err := stream.KeysFor(n); err == nil {
				keys = append(keys, k.Dead, k.Delayed)
			}
		}
		r.mu.Unlock()
	}
	out := make(map[string]string)
	for _, k := range keys {
		typ, err := r.Client.Type(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		if typ == "stream" || (typ == "zset" && isDelayedSet(k)) {
			out[k] = typ
		}
	}
	return out, nil
}
