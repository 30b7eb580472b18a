package consumer_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// commandCounter is a go-redis hook that counts dials and commands.
type commandCounter struct{ dials, cmds atomic.Int64 }

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.dials.Add(1)
		return next(ctx, network, addr)
	}
}

func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// closedClient returns a client of an address where nothing listens, and
// the hook that counts what it sends.
func closedClient(t *testing.T) (*redis.Client, *commandCounter) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	h := &commandCounter{}
	rdb.AddHook(h)
	return rdb, h
}

var noop = consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })

func TestConsumer_Run_InvalidConfig(t *testing.T) {
	t.Parallel()
	valid := consumer.Config{Stream: "{q}:jobs", Group: "g", Consumer: "c"}
	with := func(f func(*consumer.Config)) consumer.Config {
		c := valid
		f(&c)
		return c
	}
	cases := []struct {
		name string
		cfg  consumer.Config
		want string // prefix of the error
	}{
		{"MissingStream", with(func(c *consumer.Config) { c.Stream = "" }), "consumer: Config.Stream is required"},
		{"StreamUnclosedBrace", with(func(c *consumer.Config) { c.Stream = "jobs{q" }), "consumer: Config.Stream: "},
		{"StreamStrayBrace", with(func(c *consumer.Config) { c.Stream = "jobs}q" }), "consumer: Config.Stream: "},
		{"StreamEmptyTag", with(func(c *consumer.Config) { c.Stream = "{}jobs" }), "consumer: Config.Stream: "},
		{"MissingGroup", with(func(c *consumer.Config) { c.Group = "" }), "consumer: Config.Group is required"},
		{"MaxCrashesOne", with(func(c *consumer.Config) { c.MaxCrashes = 1 }), "consumer: Config.MaxCrashes (1) must be at least 2"},
		{"HeartbeatHalfOfVisibility", with(func(c *consumer.Config) {
			c.VisibilityTimeout, c.HeartbeatInterval = 10*time.Second, 5*time.Second
		}), "consumer: Config.HeartbeatInterval (5s) must be less than half of Config.VisibilityTimeout (10s)"},
		{"HeartbeatOverVisibility", with(func(c *consumer.Config) {
			c.VisibilityTimeout, c.HeartbeatInterval = 10*time.Second, 20*time.Second
		}), "consumer: Config.HeartbeatInterval"},
		{"BlockEqualsVisibility", with(func(c *consumer.Config) {
			c.VisibilityTimeout, c.Block = 3*time.Second, 3*time.Second
		}), "consumer: Config.Block (3s) must be less than Config.VisibilityTimeout (3s)"},
		{"DefaultBlockOverVisibility", with(func(c *consumer.Config) { c.VisibilityTimeout = 900 * time.Millisecond }),
			"consumer: Config.Block (1s) must be less than Config.VisibilityTimeout (900ms)"},
		{"DeadLetterOtherSlot", with(func(c *consumer.Config) { c.DeadLetterStream = "{other}:dlq" }),
			`consumer: Config.DeadLetterStream ("{other}:dlq") must hash to the cluster slot of Config.Stream`},
		{"DeadLetterNoTag", with(func(c *consumer.Config) { c.Stream, c.DeadLetterStream = "orders", "orders:dlq" }),
			`consumer: Config.DeadLetterStream ("orders:dlq") must hash`},
		{"StartIDNotAnID", with(func(c *consumer.Config) { c.StartID = "abc" }),
			`consumer: Config.StartID ("abc") must be "$" or a stream entry ID`},
		{"StartIDNoSeq", with(func(c *consumer.Config) { c.StartID = "5-" }), `consumer: Config.StartID ("5-") must be`},
		{"StartIDMinus", with(func(c *consumer.Config) { c.StartID = "-" }), `consumer: Config.StartID ("-") must be`},
		{"DeadLetterIsStream", with(func(c *consumer.Config) { c.DeadLetterStream = c.Stream }),
			"consumer: Config.DeadLetterStream (\"{q}:jobs\") must differ from Config.Stream"},
	}
	for _, d := range []struct {
		name string
		set  func(*consumer.Config)
	}{
		{"Block", func(c *consumer.Config) { c.Block = -time.Second }},
		{"MaxRuntime", func(c *consumer.Config) { c.MaxRuntime = -time.Second }},
		{"PromoteInterval", func(c *consumer.Config) { c.PromoteInterval = -time.Second }},
		{"SettleTimeout", func(c *consumer.Config) { c.SettleTimeout = -time.Second }},
		{"ShutdownTimeout", func(c *consumer.Config) { c.ShutdownTimeout = -time.Second }},
		{"SweepInterval", func(c *consumer.Config) { c.SweepInterval = -time.Second }},
		{"VisibilityTimeout", func(c *consumer.Config) { c.VisibilityTimeout = -time.Second }},
	} {
		cases = append(cases, struct {
			name string
			cfg  consumer.Config
			want string
		}{"Negative" + d.name, with(d.set), "consumer: Config." + d.name + " (-1s) must not be negative"})
	}
	for _, n := range []struct {
		name string
		set  func(*consumer.Config)
	}{
		{"Concurrency", func(c *consumer.Config) { c.Concurrency = -1 }},
		{"MaxAttempts", func(c *consumer.Config) { c.MaxAttempts = -1 }},
		{"MaxCrashes", func(c *consumer.Config) { c.MaxCrashes = -1 }},
		{"MaxEntryBytes", func(c *consumer.Config) { c.MaxEntryBytes = -1 }},
	} {
		cases = append(cases, struct {
			name string
			cfg  consumer.Config
			want string
		}{"Negative" + n.name, with(n.set), "consumer: Config." + n.name + " (-1) must not be negative"})
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb, hook := closedClient(t)
			var called atomic.Bool
			c := consumer.New(rdb, tc.cfg).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
				called.Store(true)
				return nil
			}))
			err := runBriefly(t, c)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("Run = %v; want an error starting %q", err, tc.want)
			}
			if d, n := hook.dials.Load(), hook.cmds.Load(); d != 0 || n != 0 {
				t.Errorf("Run with an invalid Config dialled %d times and sent %d commands; want none", d, n)
			}
		})
	}

	t.Run("NoHandler", func(t *testing.T) {
		t.Parallel()
		rdb, hook := closedClient(t)
		err := runBriefly(t, consumer.New(rdb, valid))
		if err == nil || !strings.Contains(err.Error(), "no handler") {
			t.Errorf("Run without a handler = %v; want an error saying so", err)
		}
		if d, n := hook.dials.Load(), hook.cmds.Load(); d != 0 || n != 0 {
			t.Errorf("Run dialled %d times and sent %d commands; want none", d, n)
		}
	})

	t.Run("NilClient", func(t *testing.T) {
		t.Parallel()
		err := runBriefly(t, consumer.New(nil, valid).Handle(noop))
		if err == nil || !strings.Contains(err.Error(), "nil Redis client") {
			t.Errorf("Run with a nil client = %v; want an error saying so", err)
		}
	})

	t.Run("InvalidRunCanBeFixedAndRunAgain", func(t *testing.T) {
		t.Parallel()
		// A failed validation does not use up the consumer's one Run.
		b := setup(t)
		c := consumer.New(b.rdb, b.cfg)
		if err := runBriefly(t, c); err == nil {
			t.Fatal("Run without a handler succeeded")
		}
		c.Handle(noop)
		r := start(t, c)
		if err := r.stop(t); err != nil || r.err != nil {
			t.Errorf("Shutdown = %v, Run = %v; want nil, nil", err, r.err)
		}
	})
}

