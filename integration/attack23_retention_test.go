package integration

// Attack 23 (settlement trims), in-process consumer on the shared Redis,
// written from README.md ("Settlement", "Retention") only.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// attack23Settled returns how many entries of the stream are settled but
// still there: XLEN less those pending and those not yet read (lag).
func attack23Settled(t *testing.T, s *scenario) (settled, length, pending, lag int64) {
	t.Helper()
	ctx := context.Background()
	length, err := s.rdb.XLen(ctx, s.stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	groups, err := s.rdb.XInfoGroups(ctx, s.stream).Result()
	if err != nil || len(groups) != 1 {
		t.Fatalf("XINFO GROUPS: %v %v", groups, err)
	}
	pending, lag = groups[0].Pending, groups[0].Lag
	return length - pending - lag, length, pending, lag
}

// TestAttack23RetentionBesideLongJob: a consumer (Concurrency 4) runs one
// job that blocks until released, and 5,000 jobs that do nothing enqueued
// after it. The README: settled entries are deleted "every 100 a consumer
// settles, when the last job in flight settles, or 100 ms after the first of
// fewer", and "a job running for hours holds its own entry and at most about
// 1,000 settled ones after it, not every entry after it". Sampled while the
// short jobs run, and once they are all done with the long job still
// running, the settled entries left in the stream stay under 2,000 while
// they run (about 1,000 plus 100 ms' worth, well short of all 5,000) and at
// most 1,100 at rest; after the release the stream is empty. (Seen red with
// Config.KeepSettled set: 2,604 settled entries left while running,
// 5,000 at rest.)
func TestAttack23RetentionBesideLongJob(t *testing.T) {
	t.Parallel()
	const fast = 5000
	s := crashScenario(t)
	ctx := context.Background()
	release := make(chan struct{})
	c := consumer.New(s.rdb, consumer.Config{Stream: s.stream, Group: "g", Consumer: "a", Concurrency: 4,
		Block: 100 * time.Millisecond, IdleConsumerTimeout: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			if j.Type == "long" {
				select {
				case <-release:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			return nil
		}))
	attack23Enqueue(t, s.rdb, s.stream, "long", 1)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	eventually(t, 60*time.Second, func() (bool, string) {
		n := s.pending("g")
		return n == 1, fmt.Sprintf("pending %d, want the long job", n)
	})
	attack23Enqueue(t, s.rdb, s.stream, "fast", fast)
	// While they run, trims also lag by up to 100 ms' worth of settlements
	// (a machine-speed figure): the bound only says "not every entry".
	const bound = 2000
	maxSettled := int64(0)
	for {
		settled, length, pending, lag := attack23Settled(t, s)
		maxSettled = max(maxSettled, settled)
		if settled > bound {
			t.Errorf("%d settled entries left in the stream (XLEN %d, pending %d, lag %d), over %d", settled, length, pending, lag, bound)
			break
		}
		if c.Stats().Acked == fast {
			break
		}
		time.Sleep(5 * time.Millisecond) // sampling step
	}
	// All short jobs done, the long one running: within the 100 ms trim
	// period (polled, with room for a loaded machine) the settled entries
	// left are at most about 1,000.
	eventually(t, 10*time.Second, func() (bool, string) {
		settled, length, pending, lag := attack23Settled(t, s)
		return settled <= 1100, fmt.Sprintf("%d settled entries left beside the long job (XLEN %d, pending %d, lag %d)", settled, length, pending, lag)
	})
	settled, length, _, _ := attack23Settled(t, s)
	t.Logf("settled entries left: at most %d while running, %d at rest beside the long job (XLEN %d)", maxSettled, settled, length)
	close(release)
	eventually(t, 10*time.Second, func() (bool, string) {
		l, _ := s.rdb.XLen(ctx, s.stream).Result()
		return l == 0, fmt.Sprintf("XLEN %d after the long job settled, want 0", l)
	})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	<-done
}
