package consumer_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// Messages of the start-up wait.
const (
	waitingMsg  = "Redis is not available at start; waiting for it"
	answeredMsg = "Redis answered; starting"
)

// startConfig returns a fast configuration for a stream of t's own, and the
// capture its Info and higher records go to.
func startConfig(t *testing.T) (consumer.Config, *capture) {
	t.Helper()
	logger, logs := newCapture(slog.LevelInfo)
	return consumer.Config{
		Stream:          "{" + redistest.Name(t) + "}:jobs",
		Group:           "workers",
		Consumer:        "c1",
		Block:           50 * time.Millisecond,
		PromoteInterval: 20 * time.Millisecond,
		Logger:          logger,
	}, logs
}

// waitLog waits for a record with message msg, for longer than capture.wait
// does (go-redis retries each attempt with its own backoff), and fails at
// once if Run returns (done) meanwhile.
func waitLog(t *testing.T, logs *capture, msg string, done <-chan struct{}, runErr *error) logRecord {
	t.Helper()
	waitFor(t, 30*time.Second, "a log record "+msg, func() bool {
		select {
		case <-done:
			t.Fatalf("Run returned %v while waiting for a log record %q", *runErr, msg)
		default:
		}
		return len(logs.withMsg(msg)) > 0
	})
	return logs.withMsg(msg)[0]
}

// freeAddr returns a 127.0.0.1 address where nothing listens.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestConsumer_Run_WaitsForRedis(t *testing.T) {
	t.Parallel()

	t.Run("NotStartedYet", func(t *testing.T) {
		t.Parallel()
		const password = "start-secret-7f3a"
		srv := redistest.Start(t, redistest.Options{Args: []string{"--user", "worker", "on", ">" + password, "~*", "+@all"}})
		srv.Shutdown() // as if the consumer started before its Redis
		creds := func(o *redis.Options) { o.Username, o.Password = "worker", password }
		rdb := srv.Client(t, creds)
		attempts := &commandCounter{}
		rdb.AddHook(attempts)
		cfg, logs := startConfig(t)
		handled := make(chan string, 10)
		c := consumer.New(rdb, cfg).Handle(consumer.HandlerFunc(func(_ context.Context, job *stream.Job) error {
			handled <- job.ID
			return nil
		}))
		begin := time.Now()
		r := start(t, c)
		waitLog(t, logs, waitingMsg, r.done, &r.err)
		// Several attempts, a few seconds with go-redis's own retries: the
		// backoff has run, and Run is still waiting.
		waitFor(t, 60*time.Second, "five attempts to create the group", func() bool { return attempts.cmds.Load() >= 5 })
		select {
		case <-r.done:
			t.Fatalf("Run returned while Redis was down: %v; want it to wait", r.err)
		default:
		}

		srv.Restart()
		up := time.Now()
		prod := stream.NewProducer(srv.Client(t, creds), stream.ProducerConfig{Stream: cfg.Stream})
		want := map[string]bool{}
		for i := range 3 {
			job, err := stream.NewJSONJob("t", i)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := prod.Enqueue(context.Background(), job); err != nil {
				t.Fatalf("Enqueue: %v", err)
			}
			want[job.ID] = true
		}
		for i := range len(want) {
			id := recv(t, handled, 30*time.Second, "a job enqueued after Redis started")
			if !want[id] {
				t.Errorf("handled job %s, not one enqueued", id)
			}
			if i == 0 {
				t.Logf("first job handled %v after Redis answered", time.Since(up))
			}
		}
		if rec := waitLog(t, logs, answeredMsg, r.done, &r.err); rec.attrs["waited_ms"].Int64() <= 0 {
			t.Errorf("record %v: want a positive waited_ms", rec)
		}
		if err := r.stop(t); err != nil || r.err != nil {
			t.Errorf("Shutdown = %v, Run = %v; want nil, nil", err, r.err)
		}

		waiting := logs.withMsg(waitingMsg)
		if max := 1 + int(time.Since(begin)/(10*time.Second)); len(waiting) > max {
			t.Errorf("%d records %q in %v; want at most one per 10s", len(waiting), waitingMsg, time.Since(begin))
		}
		for _, r := range waiting {
			if r.level != slog.LevelError || r.attrs["error"].String() == "" {
				t.Errorf("record %v: want level ERROR with the error", r)
			}
		}
		for _, r := range logs.records() {
			if strings.Contains(r.String(), password) {
				t.Errorf("log record holds the password: %v", r)
			}
		}
	})

	t.Run("ReadOnlyReplica", func(t *testing.T) {
		t.Parallel()
		// A replica (as during a failover) refuses writes with READONLY, an
		// error reply that waiting can fix.
		srv := redistest.Start(t, redistest.Options{})
		rdb := srv.Client(t)
		host, port, _ := net.SplitHostPort(freeAddr(t))
		if err := rdb.Do(context.Background(), "REPLICAOF", host, port).Err(); err != nil {
			t.Fatalf("REPLICAOF: %v", err)
		}
		cfg, logs := startConfig(t)
		handled := make(chan string, 1)
		c := consumer.New(rdb, cfg).Handle(consumer.HandlerFunc(func(_ context.Context, job *stream.Job) error {
			handled <- job.ID
			return nil
		}))
		r := start(t, c)
		if rec := waitLog(t, logs, waitingMsg, r.done, &r.err); !strings.HasPrefix(rec.attrs["error"].String(), "consumer: create group") ||
			!strings.Contains(rec.attrs["error"].String(), "READONLY") {
			t.Fatalf("record %v: want the READONLY error", rec)
		}
		select {
		case <-r.done:
			t.Fatalf("Run returned on READONLY: %v; want it to wait", r.err)
		default:
		}
		if err := rdb.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
			t.Fatalf("REPLICAOF NO ONE: %v", err)
		}
		job, err := stream.NewJSONJob("t", 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: cfg.Stream}).Enqueue(context.Background(), job); err != nil {
			t.Fatalf("Enqueue: %v", err)
		}
		if id := recv(t, handled, 30*time.Second, "the job enqueued after promotion"); id != job.ID {
			t.Errorf("handled %s, want %s", id, job.ID)
		}
		if err := r.stop(t); err != nil || r.err != nil {
			t.Errorf("Shutdown = %v, Run = %v; want nil, nil", err, r.err)
		}
	})
}

