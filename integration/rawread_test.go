package integration

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// cmdHook is a go-redis hook that shows each command a client sends (not
// those of pipelines) to the function, before sending it.
type cmdHook func(cmd redis.Cmder)

func (h cmdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h cmdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h cmdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h(cmd)
		return next(ctx, cmd)
	}
}

// A backlog is read raw, its reply parsed by the consumer
// (consumer/rawread.go), on RESP2 and RESP3: every job must come out as
// written, whatever bytes its fields hold, with duplicate field names (the
// last one counts) and with a hostile entry among them dead-lettered as
// malformed, as the typed read does.
func TestRawRead_backlogDecodesAsWritten(t *testing.T) {
	t.Parallel()
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("resp%d", proto), func(t *testing.T) {
			t.Parallel()
			opt := *redistest.Shared(t).Options()
			opt.Protocol = proto
			rdb := redis.NewClient(&opt)
			t.Cleanup(func() { rdb.Close() })
			var raws atomic.Int64 // the XREADGROUPs sent raw, parsed by the consumer
			rdb.AddHook(cmdHook(func(cmd redis.Cmder) {
				if _, raw := cmd.(*redis.RawCmd); raw && strings.EqualFold(cmd.Name(), "xreadgroup") {
					raws.Add(1)
				}
			}))
			ctx := context.Background()
			q := redistest.Name(t)
			keys, _ := stream.KeysFor(q)
			t.Cleanup(func() { rdb.Del(context.Background(), q, keys.Dead, keys.Delayed) })

			const n = 300
			want := map[string]string{} // job ID: payload
			for i := range n {
				id := fmt.Sprintf("j%d", i)
				payload := fmt.Sprintf("\x00\r\n%d\xff$*-1\r\n", i)
				fields := []string{"type", "first", "v", "1", "type", "t", "job_id", id, "payload", payload, "h.bin", "\r\n\x00"}
				if i == n/2 {
					fields = []string{"type", "t", "job_id", id, "attempt", "-1"} // malformed
				} else {
					want[id] = payload
				}
				rawXADD(t, rdb, q, "*", fields...)
			}
			var mu sync.Mutex
			got := map[string]string{}
			var bad []string
			c := consumer.New(rdb, consumer.Config{Stream: q, Group: "g", Consumer: "c", Concurrency: 2,
				Logger: slog.New(slog.DiscardHandler)}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				mu.Lock()
				defer mu.Unlock()
				if j.Type != "t" || j.Headers["bin"] != "\r\n\x00" {
					bad = append(bad, fmt.Sprintf("%s: type %q headers %q", j.ID, j.Type, j.Headers))
				}
				got[j.ID] = string(j.Payload)
				return nil
			}))
			done := make(chan error, 1)
			go func() { done <- c.Run(context.Background()) }()
			eventually(t, 60*time.Second, func() (bool, string) {
				mu.Lock()
				defer mu.Unlock()
				dead, _ := rdb.XLen(ctx, keys.Dead).Result()
				return len(got) == len(want) && dead == 1, fmt.Sprintf("%d of %d jobs ran, %d dead", len(got), len(want), dead)
			})
			if err := c.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			<-done
			if !maps.Equal(got, want) {
				t.Errorf("jobs ran with other payloads than written (%d vs %d)", len(got), len(want))
			}
			if len(bad) > 0 {
				t.Errorf("jobs decoded wrong: %v", bad[:min(len(bad), 3)])
			}
			if raws.Load() == 0 {
				t.Errorf("no read of the backlog went raw: the raw read was not exercised")
			}
		})
	}
}

// An idle consumer's blocking reads go raw when the client's ReadTimeout
// leaves room for Block (README): they wait Block and come back empty
// without a read error, and a job added meanwhile runs at once. With a
// ReadTimeout shorter than Block plus a second they stay typed, and
// idle reads fail no more than raw ones.
func TestRawRead_blockingRead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		readTimeout time.Duration
		raw         bool
	}{
		{"default", 0, true},
		{"none", -1, true},
		{"short", time.Second, false}, // under Block (200 ms) plus a second
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			opt := *redistest.Shared(t).Options()
			opt.ReadTimeout = c.readTimeout
			rdb := redis.NewClient(&opt)
			t.Cleanup(func() { rdb.Close() })
			var rawBlocks, typedBlocks atomic.Int64 // the XREADGROUPs with BLOCK
			rdb.AddHook(cmdHook(func(cmd redis.Cmder) {
				if strings.EqualFold(cmd.Name(), "xreadgroup") && strings.Contains(strings.ToLower(fmt.Sprint(cmd.Args())), " block ") {
					if _, raw := cmd.(*redis.RawCmd); raw {
						rawBlocks.Add(1)
					} else {
						typedBlocks.Add(1)
					}
				}
			}))
			q := redistest.Name(t)
			t.Cleanup(func() { redistest.DeleteKeys(rdb, q+"*") })
			ran := make(chan string, 10)
			cons := consumer.New(rdb, consumer.Config{Stream: q, Group: "g", Consumer: "c", Block: 200 * time.Millisecond,
				Logger: slog.New(slog.DiscardHandler)}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
				ran <- j.ID
				return nil
			}))
			done := make(chan error, 1)
			go func() { done <- cons.Run(context.Background()) }()
			t.Cleanup(func() {
				if err := cons.Shutdown(context.Background()); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
				<-done
			})
			// Idle: at least three blocking reads came back empty.
			eventually(t, 60*time.Second, func() (bool, string) {
				n := rawBlocks.Load() + typedBlocks.Load()
				return n >= 4, fmt.Sprintf("%d blocking reads", n)
			})
			rawXADD(t, rdb, q, "*", "type", "t", "job_id", "late", "payload", "{}", "type", "t")
			select {
			case id := <-ran:
				if id != "late" {
					t.Errorf("ran %q, want late", id)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the job added while the consumer was idle did not run within 60 s")
			}
			raw, typed := rawBlocks.Load(), typedBlocks.Load()
			if c.raw && (raw == 0 || typed != 0) || !c.raw && (typed == 0 || raw != 0) {
				t.Errorf("ReadTimeout %v: %d raw and %d typed blocking reads; want them all raw: %v", c.readTimeout, raw, typed, c.raw)
			}
			if n := cons.Stats().ReadErrors; n != 0 {
				t.Errorf("%d read errors while idle", n)
			}
		})
	}
}
