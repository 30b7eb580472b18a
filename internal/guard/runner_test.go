package guard

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// gate counts the script calls of a client and holds the first one until
// release is closed.
type gate struct {
	calls   atomic.Int64
	release chan struct{}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := strings.ToLower(cmd.Name()); n == "evalsha" || n == "eval" {
			if g.calls.Add(1) == 1 {
				<-g.release
			}
		}
		return next(ctx, cmd)
	}
}
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Callers that arrive while a call is in flight are sent together, in one
// script call, by the first of them, as soon as the reply comes back; each
// gets its own reply.
func TestRunner_Do_batchesConcurrentCallers(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, shared) + "}:"
	defer redistest.DeleteKeys(shared, prefix+"*")
	rdb := redis.NewClient(&redis.Options{Addr: shared.Options().Addr, PoolSize: 4})
	defer rdb.Close()
	g := &gate{release: make(chan struct{})}
	rdb.AddHook(g)
	r := newRunner(rdb)
	const n = 64
	replies := make([]any, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Go(func() { replies[0], errs[0] = r.Do(t.Context(), LockAcquire(prefix+"k0", "t", time.Minute)) })
	for g.calls.Load() == 0 { // the first caller is sending
		time.Sleep(time.Millisecond)
	}
	for i := 1; i < n; i++ {
		wg.Go(func() {
			replies[i], errs[i] = r.Do(t.Context(), LockAcquire(prefix+"k"+strconv.Itoa(i), "t", time.Minute))
		})
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r.mu.Lock()
		queued := len(r.queue)
		r.mu.Unlock()
		if queued == n-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers queued, want %d", queued, n-1)
		}
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	wg.Wait()
	for i := range n {
		if f, ok := replies[i].(string); errs[i] != nil || !ok || f == "" {
			t.Fatalf("caller %d: reply %v, %v; want its fence", i, replies[i], errs[i])
		}
	}
	if c := g.calls.Load(); c != 2 {
		t.Errorf("%d script calls for %d callers, want 2: the first alone, the %d that queued meanwhile together", c, n, n-1)
	}
}
