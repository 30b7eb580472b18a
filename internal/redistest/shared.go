package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultAddr is the shared test Redis address used when REDIS_ADDR is
// unset or empty.
const defaultAddr = "127.0.0.1:6379"

// maxNameLen bounds the test-name part of Name.
const maxNameLen = 64

// Addr returns the address of the shared test Redis: the environment
// variable REDIS_ADDR, or "127.0.0.1:6379" if it is unset or
// empty.
func Addr() string {
	return addrFrom(os.Getenv)
}

func addrFrom(getenv func(string) string) string {
	if a := getenv("REDIS_ADDR"); a != "" {
		return a
	}
	return defaultAddr
}

// Shared returns a new go-redis client to the shared test Redis at Addr(),
// closed by t.Cleanup. It fails the test, naming REDIS_ADDR, if the server
// does not answer PING within 5 s. Tests on the shared server must keep to
// their own keys (see Name) and never FLUSHDB.
func Shared(t testing.TB) *redis.Client {
	t.Helper()
	return shared(t, Addr())
}

func shared(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redistest: shared Redis at %s is unreachable (set REDIS_ADDR to the address of a test Redis; default %s): %v",
			addr, defaultAddr, err)
	}
	return c
}

// Name returns a name unique to this call, for use as a key prefix or
// stream name: "t:" + the test's name (characters other than letters,
// digits, '_', '-', '.' and '/' replaced by '_', at most 64 of them) + ":" +
// 8 random hex digits. It never contains '{' or '}', so "{" + Name(t) + "}"
// is a hash tag covering the whole name.
func Name(t testing.TB) string {
	t.Helper()
	name := strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9',
			r == '_', r == '-', r == '.', r == '/':
			return r
		default:
			return '_'
		}
	}, t.Name())
	if len(name) > maxNameLen {
		name = name[:maxNameLen]
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return "t:" + name + ":" + hex.EncodeToString(b[:])
}

// Prefix returns a key prefix of t's own ([Name] followed by ":") and
// deletes every key under it on rdb when t ends.
func Prefix(t testing.TB, rdb redis.UniversalClient) string {
	t.Helper()
	prefix := Name(t) + ":"
	t.Cleanup(func() { DeleteKeys(rdb, prefix+"*") })
	return prefix
}

// DeleteKeys deletes the keys matching pattern, found with SCAN.
func DeleteKeys(rdb redis.UniversalClient, pattern string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}
