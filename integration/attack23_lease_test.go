package integration

// Attack 23 (queued leases in a large batch), in-process consumers on the
// shared Redis, written from README.md and the consumer godoc only.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// TestAttack23QueuedLeasesKeptLargeBatch: consumer a (Concurrency 4,
// default Prefetch, visibility timeout vt) runs 2,000 jobs that do nothing
// and then holds a burst of 100 jobs of vt/3 each: most wait queued for
// several visibility timeouts. Consumer b of the same group starts then
// (it reads whatever a did not). The README: "the heartbeat extends its
// lease", so b takes none of a's over: every job runs exactly once, those a
// held on a, and a loses no lease. A run in
// which a's process or Redis stalled for half of vt checks nothing and is
// repeated wider.
func TestAttack23QueuedLeasesKeptLargeBatch(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "vt", time.Second, func(t *testing.T, vt time.Duration) time.Duration {
		const fast, slow, conc = 2000, 100, 4
		shared := redistest.Shared(t)
		name := redistest.Name(t)
		t.Cleanup(func() { redistest.DeleteKeys(shared, name+"*"); redistest.DeleteKeys(shared, "{"+name+"}:*") })
		ids := attack23Enqueue(t, shared, name, "fast", fast)
		slowIDs := attack23Enqueue(t, shared, name, "slow", slow)
		ids = append(ids, slowIDs...)

		var runs attack23Runs
		var slowStarted atomic.Int32
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg := func(who string, c int) consumer.Config {
			return consumer.Config{Stream: name, Group: "g", Consumer: who, Concurrency: c,
				VisibilityTimeout: vt, SweepInterval: 100 * time.Millisecond, Block: 100 * time.Millisecond,
				IdleConsumerTimeout: -1, Logger: quiet}
		}
		handler := func(who string) consumer.HandlerFunc {
			return func(ctx context.Context, j *stream.Job) error {
				runs.add(j.EntryID, who)
				if j.Type == "slow" {
					slowStarted.Add(1)
					select {
					case <-time.After(vt / 3):
					case <-ctx.Done():
						return context.Cause(ctx)
					}
				}
				return nil
			}
		}
		rdbA := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
		t.Cleanup(func() { rdbA.Close() })
		stalls := redistest.WatchStalls(rdbA, 2*redistest.StallInterval)
		a := consumer.New(rdbA, cfg("a", conc)).Handle(handler("a"))
		doneA := make(chan error, 1)
		go func() { doneA <- a.Run(context.Background()) }()
		eventually(t, 120*time.Second, func() (bool, string) {
			n := slowStarted.Load()
			return n >= conc, fmt.Sprintf("%d slow jobs started", n)
		})
		p, err := shared.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: name, Group: "g",
			Start: slowIDs[0], End: slowIDs[len(slowIDs)-1], Count: 1000, Consumer: "a"}).Result()
		if err != nil {
			t.Fatal(err)
		}
		held := len(p)
		heldByA := map[string]bool{}
		for _, e := range p {
			heldByA[e.ID] = true
		}
		b := consumer.New(shared, cfg("b", 50)).Handle(handler("b"))
		doneB := make(chan error, 1)
		go func() { doneB <- b.Run(context.Background()) }()
		eventually(t, 5*time.Minute, func() (bool, string) {
			pn, err := shared.XPending(context.Background(), name, "g").Result()
			if err != nil {
				return false, err.Error()
			}
			st := a.Stats().Acked + b.Stats().Acked
			return pn.Count == 0 && st >= fast+slow, fmt.Sprintf("pending %d, acked %d", pn.Count, st)
		})
		for _, c := range []*consumer.Consumer{a, b} {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := c.Shutdown(sctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			cancel()
		}
		<-doneA
		<-doneB
		stalls.Stop()
		stA, stB := a.Stats(), b.Stats()
		t.Logf("a held %d slow jobs when they began (%d running); longest stall %v; a %+v; b %+v", held, conc, stalls.Longest(), stA, stB)
		if stalls.Longest() >= vt/2 {
			t.Logf("a's process or Redis stalled %v: its leases may have ended; nothing checked", stalls.Longest())
			return 2 * vt
		}
		if held <= 3*conc {
			t.Logf("precondition: a held only %d slow jobs; queued ones did not wait several leases", held)
		}
		if stA.LeaseLost != 0 || stB.Reclaimed != 0 {
			t.Errorf("a lost %d leases, b reclaimed %d: queued leases were not kept", stA.LeaseLost, stB.Reclaimed)
		}
		runs.mu.Lock()
		defer runs.mu.Unlock()
		for i, id := range ids {
			ws := runs.by[id]
			if len(ws) != 1 || (heldByA[id] || i < fast) && ws[0] != "a" {
				t.Errorf("entry %s (held by a: %v) started by %v, want once, on a if a held it", id, heldByA[id], ws)
			}
		}
		return 0
	})
}