// runBriefly runs c and fails the test if Run has not returned within a
// second.
func runBriefly(t *testing.T, c *consumer.Consumer) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Second):
		cancel()
		_ = c.Shutdown(context.Background())
		<-done
		t.Fatalf("Run kept running; want an immediate configuration error")
		return nil
	}
}

func TestConsumer_Run_Twice(t *testing.T) {
	t.Parallel()

	t.Run("WhileRunning", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := consumer.New(b.rdb, b.cfg).Handle(noop)
		start(t, c)
		waitFor(t, 5*time.Second, "the group", func() bool {
			g, err := b.rdb.XInfoGroups(context.Background(), b.cfg.Stream).Result()
			return err == nil && len(g) == 1
		})
		if err := runBriefly(t, c); err == nil || !strings.Contains(err.Error(), "Run called twice") {
			t.Errorf("second Run = %v; want an error saying Run was called twice", err)
		}
	})

	t.Run("AfterShutdown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hook := &commandCounter{}
		b.rdb.AddHook(hook)
		c := consumer.New(b.rdb, b.cfg).Handle(noop)
		r := start(t, c)
		// Started, so that no attempt to create the group is under way.
		waitFor(t, 5*time.Second, "the group", func() bool {
			g, err := b.rdb.XInfoGroups(context.Background(), b.cfg.Stream).Result()
			return err == nil && len(g) == 1
		})
		if err := r.stop(t); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		before := hook.cmds.Load()
		if err := runBriefly(t, c); err == nil || !strings.Contains(err.Error(), "Run called twice") {
			t.Errorf("second Run = %v; want an error saying Run was called twice", err)
		}
		if n := hook.cmds.Load() - before; n != 0 {
			t.Errorf("second Run sent %d commands, want none", n)
		}
	})
}

func TestConfig_Defaults(t *testing.T) {
	t.Parallel()

	t.Run("ValidBoundaries", func(t *testing.T) {
		t.Parallel()
		// Just inside every limit: Run starts and stops cleanly.
		for _, cfg := range []consumer.Config{
			{VisibilityTimeout: 10 * time.Second, HeartbeatInterval: 5*time.Second - time.Millisecond},
			{VisibilityTimeout: 1001 * time.Millisecond},
			{IdleConsumerTimeout: -1},
			{HeartbeatInterval: -1}, // disables the heartbeat
			{Stream: "orders", DeadLetterStream: "{orders}:failed"},
		} {
			b := setup(t)
			if cfg.Stream == "" {
				cfg.Stream = b.cfg.Stream
			}
			cfg.Group, cfg.Consumer, cfg.Logger = "g", "c", discard
			c := consumer.New(b.rdb, cfg).Handle(noop)
			r := start(t, c)
			if err := r.stop(t); err != nil || r.err != nil {
				t.Errorf("Config %+v: Shutdown = %v, Run = %v; want a clean run", cfg, err, r.err)
			}
		}
	})

	t.Run("ZeroBackoff", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			attempt int
			lo, hi  time.Duration
		}{
			{0, 500 * time.Millisecond, time.Second},
			{1, time.Second, 2 * time.Second},
			{5, 16 * time.Second, 32 * time.Second},
			{12, 30 * time.Minute, time.Hour},
			{1000, 30 * time.Minute, time.Hour},
		} {
			for i := range 50 {
				job := &stream.Job{ID: fmt.Sprint("job-", i), EntryID: fmt.Sprint(i, "-0"), Attempt: tc.attempt}
				if d := (consumer.Backoff{}).Delay(job); d < tc.lo || d > tc.hi {
					t.Fatalf("Backoff{}.Delay(attempt %d) = %v, want within [%v, %v]", tc.attempt, d, tc.lo, tc.hi)
				}
			}
		}
	})
}
