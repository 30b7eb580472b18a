package integration

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Retention by default: consumers delete the entries they settled once
// every group has read and settled them. A job running the whole time
// holds its own entry and at most about a thousand settled ones, not the
// thousands after it; a group that has not read the entries keeps them all;
// KeepSettled keeps them all.
func TestRetention(t *testing.T) {
	t.Parallel()
	const n = 5000
	rdb := redistest.Shared(t)
	ctx := context.Background()

	type queue struct {
		name string
		p    *stream.Producer
	}
	newQueue := func(t *testing.T, groups ...string) queue {
		name := "{" + redistest.Prefix(t, rdb) + "}q"
		for _, g := range groups {
			if err := rdb.XGroupCreateMkStream(ctx, name, g, "0").Err(); err != nil {
				t.Fatal(err)
			}
		}
		return queue{name, stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})}
	}
	enqueue := func(t *testing.T, q queue, typ string, count int) {
		for i := 0; i < count; i += 100 {
			jobs := make([]*stream.Job, min(100, count-i))
			for k := range jobs {
				jobs[k] = &stream.Job{Type: typ, Payload: []byte(fmt.Sprint(i + k))}
			}
			if _, err := q.p.EnqueueBatch(ctx, jobs); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(t *testing.T, q queue, group string, keep bool, h consumer.HandlerFunc) *consumer.Consumer {
		c := consumer.New(rdb, consumer.Config{Stream: q.name, Group: group, Consumer: "c", Concurrency: 20,
			KeepSettled: keep, Logger: slog.New(slog.DiscardHandler)}).Handle(h)
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		t.Cleanup(func() {
			if err := c.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			<-done
		})
		return c
	}
	acked := func(c *consumer.Consumer, want int) func() (bool, string) {
		return func() (bool, string) {
			st := c.Stats()
			return st.Acked == uint64(want), fmt.Sprintf("%d of %d acknowledged: %+v", st.Acked, want, st)
		}
	}
	xlen := func(q queue) int64 { return rdb.XLen(ctx, q.name).Val() }

	t.Run("LongJobDoesNotPin", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, "g")
		release := make(chan struct{})
		var longStarted atomic.Bool
		enqueue(t, q, "long", 1)
		c := run(t, q, "g", false, func(ctx context.Context, j *stream.Job) error {
			if j.Type == "long" {
				longStarted.Store(true)
				<-release
			}
			return nil
		})
		eventually(t, 10*time.Second, func() (bool, string) { return longStarted.Load(), "the long job to start" })
		enqueue(t, q, "short", n)
		eventually(t, 60*time.Second, acked(c, n))
		l := xlen(q)
		t.Logf("with the long job pending after %d jobs: stream length %d", n, l)
		if l > 1200 {
			t.Errorf("stream length %d with one job pending after %d settled; want at most about 1000 settled entries kept", l, n)
		}
		if p := rdb.XPending(ctx, q.name, "g").Val(); p.Count != 1 {
			t.Errorf("pending %+v, want the long job only", p)
		}
		close(release)
		enqueue(t, q, "short", 200)
		eventually(t, 30*time.Second, acked(c, n+201))
		eventually(t, 10*time.Second, func() (bool, string) {
			return xlen(q) <= 100, fmt.Sprintf("stream length %d once every job settled, want at most one node (100)", xlen(q))
		})
	})

	// The same with a backlog drained at full speed: most ack batches do
	// not trim, so the entries they settle reach Redis as candidates for
	// deletion only in the consumer's next trims, which must send them once
	// a trim has found settled entries piled up behind the long job.
	t.Run("LongJobDoesNotPinBacklog", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, "g")
		release := make(chan struct{})
		defer close(release)
		var longStarted atomic.Bool
		enqueue(t, q, "long", 1)
		gate := make(chan struct{})
		c := run(t, q, "g", false, func(ctx context.Context, j *stream.Job) error {
			if j.Type == "long" {
				longStarted.Store(true)
				<-release
				return nil
			}
			<-gate // the backlog is in before the first short job settles
			return nil
		})
		eventually(t, 10*time.Second, func() (bool, string) { return longStarted.Load(), "the long job to start" })
		enqueue(t, q, "short", n)
		close(gate)
		eventually(t, 60*time.Second, acked(c, n))
		// The last trim runs once nothing else is in flight, or 100 ms later.
		eventually(t, 10*time.Second, func() (bool, string) {
			l := xlen(q)
			return l <= 1200, fmt.Sprintf("stream length %d with one job pending after %d settled; want at most about 1000 settled entries kept (plus a trim interval, 100)", l, n)
		})
	})

	t.Run("UnreadByAnotherGroup", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, "a", "b")
		enqueue(t, q, "job", n)
		ca := run(t, q, "a", false, func(context.Context, *stream.Job) error { return nil })
		eventually(t, 60*time.Second, acked(ca, n))
		if l := xlen(q); l != n {
			t.Fatalf("stream length %d after group a settled everything and group b read nothing; want all %d kept", l, n)
		}
		var seen atomic.Int64
		cb := run(t, q, "b", false, func(context.Context, *stream.Job) error { seen.Add(1); return nil })
		eventually(t, 60*time.Second, acked(cb, n))
		if seen.Load() != n {
			t.Errorf("group b ran %d jobs, want %d", seen.Load(), n)
		}
		eventually(t, 10*time.Second, func() (bool, string) {
			return xlen(q) <= 100, fmt.Sprintf("stream length %d once both groups settled everything", xlen(q))
		})
	})

	t.Run("PendingInAnotherGroup", func(t *testing.T) {
		t.Parallel()
		// Group b has read every entry and settled all but every 100th; a
		// long job of group a holds a's horizon back, so that a's consumer
		// deletes settled entries one by one: it must skip those b holds.
		q := newQueue(t, "a", "b")
		enqueue(t, q, "long", 1)
		enqueue(t, q, "job", n)
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "b", Consumer: "x", Streams: []string{q.name, ">"},
			Count: n + 1, Block: -1}).Result()
		if err != nil {
			t.Fatal(err)
		}
		var held, settled []string
		for i, m := range res[0].Messages {
			if i%100 == 50 {
				held = append(held, m.ID)
			} else {
				settled = append(settled, m.ID)
			}
		}
		if err := rdb.XAck(ctx, q.name, "b", settled...).Err(); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		defer close(release)
		ca := run(t, q, "a", false, func(ctx context.Context, j *stream.Job) error {
			if j.Type == "long" {
				<-release
			}
			return nil
		})
		eventually(t, 60*time.Second, acked(ca, n))
		l := xlen(q)
		t.Logf("stream length %d with a's long job and %d of b's entries pending", l, len(held))
		if l > 1200+int64(len(held)) {
			t.Errorf("stream length %d; want about 1000 settled entries kept, plus the long job and b's pending ones", l)
		}
		for _, id := range held {
			if msgs := rdb.XRange(ctx, q.name, id, id).Val(); len(msgs) != 1 {
				t.Errorf("entry %s, pending in group b, was deleted", id)
			}
		}
	})

	t.Run("KeepSettled", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, "g")
		enqueue(t, q, "job", n)
		c := run(t, q, "g", true, func(context.Context, *stream.Job) error { return nil })
		eventually(t, 60*time.Second, acked(c, n))
		if l := xlen(q); l != n {
			t.Errorf("stream length %d with KeepSettled; want all %d kept", l, n)
		}
	})
}
