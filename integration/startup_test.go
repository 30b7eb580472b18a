package integration

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// F28: a Redis that may evict keys is reported when the consumer starts;
// one with noeviction is not.
func TestStartup_evictionPolicyWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy string
		warn   bool
	}{{"allkeys-lru", true}, {"noeviction", false}} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory-policy", tc.policy}})
			rdb := srv.Client(t)
			var logs syncBuffer
			c := consumer.New(rdb, consumer.Config{
				Stream: "evict", Group: "g", Block: 50 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() { errc <- c.Run(ctx) }()
			// The consumer shows up in the group at its first read, which
			// comes after the start-up checks.
			eventually(t, 5*time.Second, func() (bool, string) {
				cs, _ := rdb.XInfoConsumers(t.Context(), "evict", "g").Result()
				return len(cs) == 1, "the consumer did not start reading"
			})
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(logs.String(), "maxmemory-policy is not noeviction"); got != tc.warn {
				t.Errorf("warning logged = %v, want %v; logs:\n%s", got, tc.warn, logs.String())
			}
		})
	}
}
