package integration

// Attack 23 (batched settlement from a stale worker), in-process consumers
// on the shared Redis, one of them behind the TCP fault proxy. Written from
// README.md ("Settlement") and the consumer godoc only.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// attack23Runs records which consumer started which entry.
type attack23Runs struct {
	mu sync.Mutex
	by map[string][]string // entry ID -> consumers, in order
}

func (r *attack23Runs) add(entry, who string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string][]string{}
	}
	r.by[entry] = append(r.by[entry], who)
}

func (r *attack23Runs) count(who string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ws := range r.by {
		for _, w := range ws {
			if w == who {
				n++
			}
		}
	}
	return n
}

// TestAttack23StaleBatchSettlesNothing: consumer a (behind the proxy) runs
// 60 jobs at once. The proxy blackholes a's connections and then a's 60
// handlers return together: 20 done, 20 retry later, 20 dead, so batches
// of acks, retries and dead letters go into the partition. Consumer b
// takes all 60 over after the visibility timeout and holds them running
// while the partition heals, so whatever a sent reaches Redis while b owns
// every entry. The README: "A stale worker whose job was reclaimed can
// neither acknowledge nor settle it", batched retries and dead letters
// "each owner-checked on its own". So: no dead letter, nothing scheduled,
// b acks all 60 without a stale refusal, and the stream ends empty.
func TestAttack23StaleBatchSettlesNothing(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "vt", 2*time.Second, func(t *testing.T, vt time.Duration) time.Duration {
		const n = 60
		shared := redistest.Shared(t)
		name := redistest.Name(t)
		keys, err := stream.KeysFor(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shared.Del(context.Background(), keys.Stream); redistest.DeleteKeys(shared, "{"+name+"}:*") })
		px, err := faultproxy.Start(redistest.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		ids := attack23Enqueue(t, shared, name, "job", n)
		outcome := map[string]int{}
		for i, id := range ids {
			outcome[id] = i % 3
		}

		var runs attack23Runs
		releaseA, releaseB := make(chan struct{}), make(chan struct{})
		cfg := func(who string) consumer.Config {
			return consumer.Config{Stream: name, Group: "g", Consumer: who, Concurrency: n, Prefetch: -1,
				VisibilityTimeout: vt, SweepInterval: 100 * time.Millisecond, Block: 100 * time.Millisecond,
				IdleConsumerTimeout: -1, MaxCrashes: 10, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		}
		rdbA := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1})
		t.Cleanup(func() { rdbA.Close() })
		a := consumer.New(rdbA, cfg("a")).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.add(j.EntryID, "a")
			<-releaseA // ignores ctx: the handler finishes its work
			switch outcome[j.EntryID] {
			case 1:
				return consumer.Retry(10*time.Millisecond, errors.New("attack23 retry"))
			case 2:
				return consumer.Dead(consumer.ReasonPermanent, errors.New("attack23 dead"))
			}
			return nil
		}))
		b := consumer.New(shared, cfg("b")).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.add(j.EntryID, "b")
			<-releaseB
			return nil
		}))
		doneA, doneB := make(chan error, 1), make(chan error, 1)
		go func() { doneA <- a.Run(context.Background()) }()
		eventually(t, 60*time.Second, func() (bool, string) {
			c := runs.count("a")
			return c == n, fmt.Sprintf("a started %d of %d", c, n)
		})
		px.Blackhole()
		cutAt := time.Now()
		close(releaseA)
		go func() { doneB <- b.Run(context.Background()) }()
		eventually(t, 60*time.Second, func() (bool, string) {
			c := runs.count("b")
			return c == n, fmt.Sprintf("b started %d of %d", c, n)
		})
		px.Pass()
		healAt := time.Now()
		// Wait for a to be answered again: what it held in the partition
		// has reached Redis by then (forwarded at the heal, before its new
		// commands).
		eventually(t, 60*time.Second, func() (bool, string) {
			h := a.Health()
			return h.LastRead.After(healAt) && h.InFlight == 0, fmt.Sprintf("a: last read %v, in flight %d", h.LastRead, h.InFlight)
		})
		// b still owns every entry here: the late settlements met b's leases.
		p, err := shared.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: name, Group: "g", Start: "-", End: "+", Count: 1000}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ownedByB := 0
		for _, e := range p {
			if e.Consumer == "b" {
				ownedByB++
			}
		}
		close(releaseB)
		eventually(t, 60*time.Second, func() (bool, string) {
			st := b.Stats()
			return st.Acked+st.Stale >= n, fmt.Sprintf("b acked %d, stale %d", st.Acked, st.Stale)
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
		stA, stB := a.Stats(), b.Stats()
		t.Logf("partition %v; b owned %d of %d after the heal; a %+v; b %+v", healAt.Sub(cutAt), ownedByB, n, stA, stB)
		if ownedByB != n {
			t.Logf("precondition: b owned only %d of %d entries when a's settlements arrived", ownedByB, n)
			return 2 * vt
		}
		if stB.Acked != n || stB.Stale != 0 {
			t.Errorf("b acked %d (want %d), stale %d (want 0): a settled entries b owned", stB.Acked, n, stB.Stale)
		}
		if stA.Acked != 0 || stA.Retried != 0 || stA.DeadLettered != 0 {
			t.Errorf("a acked %d, retried %d, dead-lettered %d: want nothing, every entry was b's", stA.Acked, stA.Retried, stA.DeadLettered)
		}
		if d, _ := shared.XLen(context.Background(), keys.Dead).Result(); d != 0 {
			t.Errorf("%d dead letters: a stale batch dead-lettered", d)
		}
		if z, _ := shared.ZCard(context.Background(), keys.Delayed).Result(); z != 0 {
			t.Errorf("%d delayed jobs: a stale batch scheduled retries", z)
		}
		eventually(t, 30*time.Second, func() (bool, string) {
			l, _ := shared.XLen(context.Background(), name).Result()
			pn, _ := shared.XPending(context.Background(), name, "g").Result()
			return l == 0 && pn != nil && pn.Count == 0, fmt.Sprintf("XLEN %d, pending %v: a stale retry added an entry?", l, pn)
		})
		for id, ws := range runs.by {
			if len(ws) != 2 || ws[0] != "a" || ws[1] != "b" {
				t.Errorf("entry %s started by %v, want a then b", id, ws)
			}
		}
		return 0
	})
}
