package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// fill enqueues n jobs to stream s, each with payload "<s>/<i>".
func fill(t *testing.T, rdb redis.UniversalClient, s string, n int) {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	for i := 0; i < n; i += 500 {
		var jobs []*stream.Job
		for j := i; j < min(n, i+500); j++ {
			jobs = append(jobs, &stream.Job{Type: "t", Payload: fmt.Appendf(nil, "%s/%d", s, j)})
		}
		if _, err := p.EnqueueBatch(context.Background(), jobs); err != nil {
			t.Fatalf("EnqueueBatch: %v", err)
		}
	}
}

// TestPool_weightedRatio: three backlogged streams with weights 6/3/1
// start jobs 60/30/10 (each within 10% of its share) over 3,000 starts, and
// every job runs once. The ratio holds only while every queue has a job
// waiting at each start (reads keep up); the budget counts the starts for
// which that held, and a run in which it did not for most of them (a
// stalled machine) is repeated with longer jobs.
func TestPool_weightedRatio(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	weights := []int{6, 3, 1}
	// The first starts, while the queues start reading one after the other,
	// are not counted; the backlogs outlast the 3,000 counted ones.
	const warmup, starts = 200, 3000
	backlog := []int{2400, 1300, 600}
	runs := []time.Duration{2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond}
	for attempt, run := range runs {
		prefix := "{" + redistest.Prefix(t, rdb) + "}"
		p := NewPool(rdb, PoolConfig{Concurrency: 10, Logger: slog.New(slog.DiscardHandler)})
		var seq atomic.Int64
		counts := make([]atomic.Int64, len(weights)) // starts among the first 3,000
		var mu sync.Mutex
		ran := map[string]int{}
		// Each queue's starts made while every queue waited, at the first
		// and the last counted start.
		var contended [2][]uint64
		contention := func() []uint64 {
			p.budget.mu.Lock()
			defer p.budget.mu.Unlock()
			var c []uint64
			for _, s := range p.budget.shares {
				c = append(c, s.contention)
			}
			return c
		}
		var queues []*Queue
		for i, w := range weights {
			s := fmt.Sprintf("%s:q%d", prefix, i)
			fill(t, rdb, s, backlog[i])
			// A Prefetch large enough that reads keep every queue waiting.
			q := p.Add(Config{Stream: s, Group: "g", Consumer: "c", Block: 50 * time.Millisecond, Prefetch: 100},
				QueueOptions{Weight: w})
			q.Handle(HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				n := seq.Add(1)
				if warmup < n && n <= warmup+starts {
					counts[i].Add(1)
				}
				switch n {
				case warmup + 1:
					contended[0] = contention()
				case warmup + starts:
					contended[1] = contention()
				}
				time.Sleep(run)
				mu.Lock()
				ran[string(job.Payload)]++
				mu.Unlock()
				return nil
			}))
			queues = append(queues, q)
		}
		total := 0
		for _, b := range backlog {
			total += b
		}
		done := make(chan error, 1)
		go func() { done <- p.Run(context.Background()) }()
		deadline := time.Now().Add(60 * time.Second)
		for {
			var acked uint64
			for _, q := range queues {
				acked += q.Stats().Acked
			}
			if acked >= uint64(total) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d jobs acknowledged within 60s", acked, total)
			}
			time.Sleep(20 * time.Millisecond)
		}
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := p.Shutdown(sctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		// Nothing lost, nothing doubled.
		if len(ran) != total {
			t.Fatalf("%d distinct jobs ran, want %d", len(ran), total)
		}
		for k, n := range ran {
			if n != 1 {
				t.Fatalf("job %s ran %d times", k, n)
			}
		}
		for _, q := range queues {
			if n, _ := rdb.XLen(context.Background(), q.Stream()).Result(); n != 0 {
				t.Errorf("stream %s still holds %d entries", q.Stream(), n)
			}
		}
		got := []int64{counts[0].Load(), counts[1].Load(), counts[2].Load()}
		var waited []int64 // per queue, the counted starts made while every queue waited
		var all int64
		for i := range weights {
			waited = append(waited, int64(contended[1][i]-contended[0][i]))
			all += waited[i]
		}
		t.Logf("job run %v: starts %v of %d; %v (%d) of them while every queue waited", run, got, starts, waited, all)
		check := func(what string, got []int64, of int64) {
			for i, w := range weights {
				want := float64(of) * float64(w) / 10
				if d := float64(got[i]) - want; d < -want/10 || d > want/10 {
					t.Errorf("queue of weight %d: %d of %d %s, want %.0f ± 10%%", w, got[i], of, what, want)
				}
			}
		}
		if all < starts*99/100 {
			if attempt < len(runs)-1 {
				t.Logf("reads did not keep every queue waiting (%d of %d starts); again with longer jobs", all, starts)
				continue
			}
			// The machine is too loaded for reads to keep up: check the
			// starts made while every queue waited, which is what the
			// weights promise.
			t.Logf("reads did not keep every queue waiting even with %v jobs; checking the %d starts made while all waited", run, all)
			check("starts made while every queue waited", waited, all)
			return
		}
		check(fmt.Sprintf("the first %d starts", starts), got, starts)
		return
	}
}
