package consumer

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// The lease deadlines, without Redis: the watcher's bookkeeping on tasks
// whose renewal times the test chooses.

// leaseSetup returns a consumer with a 10 s visibility timeout (leases of
// 9 s) that has not started, ready for tasks added with addTask.
func leaseSetup(t *testing.T) *Consumer {
	t.Helper()
	c := New(nil, Config{Stream: "s", Group: "g", VisibilityTimeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	r, err := c.cfg.resolve()
	if err != nil {
		t.Fatal(err)
	}
	c.r, c.base, c.inflight, c.leases = r, context.Background(), make(map[string]*task), newLeases(r.Logger)
	return c
}

// addTask adds a running task last renewed at renewed and returns it with
// its context.
func addTask(c *Consumer, id string, renewed time.Time) (*task, context.Context) {
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &task{id: id, cancel: cancel, lease: lease{renewed: renewed}}
	c.mu.Lock()
	c.inflight[id] = t
	c.trackLease(t)
	c.mu.Unlock()
	return t, ctx
}

func TestLease_expireLeases(t *testing.T) {
	t.Parallel()
	c := leaseSetup(t)
	now := time.Now()
	const lease = 9 * time.Second // VisibilityTimeout less a tenth
	if got := c.expireLeases(now); !got.Equal(now.Add(lease)) {
		t.Errorf("with no task, the watcher wakes at now+%v, want now+%v: no lease can end before", got.Sub(now), lease)
	}
	_, ended := addTask(c, "ended", now.Add(-lease))
	_, live := addTask(c, "live", now.Add(-lease+time.Millisecond))
	_, later := addTask(c, "later", now.Add(-time.Second))
	fin, finished := addTask(c, "finished", now.Add(-time.Hour))
	fin.finished = true // settling: the handler has returned
	orph, orphaned := addTask(c, "orphaned", now.Add(-time.Hour))
	orph.orphaned = true // deleted from the stream: nobody else can run it

	next := c.expireLeases(now)
	if !errors.Is(context.Cause(ended), ErrLeaseLost) || !errors.Is(context.Cause(ended), errLeaseExpired) {
		t.Errorf("a lease renewed %v ago: cause %v, want errLeaseExpired (ErrLeaseLost)", lease, context.Cause(ended))
	}
	for name, ctx := range map[string]context.Context{"live": live, "later": later, "finished": finished, "orphaned": orphaned} {
		if ctx.Err() != nil {
			t.Errorf("task %s was cancelled (%v)", name, context.Cause(ctx))
		}
	}
	if want := now.Add(time.Millisecond); !next.Equal(want) {
		t.Errorf("the watcher wakes %v after now, want %v: when the earliest live lease ends", next.Sub(now), want.Sub(now))
	}
	if n := c.Stats().LeaseLost; n != 1 {
		t.Errorf("Stats().LeaseLost = %d, want 1", n)
	}
	// Cancelled once: a later pass does not count it again.
	c.expireLeases(now.Add(time.Millisecond))
	if !errors.Is(context.Cause(live), errLeaseExpired) {
		t.Errorf("live task's lease, at its end: cause %v, want errLeaseExpired", context.Cause(live))
	}
	if later.Err() != nil {
		t.Errorf("task later cancelled at %v, before its lease ends", time.Millisecond)
	}
	if n := c.Stats().LeaseLost; n != 2 {
		t.Errorf("Stats().LeaseLost = %d, want 2", n)
	}
}

// A task dispatched from a read sent before the watcher last looked (a read
// that blocked) can end its lease before the watcher planned to wake: it
// must wake the watcher, not wait for the next planned wake-up.
func TestLease_watcherWokenByEarlierLease(t *testing.T) {
	t.Parallel()
	c := leaseSetup(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.watchLeases(ctx)
	}()
	defer func() {
		stop()
		<-done
	}()
	// The watcher's first pass plans its next wake-up 9 s from now.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		wake := c.leases.wake
		c.mu.Unlock()
		if !wake.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not make its first pass")
		}
		time.Sleep(time.Millisecond)
	}
	added := time.Now()
	_, task := addTask(c, "t", added.Add(-9*time.Second+50*time.Millisecond)) // lease ends in 50 ms
	select {
	case <-task.Done():
		if !errors.Is(context.Cause(task), errLeaseExpired) {
			t.Errorf("cause %v, want errLeaseExpired", context.Cause(task))
		}
		if since := time.Since(added); since < 50*time.Millisecond {
			t.Errorf("cancelled %v after it was added, before its lease ended (50 ms)", since)
		}
	case <-time.After(4 * time.Second): // far from both 50 ms and 9 s
		t.Fatal("a lease ending before the watcher's planned wake-up was not cancelled until that wake-up")
	}
}

func TestLease_lateDelivery(t *testing.T) {
	t.Parallel()
	c := leaseSetup(t)
	now := time.Now()
	if c.lateDelivery(delivery{id: "1-0", at: now.Add(-9*time.Second + time.Second)}, now) {
		t.Error("a delivery with 1 s of lease left was reported late")
	}
	if !c.lateDelivery(delivery{id: "1-0", at: now.Add(-9 * time.Second)}, now) {
		t.Error("a delivery whose read was sent a whole lease ago was not reported late")
	}
	if n := c.Stats().LeaseLost; n != 1 {
		t.Errorf("Stats().LeaseLost = %d, want 1", n)
	}
}
