package integration

// Attack 23 (settlement batches flush beside long jobs), in-process
// consumer on the shared Redis, written from README.md ("Settlement") and
// the consumer godoc only.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// TestAttack23BatchesFlushBesideLongJobs: a consumer (Concurrency 12) runs
// long jobs that block until released, and beside them three short jobs:
// one done, one retried later (in an hour), one dead-lettered. The README:
// finished jobs "are acknowledged in batches that wait up to 1 ms while they
// hold under half of the jobs in flight", and retries and dead letters are
// batched too. A batch must not wait for the long jobs: while they still
// run, the short job is acknowledged, the retry is in the delayed set and
// the dead letter in the dead-letter stream. With 1 long job the finished
// ones are half or more of those in flight; with 9 they are under half.
func TestAttack23BatchesFlushBesideLongJobs(t *testing.T) {
	t.Parallel()
	for _, long := range []int{1, 9} {
		t.Run(fmt.Sprintf("long=%d", long), func(t *testing.T) {
			t.Parallel()
			s := crashScenario(t)
			ctx := context.Background()
			release := make(chan struct{})
			var longRunning atomic.Int32
			c := consumer.New(s.rdb, consumer.Config{Stream: s.stream, Group: "g", Consumer: "a", Concurrency: 12,
				Block: 100 * time.Millisecond, IdleConsumerTimeout: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
				Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
					switch j.Type {
					case "long":
						longRunning.Add(1)
						defer longRunning.Add(-1)
						select {
						case <-release:
						case <-ctx.Done():
							return context.Cause(ctx)
						}
					case "retry":
						return consumer.Retry(time.Hour, errors.New("attack23 later"))
					case "dead":
						return consumer.Dead(consumer.ReasonPermanent, errors.New("attack23 dead"))
					}
					return nil
				}))
			attack23Enqueue(t, s.rdb, s.stream, "long", long)
			done := make(chan error, 1)
			go func() { done <- c.Run(context.Background()) }()
			eventually(t, 60*time.Second, func() (bool, string) {
				n := longRunning.Load()
				return int(n) == long, fmt.Sprintf("%d of %d long jobs running", n, long)
			})
			attack23Enqueue(t, s.rdb, s.stream, "ack", 1)
			attack23Enqueue(t, s.rdb, s.stream, "retry", 1)
			attack23Enqueue(t, s.rdb, s.stream, "dead", 1)
			eventually(t, 30*time.Second, func() (bool, string) {
				pend := s.pending("g")
				delayed, _ := s.rdb.ZCard(ctx, s.keys.Delayed).Result()
				dead := len(s.dead())
				st := c.Stats()
				return pend == int64(long) && delayed == 1 && dead == 1 && st.Acked == 1,
					fmt.Sprintf("pending %d (want the %d long), delayed %d, dead %d, acked %d: a batch waits for the long jobs", pend, long, delayed, dead, st.Acked)
			})
			if n := longRunning.Load(); int(n) != long {
				t.Errorf("%d long jobs still running, want %d", n, long)
			}
			close(release)
			eventually(t, 30*time.Second, func() (bool, string) {
				st := c.Stats()
				return st.Acked == uint64(1+long) && s.pending("g") == 0, fmt.Sprintf("acked %d, pending %d", st.Acked, s.pending("g"))
			})
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := c.Shutdown(sctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			<-done
			if st := c.Stats(); st.Retried != 1 || st.DeadLettered != 1 {
				t.Errorf("stats %+v: want 1 retried, 1 dead-lettered", st)
			}
		})
	}
}
