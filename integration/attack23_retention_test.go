package integration

// Attack 23 (settlement trims), in-process consumer on the shared Redis,
// written from README.md ("Settlement", "Retention") only.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// attack23ID parses a stream entry ID "ms-seq".
func attack23ID(t *testing.T, id string) [2]uint64 {
	t.Helper()
	var ms, seq uint64
	if _, err := fmt.Sscanf(id, "%d-%d", &ms, &seq); err != nil {
		t.Fatalf("entry ID %q: %v", id, err)
	}
	return [2]uint64{ms, seq}
}

// attack23Settled returns how many entries of the stream are settled but
// still there: XLEN less those pending and those not yet read (those of
// ids after the group's last-delivered ID; XINFO's lag is unknown once
// entries were deleted).
func attack23Settled(t *testing.T, s *scenario, ids []string) (settled, length, pending, unread int64) {
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
	pending = groups[0].Pending
	last := attack23ID(t, groups[0].LastDeliveredID)
	i := sort.Search(len(ids), func(i int) bool {
		id := attack23ID(t, ids[i])
		return id[0] > last[0] || id[0] == last[0] && id[1] > last[1]
	})
	unread = int64(len(ids) - i)
	return length - pending - unread, length, pending, unread
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
	ids := attack23Enqueue(t, s.rdb, s.stream, "fast", fast)
	// While they run, trims also lag by up to 100 ms' worth of settlements
	// (a machine-speed figure): the bound only says "not every entry".
	const bound = 2000
	maxSettled, maxPending := int64(0), int64(0)
	for {
		settled, length, pending, unread := attack23Settled(t, s, ids)
		maxSettled, maxPending = max(maxSettled, settled), max(maxPending, pending)
		if settled > bound {
			t.Errorf("%d settled entries left in the stream (XLEN %d, pending %d, unread %d), over %d", settled, length, pending, unread, bound)
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
		settled, length, pending, unread := attack23Settled(t, s, ids)
		return settled <= 1100, fmt.Sprintf("%d settled entries left beside the long job (XLEN %d, pending %d, unread %d)", settled, length, pending, unread)
	})
	settled, length, _, _ := attack23Settled(t, s, ids)
	t.Logf("settled entries left: at most %d while running, %d at rest beside the long job (XLEN %d); pending at most %d", maxSettled, settled, length, maxPending)
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