func TestConsumer_Shutdown_WhileWaitingForRedis(t *testing.T) {
	t.Parallel()

	// shutdown checks that Shutdown returned nil before its 10s deadline (a
	// later Run makes it return the deadline's error) and that Run returned
	// nil.
	shutdown := func(t *testing.T, r *running) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.c.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown while Run waits for Redis = %v; want nil before the deadline", err)
		}
		select {
		case <-r.done:
			if r.err != nil {
				t.Errorf("Run = %v; want nil", r.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after Shutdown did")
		}
	}

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		rdb, _ := closedClient(t)
		cfg, logs := startConfig(t)
		r := start(t, consumer.New(rdb, cfg).Handle(noop))
		waitLog(t, logs, waitingMsg, r.done, &r.err)
		shutdown(t, r)
	})

	t.Run("BlackHole", func(t *testing.T) {
		t.Parallel()
		// A frozen server accepts connections and never answers: the
		// attempt under way blocks until the client's read timeout, which
		// its context cannot shorten (no ContextTimeoutEnabled).
		srv := redistest.Start(t, redistest.Options{})
		srv.Stop()
		rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = time.Minute })
		attempts := &commandCounter{}
		rdb.AddHook(attempts)
		cfg, _ := startConfig(t)
		r := start(t, consumer.New(rdb, cfg).Handle(noop))
		waitFor(t, 30*time.Second, "an attempt to create the group", func() bool { return attempts.cmds.Load() >= 1 })
		shutdown(t, r)
	})

	t.Run("ContextCancelled", func(t *testing.T) {
		t.Parallel()
		rdb, _ := closedClient(t)
		cfg, logs := startConfig(t)
		r := &running{c: consumer.New(rdb, cfg).Handle(noop), done: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			r.err = r.c.Run(ctx)
			close(r.done)
		}()
		waitLog(t, logs, waitingMsg, r.done, &r.err)
		cancel()
		select {
		case <-r.done:
			if r.err != nil {
				t.Errorf("Run = %v; want nil", r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context was cancelled")
		}
	})
}

func TestConsumer_Run_StartTimeout(t *testing.T) {
	t.Parallel()

	run := func(t *testing.T, rdb redis.UniversalClient, cfg consumer.Config) error {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- consumer.New(rdb, cfg).Handle(noop).Run(ctx) }()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			cancel()
			<-done
			t.Fatal("Run kept waiting for Redis; want an error")
			return nil
		}
	}

	t.Run("NegativeFailsFast", func(t *testing.T) {
		t.Parallel()
		rdb, _ := closedClient(t)
		cfg, logs := startConfig(t)
		cfg.StartTimeout = -1
		err := run(t, rdb, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "consumer: create group workers on ") || !strings.Contains(err.Error(), "refused") {
			t.Errorf("Run = %v; want the refused connection", err)
		}
		if n := len(logs.withMsg(waitingMsg)); n != 0 {
			t.Errorf("%d records %q; want none when failing fast", n, waitingMsg)
		}
	})

	t.Run("GivesUp", func(t *testing.T) {
		t.Parallel()
		rdb, _ := closedClient(t)
		cfg, logs := startConfig(t)
		cfg.StartTimeout = 300 * time.Millisecond
		err := run(t, rdb, cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "consumer: ") ||
			!strings.Contains(err.Error(), "Config.StartTimeout (300ms)") {
			t.Errorf("Run = %v; want an error naming Config.StartTimeout", err)
		}
		if n := len(logs.withMsg(waitingMsg)); n > 1 {
			t.Errorf("%d records %q; want at most one", n, waitingMsg)
		}
	})
}

