package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Startup (README, Lifecycle): Run waits for Redis to create the group,
// Shutdown or a cancelled context end the wait at once (Run returns nil),
// StartTimeout bounds it, and errors that waiting cannot fix end Run at once.

// a9StartConsumer runs a consumer of stream on rdb in the background and
// returns it with the channel of Run's result and a counter of jobs run.
func a9StartConsumer(t *testing.T, rdb *redis.Client, name string, cfg consumer.Config) (*consumer.Consumer, chan error, chan string) {
	t.Helper()
	cfg.Stream, cfg.Group, cfg.Consumer = name, "g", "c1"
	if cfg.Block == 0 {
		cfg.Block = 200 * time.Millisecond
	}
	cfg.Logger = quietA9()
	ran := make(chan string, 100)
	c := consumer.New(rdb, cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		ran <- j.ID
		return nil
	}))
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return after its context was cancelled")
		}
	})
	return c, done, ran
}

// a9Wait returns Run's result, failing the test after d.
func a9Wait(t *testing.T, done chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-done:
		done <- err // for the cleanup
		return err
	case <-time.After(d):
		t.Fatalf("%s: Run still running after %v", what, d)
		return nil
	}
}

// A consumer started before its Redis starts processing once Redis comes up.
func TestAttack9_startup_waitsForRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	srv.Shutdown()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	name := redistest.Name(t)
	_, done, ran := a9StartConsumer(t, rdb, name, consumer.Config{})
	time.Sleep(3 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while Redis was down, want it to wait", err)
	default:
	}
	srv.Restart()
	j := mustJob(t, map[string]any{"x": 1})
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-ran:
		if id != j.ID {
			t.Fatalf("ran %s, want %s", id, j.ID)
		}
	case <-time.After(time.Minute):
		t.Fatal("the job did not run after Redis came up")
	}
}

// Shutdown, or cancelling Run's context, ends the wait at once and Run
// returns nil: with Redis refusing connections, and with Redis frozen
// (SIGSTOP) while the client's timeouts are far longer than the deadline.
func TestAttack9_startup_shutdownWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"refused/shutdown", "refused/cancel", "frozen/shutdown", "frozen/cancel"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{})
			if strings.HasPrefix(mode, "refused") {
				srv.Shutdown()
			} else {
				srv.Stop()
			}
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
			t.Cleanup(func() { rdb.Close() })
			cfg := consumer.Config{Stream: redistest.Name(t), Group: "g", Consumer: "c1", Logger: quietA9(), Block: 200 * time.Millisecond}
			c := consumer.New(rdb, cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			time.Sleep(1500 * time.Millisecond) // Run is waiting
			start := time.Now()
			if strings.HasSuffix(mode, "shutdown") {
				sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer scancel()
				if err := c.Shutdown(sctx); err != nil {
					t.Errorf("Shutdown returned %v", err)
				}
			} else {
				cancel()
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
				t.Logf("Run returned %v after the stop", time.Since(start))
			case <-time.After(10 * time.Second):
				t.Fatalf("Run still waiting 10s after the stop (client timeouts: 1 minute)")
			}
			if strings.HasPrefix(mode, "frozen") {
				srv.Cont()
			}
		})
	}
}

// StartTimeout bounds the wait (Run returns the last error); a negative
// value fails fast.
func TestAttack9_startup_startTimeout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	srv.Shutdown()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	for _, st := range []time.Duration{-1, 1500 * time.Millisecond, 8 * time.Second} {
		start := time.Now()
		_, done, _ := a9StartConsumer(t, rdb, redistest.Name(t), consumer.Config{StartTimeout: st})
		err := a9Wait(t, done, 30*time.Second, fmt.Sprint("StartTimeout ", st))
		took := time.Since(start)
		if err == nil {
			t.Errorf("StartTimeout %v: Run returned nil with Redis down", st)
		}
		if st > 0 && took < st {
			t.Errorf("StartTimeout %v: Run gave up after %v", st, took)
		}
		var op *net.OpError
		if st >= 8*time.Second && !errors.As(err, &op) { // an attempt ended before the timeout
			t.Errorf("StartTimeout %v: Run returned %q, which does not carry the last error (connection refused)", st, err)
		}
		t.Logf("StartTimeout %v: Run returned after %v: %v", st, took, err)
	}
}

