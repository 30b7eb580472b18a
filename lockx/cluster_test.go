package lockx_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
)

// On Redis Cluster, keys with braces and colons acquire, extend, renew and
// release without CROSSSLOT (a lock is one key),
// with the default prefix (the key's slot) and with a prefix with a hash tag
// (the tag's slot, as the middleware's per-queue locks).
func TestClient_cluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	for _, prefix := range []string{"", "{orders}:lock:"} {
		clusterLocks(t, lockx.New(cl.Client(t), lockx.Config{Prefix: prefix}))
	}
}

func clusterLocks(t *testing.T, c *lockx.Client) {
	ctx := t.Context()
	for _, key := range []string{"customer:7", "a}b", "x{y", "{tag}:z", "{{a}}", "job:1:{2}:3", "ü"} {
		l, err := c.TryAcquire(ctx, key, 300*time.Millisecond)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", key, err)
		}
		if _, err := c.TryAcquire(ctx, key, time.Second); !errors.Is(err, lockx.ErrNotObtained) {
			t.Errorf("second TryAcquire(%q): %v, want ErrNotObtained", key, err)
		}
		if err := l.Extend(ctx, time.Second); err != nil {
			t.Errorf("Extend(%q): %v", key, err)
		}
		if _, err := l.TTL(ctx); err != nil {
			t.Errorf("TTL(%q): %v", key, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release(%q): %v", key, err)
		}
		l2, err := c.Acquire(ctx, key, time.Second, lockx.AcquireOptions{Wait: time.Second})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		if l2.Fence() <= l.Fence() {
			t.Errorf("%q: fence %d after %d", key, l2.Fence(), l.Fence())
		}
		l2.KeepAlive(ctx)
		if err := l2.Release(ctx); err != nil {
			t.Errorf("Release(%q): %v", key, err)
		}
	}
}
