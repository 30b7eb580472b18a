// Package embedded gives the examples their Redis: the server at $REDIS_URL
// when it is set, otherwise an in-process miniredis, Pelican's embedded
// default for development and demos (nothing survives the process).
package embedded

import (
	"context"
	"fmt"
	"os"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Connect returns a client for $REDIS_URL, checked with PING, or for a new
// embedded miniredis started with ClockTTL(true) (keys expire by the wall
// clock, as on Redis) when REDIS_URL is unset. It also returns a description
// of where the client points and a function that closes both.
func Connect() (rdb redis.UniversalClient, where string, stop func(), err error) {
	if url := os.Getenv("REDIS_URL"); url != "" {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, "", nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		c := redis.NewClient(opt)
		if err := c.Ping(context.Background()).Err(); err != nil {
			c.Close()
			return nil, "", nil, fmt.Errorf("REDIS_URL %s: %w", opt.Addr, err)
		}
		return c, opt.Addr, func() { c.Close() }, nil
	}
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		return nil, "", nil, err
	}
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return c, "embedded (in-memory miniredis; nothing is kept after exit)", func() { c.Close(); m.Close() }, nil
}