// Errors that waiting cannot fix end Run at once, whatever StartTimeout
// says (0: no limit): the stream key holds another type (WRONGTYPE), or the
// user may not run the commands (NOPERM).
func TestAttack9_startup_unfixableErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	ctx := context.Background()
	t.Run("wrongtype", func(t *testing.T) {
		name := redistest.Name(t)
		admin.Set(ctx, name, "not a stream", 0)
		_, done, _ := a9StartConsumer(t, admin, name, consumer.Config{})
		err := a9Wait(t, done, 20*time.Second, "WRONGTYPE")
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("Run returned %v, want the WRONGTYPE error", err)
		}
	})
	t.Run("noperm", func(t *testing.T) {
		if err := admin.Do(ctx, "ACL", "SETUSER", "a9ro", "on", ">pw", "~*", "+@read", "+ping", "+hello", "+client").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "a9ro", Password: "pw"})
		t.Cleanup(func() { rdb.Close() })
		_, done, _ := a9StartConsumer(t, rdb, redistest.Name(t), consumer.Config{})
		err := a9Wait(t, done, 20*time.Second, "NOPERM")
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("Run returned %v, want the NOPERM error", err)
		}
	})
	t.Run("wrongpass", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "a9ro", Password: "wrong"})
		t.Cleanup(func() { rdb.Close() })
		_, done, _ := a9StartConsumer(t, rdb, redistest.Name(t), consumer.Config{})
		err := a9Wait(t, done, 20*time.Second, "WRONGPASS")
		if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("Run returned %v, want the WRONGPASS error", err)
		}
	})
	t.Run("unknownCommand", func(t *testing.T) {
		srv2 := redistest.Start(t, redistest.Options{Args: []string{"--rename-command", "XGROUP", ""}})
		rdb := srv2.Client(t)
		_, done, _ := a9StartConsumer(t, rdb, redistest.Name(t), consumer.Config{})
		err := a9Wait(t, done, 20*time.Second, "unknown command")
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
			t.Errorf("Run returned %v, want the unknown command error", err)
		}
	})
	t.Run("closedClient", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		rdb.Close()
		_, done, _ := a9StartConsumer(t, rdb, redistest.Name(t), consumer.Config{})
		if err := a9Wait(t, done, 20*time.Second, "closed client"); err == nil || !errors.Is(err, redis.ErrClosed) {
			t.Errorf("Run returned %v, want redis: client is closed", err)
		}
	})
}

// OOM at start is waited out: a new queue's group cannot be created while
// Redis is full; once memory frees, the consumer starts and runs jobs.
func TestAttack9_startup_oomWaits(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "5mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	ctx := context.Background()
	pad := strings.Repeat("f", 64<<10)
	for i := 0; ; i++ {
		if err := rdb.Set(ctx, fmt.Sprintf("filler:%d", i), pad, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			break
		}
		if i > 10000 {
			t.Fatal("maxmemory not in force")
		}
	}
	name := redistest.Name(t)
	_, done, ran := a9StartConsumer(t, rdb, name, consumer.Config{})
	time.Sleep(2 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("Run returned %v under OOM, want it to wait", err)
	default:
	}
	redistest.DeleteKeys(rdb, "filler:*")
	j := mustJob(t, map[string]any{"x": 1})
	eventually(t, 30*time.Second, func() (bool, string) {
		_, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(ctx, j)
		return err == nil, fmt.Sprint(err)
	})
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not run after memory freed")
	}
}

// Shutdown called before Run: Run stops as soon as it has started and
// returns nil, even with Redis down.
func TestAttack9_startup_shutdownBeforeRun(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	srv.Shutdown()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := consumer.New(rdb, consumer.Config{Stream: redistest.Name(t), Group: "g", Logger: quietA9()}).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	if err := c.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown before Run: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after Shutdown returned %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run after Shutdown still running after 20s")
	}
}