// TestConsumer_Run_FatalStartErrors: errors that waiting cannot fix end Run
// at once, though Config.StartTimeout is unlimited.
func TestConsumer_Run_FatalStartErrors(t *testing.T) {
	t.Parallel()
	const password = "start-secret-2b9e"
	srv := redistest.Start(t, redistest.Options{Args: []string{
		"--user", "worker", "on", ">" + password, "~*", "+@all",
		"--user", "reader", "on", ">" + password, "~*", "+@all", "-xgroup",
	}})
	admin := srv.Client(t)
	wrongType := "{" + redistest.Name(t) + "}:jobs"
	if err := admin.Set(context.Background(), wrongType, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Last: the default user now needs a password.
	if err := admin.ConfigSet(context.Background(), "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	closed := srv.Client(t)
	_ = closed.Close()

	for _, tc := range []struct {
		name       string
		rdb        *redis.Client
		stream     string
		want       string
		user, pass string
	}{
		{name: "WrongType", stream: wrongType, user: "worker", pass: password, want: "WRONGTYPE"},
		{name: "NoPerm", user: "reader", pass: password, want: "NOPERM"},
		{name: "WrongPass", user: "worker", pass: "wrong", want: "WRONGPASS"},
		{name: "NoAuth", want: "NOAUTH"},
		{name: "ClosedClient", rdb: closed, want: "client is closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := tc.rdb
			if rdb == nil {
				rdb = srv.Client(t, func(o *redis.Options) { o.Username, o.Password = tc.user, tc.pass })
			}
			cfg, logs := startConfig(t)
			if tc.stream != "" {
				cfg.Stream = tc.stream
			}
			c := consumer.New(rdb, cfg).Handle(noop)
			done := make(chan error, 1)
			go func() { done <- c.Run(context.Background()) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				_ = c.Shutdown(context.Background())
				<-done
				t.Fatalf("Run kept waiting on an error that waiting cannot fix (%s)", tc.want)
			}
			if err == nil || !strings.HasPrefix(err.Error(), "consumer: create group workers on ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run = %v; want the %s error", err, tc.want)
			}
			if n := len(logs.withMsg(waitingMsg)); n != 0 {
				t.Errorf("%d records %q; want none", n, waitingMsg)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("Run's error holds the password: %v", err)
			}
		})
	}
}
