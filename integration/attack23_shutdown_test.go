package integration

// Attack 23 (shutdown with a large prefetched queue), in-process consumers
// on the shared Redis, written from README.md and the consumer godoc only.

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

// TestAttack23ShutdownGivesLargeQueueBack: consumer a (Concurrency 4,
// default Prefetch, a 30 s visibility timeout) runs 2,000 jobs that do
// nothing and then holds a burst of 150 jobs that block on their context:
// 4 running, the rest queued. a is shut down with a 300 ms drain deadline.
// The README: "jobs read but not started are given back as soon as reading
// stops", jobs that did not finish are "given back so that the next sweep of
// any consumer takes them at once", and "a job given back at shutdown is not
// a suspect". So: a starts none of the queued jobs during its shutdown;
// consumer b, started after a's Run returned, runs every blocking job
// exactly once, well before the 30 s lease of what a held could have ended,
// and runs none as a suspect; nothing is pending at the end.
func TestAttack23ShutdownGivesLargeQueueBack(t *testing.T) {
	t.Parallel()
	const fast, blocking, conc = 2000, 150, 4
	const vt = 30 * time.Second
	shared := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(shared, name+"*"); redistest.DeleteKeys(shared, "{"+name+"}:*") })
	ids := attack23Enqueue(t, shared, name, "fast", fast)
	blockIDs := attack23Enqueue(t, shared, name, "block", blocking)
	ids = append(ids, blockIDs...)

	var runs attack23Runs
	var blockedOnA atomic.Int32
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := consumer.New(shared, consumer.Config{Stream: name, Group: "g", Consumer: "a", Concurrency: conc,
		VisibilityTimeout: vt, Block: 100 * time.Millisecond, IdleConsumerTimeout: -1, Logger: quiet}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.add(j.EntryID, "a")
			if j.Type == "block" {
				blockedOnA.Add(1)
				<-ctx.Done()
				return context.Cause(ctx)
			}
			return nil
		}))
	doneA := make(chan error, 1)
	go func() { doneA <- a.Run(context.Background()) }()
	eventually(t, 120*time.Second, func() (bool, string) {
		n := blockedOnA.Load()
		return n == conc, fmt.Sprintf("%d of %d workers blocked on a", n, conc)
	})
	held := 0
	p, err := shared.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: name, Group: "g",
		Start: blockIDs[0], End: blockIDs[len(blockIDs)-1], Count: 1000, Consumer: "a"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	held = len(p)
	sctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_ = a.Shutdown(sctx) // the running jobs are cancelled at the deadline
	cancel()
	if err := <-doneA; err != nil {
		t.Logf("a's Run: %v", err)
	}
	aStarts := runs.count("a")
	stoppedAt := time.Now()

	b := consumer.New(shared, consumer.Config{Stream: name, Group: "g", Consumer: "b", Concurrency: 50,
		VisibilityTimeout: vt, SweepInterval: 100 * time.Millisecond, Block: 100 * time.Millisecond,
		IdleConsumerTimeout: -1, Logger: quiet}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			runs.add(j.EntryID, "b")
			return nil
		}))
	doneB := make(chan error, 1)
	go func() { doneB <- b.Run(context.Background()) }()
	eventually(t, vt/2, func() (bool, string) {
		pn, err := shared.XPending(context.Background(), name, "g").Result()
		if err != nil {
			return false, err.Error()
		}
		st := b.Stats()
		return pn.Count == 0 && int(st.Acked) == blocking, fmt.Sprintf("pending %d, b acked %d of %d (given back, or waiting for a's leases?)", pn.Count, st.Acked, blocking)
	})
	tookOver := time.Since(stoppedAt)
	sctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Shutdown(sctx); err != nil {
		t.Errorf("b Shutdown: %v", err)
	}
	<-doneB
	stA, stB := a.Stats(), b.Stats()
	t.Logf("a held %d blocking jobs (%d running) at the shutdown; b ran them all %v after a stopped; a %+v; b %+v", held, conc, tookOver, stA, stB)
	if aStarts != fast+conc {
		t.Errorf("a started %d jobs, want %d (the fast ones and the %d running): it started queued jobs during shutdown", aStarts, fast+conc, conc)
	}
	if stB.Suspects != 0 {
		t.Errorf("b ran %d jobs as suspects: given back at shutdown, they are not", stB.Suspects)
	}
	runs.mu.Lock()
	defer runs.mu.Unlock()
	for _, id := range ids[:fast] {
		if ws := runs.by[id]; fmt.Sprint(ws) != "[a]" {
			t.Errorf("fast entry %s started by %v, want [a]", id, ws)
		}
	}
	both := 0
	for _, id := range blockIDs {
		switch ws := runs.by[id]; fmt.Sprint(ws) {
		case "[b]":
		case "[a b]":
			both++
		default:
			t.Errorf("blocking entry %s started by %v, want [b], or [a b] for one running on a", id, ws)
		}
	}
	if both != conc {
		t.Errorf("%d blocking entries ran on a and then b, want the %d running at the shutdown", both, conc)
	}
}
