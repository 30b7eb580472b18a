package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// The ACL lines of docs/acl.md, read from the file and applied to a private
// redis-server (users must not leak onto the shared one): a producer, a
// consumer with the full middleware chain, a dead-letter replay, every
// pelican command and the metrics collector run under them, and Redis's ACL
// LOG, which records every denied command (those inside scripts and those
// whose errors Pelican ignores included), shows that none was denied but
// the documented optional ones. Then the refusals: a consumer whose user
// lacks a command fails at start, naming it, before it writes anything; a
// replay whose user lacks XDEL fails before it moves anything.

// aclStream is the queue of docs/acl.md's lines.
const aclStream = "orders"

// aclPermissionText are the texts of permission errors, in replies to
// commands and to scripts.
var aclPermissionText = []string{"NOPERM", "no permissions", "can't run this command", "can't access"}

// aclLine is one ACL SETUSER line of docs/acl.md.
type aclLine struct {
	user     string
	words    []string
	optional bool // marked "# optional"
}

// docACL returns the ACL SETUSER lines in the code blocks of docs/acl.md.
func docACL(t testing.TB) []aclLine {
	t.Helper()
	b, err := os.ReadFile("../docs/acl.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []aclLine
	code := false
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			code = !code
			continue
		}
		if !code || !strings.HasPrefix(l, "ACL SETUSER ") {
			continue
		}
		line, comment, _ := strings.Cut(l, " # ")
		words := strings.Fields(line)
		out = append(out, aclLine{user: words[2], words: words, optional: strings.HasPrefix(comment, "optional")})
	}
	return out
}

// aclServer is a private redis-server with the users of docs/acl.md.
type aclServer struct {
	srv   *redistest.Server
	admin *redis.Client
	lines []aclLine
}

func newACLServer(t *testing.T) *aclServer {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	return &aclServer{srv: srv, admin: srv.Client(t), lines: docACL(t)}
}

// setUser applies docs/acl.md's lines for user (the optional ones too if
// optional), PASSWORD replaced by "pw", then the extra rules.
func (a *aclServer) setUser(t *testing.T, user string, optional bool, extra ...string) {
	t.Helper()
	found := false
	for _, l := range a.lines {
		if l.user != user || (l.optional && !optional) {
			continue
		}
		found = found || !l.optional
		args := make([]any, len(l.words))
		for i, w := range l.words {
			args[i] = strings.Replace(w, ">PASSWORD", ">pw", 1)
		}
		if err := a.admin.Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("%s: %v", strings.Join(l.words, " "), err)
		}
	}
	if !found {
		t.Fatalf("docs/acl.md has no ACL SETUSER line for %s", user)
	}
	if len(extra) > 0 {
		args := []any{"ACL", "SETUSER", user}
		for _, e := range extra {
			args = append(args, e)
		}
		if err := a.admin.Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s %v: %v", user, extra, err)
		}
	}
}

// client returns a client logged in as user.
func (a *aclServer) client(t *testing.T, user string) *redis.Client {
	t.Helper()
	return a.srv.Client(t, func(o *redis.Options) { o.Username, o.Password = user, "pw" })
}

// url returns the pelican --redis URL of user.
func (a *aclServer) url(user string) string {
	return "redis://" + user + ":pw@" + a.srv.Addr() + "/0"
}

// denials returns Redis's ACL LOG as "user: reason object" lines, sorted,
// and resets it.
func (a *aclServer) denials(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	entries, err := a.admin.ACLLog(ctx, 128).Result()
	if err != nil {
		t.Fatalf("ACL LOG: %v", err)
	}
	if err := a.admin.ACLLogReset(ctx).Err(); err != nil {
		t.Fatalf("ACL LOG RESET: %v", err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s: %s %s", e.Username, e.Reason, e.Object))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// cli runs the pelican binary as user and returns its exit code and output.
func (a *aclServer) cli(t *testing.T, bin, user string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--redis", a.url(user)}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("pelican %v: %v", args, err)
	return 0, ""
}

// mustCLI runs the pelican binary as user and fails the test unless it
// exits 0 without a permission error.
func (a *aclServer) mustCLI(t *testing.T, bin, user string, args ...string) string {
	t.Helper()
	code, out := a.cli(t, bin, user, args...)
	if code != 0 || hasPermissionText(out) {
		t.Fatalf("pelican %s as %s: exit %d\n%s", strings.Join(args, " "), user, code, out)
	}
	return out
}

func hasPermissionText(s string) bool {
	for _, p := range aclPermissionText {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// aclWorkload is the handler of the full-chain consumer: jobs of type "ok"
// succeed, "flaky" fails its first run, "bad" fails permanently until fixed,
// "slow" runs long enough for heartbeats and lease renewals.
type aclWorkload struct {
	fixed atomic.Bool
	mu    sync.Mutex
	runs  map[string]int // by job ID
	done  map[string]bool
}

func (w *aclWorkload) Process(ctx context.Context, job *stream.Job) error {
	w.mu.Lock()
	w.runs[job.ID]++
	first := w.runs[job.ID] == 1
	w.mu.Unlock()
	var err error
	switch job.Type {
	case "flaky":
		if first {
			err = errors.New("transient")
		}
	case "bad":
		if !w.fixed.Load() {
			err = consumer.Permanent(errors.New("bad input"))
		}
	case "slow":
		select {
		case <-time.After(1500 * time.Millisecond):
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
	}
	if err == nil {
		w.mu.Lock()
		w.done[job.ID] = true
		w.mu.Unlock()
	}
	return err
}

// notDone returns the IDs of ids whose job has not succeeded.
func (w *aclWorkload) notDone(ids []string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, id := range ids {
		if !w.done[id] {
			out = append(out, id)
		}
	}
	return out
}

// startACLConsumer runs a consumer with the full chain as user
// orders-consumer until t ends. running fails the test if Run has
// returned.
func startACLConsumer(t *testing.T, a *aclServer, name string, w consumer.Handler, logs *syncBuffer) (running func()) {
	t.Helper()
	rdb := a.client(t, "orders-consumer")
	// Every middleware key defaults to the queue's namespace, {orders}:...
	store := idem.NewRedisStore(rdb, idem.RedisConfig{Retention: time.Hour})
	c := consumer.New(rdb, consumer.Config{
		Stream: aclStream, Group: "g", Consumer: name,
		Block: 50 * time.Millisecond, PromoteInterval: 20 * time.Millisecond,
		VisibilityTimeout: 2 * time.Second, IdleConsumerTimeout: time.Second,
		DeadLetterMaxLen: 100, MaxAttempts: 3,
		Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond, Jitter: consumer.JitterNone},
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
	}).Use(
		middleware.Lock(rdb, middleware.LockConfig{TTL: 10 * time.Second}),
		middleware.Idempotency(store, middleware.IdempotencyConfig{Lease: time.Minute}),
		middleware.Retry(middleware.RetryConfig{}),
		middleware.DeadLetter(middleware.DeadLetterConfig{MaxAge: time.Hour}),
		middleware.DistributedConcurrency(rdb, middleware.DistributedConcurrencyConfig{Limit: 4, Lease: 300 * time.Millisecond}),
		middleware.RateLimit(rdb, middleware.RateLimitConfig{Rate: 1000, Per: time.Second}),
	).Handle(w)
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	var runErr error
	go func() {
		runErr = c.Run(ctx)
		close(ended)
	}()
	t.Cleanup(func() {
		cancel()
		if <-ended; runErr != nil {
			t.Errorf("Run (%s): %v", name, runErr)
		}
	})
	return func() {
		select {
		case <-ended:
			t.Fatalf("Run (%s) returned: %v", name, runErr)
		default:
		}
	}
}

func TestACL_documentedRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newACLServer(t)
	bin := pelicanCLI(t)
	for _, u := range []string{"orders-producer", "orders-operator", "orders-dashboard"} {
		a.setUser(t, u, false)
	}
	a.setUser(t, "orders-consumer", false)
	keys, _ := stream.KeysFor(aclStream)

	// A job the consumer finds pending on a vanished consumer "ghost":
	// swept, counted as a suspect run, then the ghost is reaped.
	prod := stream.NewProducer(a.client(t, "orders-producer"), stream.ProducerConfig{Stream: aclStream})
	n := 0
	enqueue := func(typ string) string {
		t.Helper()
		j, err := stream.NewJSONJob(typ, map[string]string{"x": typ})
		if err != nil {
			t.Fatal(err)
		}
		n++
		j.IdempotencyKey, j.LockKey = fmt.Sprintf("op-%d", n), "customer-"+typ
		if _, err := prod.Enqueue(ctx, j); err != nil {
			t.Fatalf("Enqueue as orders-producer: %v", err)
		}
		return j.ID
	}
	if err := a.admin.XGroupCreateMkStream(ctx, aclStream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	ids := []string{enqueue("ok")}
	if err := a.admin.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "ghost", Streams: []string{aclStream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, enqueue("ok"), enqueue("flaky"), enqueue("slow"))
	bad := []string{enqueue("bad"), enqueue("bad")}
	batch := make([]*stream.Job, 3)
	for i := range batch {
		batch[i], _ = stream.NewJSONJob("ok", i)
	}
	if _, err := prod.EnqueueBatch(ctx, batch); err != nil {
		t.Fatalf("EnqueueBatch as orders-producer: %v", err)
	}
	for _, j := range batch {
		ids = append(ids, j.ID)
	}
	later, _ := stream.NewJSONJob("ok", "later")
	if err := prod.EnqueueIn(ctx, later, 50*time.Millisecond); err != nil {
		t.Fatalf("EnqueueIn as orders-producer: %v", err)
	}
	ids = append(ids, later.ID)
	// The producer's line is narrower than the team's patterns.
	if err := a.client(t, "orders-producer").XLen(ctx, keys.Dead).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("orders-producer read the dead-letter stream: %v", err)
	}
	a.denials(t)

	// The consumer with the full chain.
	w := &aclWorkload{runs: map[string]int{}, done: map[string]bool{}}
	var logs syncBuffer
	running := startACLConsumer(t, a, "c1", w, &logs)
	eventually(t, 60*time.Second, func() (bool, string) {
		running()
		dead := a.admin.XLen(ctx, keys.Dead).Val()
		rest := w.notDone(ids)
		return len(rest) == 0 && dead == 2, fmt.Sprintf("jobs not done: %v; dead letters %d of 2; logs:\n%s", rest, dead, tail(logs.String(), 4000))
	})
	eventually(t, 10*time.Second, func() (bool, string) {
		cs, err := a.admin.XInfoConsumers(ctx, aclStream, "g").Result()
		p := a.admin.XPending(ctx, aclStream, "g").Val()
		return err == nil && len(cs) == 1 && p.Count == 0 && a.admin.ZCard(ctx, keys.Delayed).Val() == 0,
			fmt.Sprintf("consumers %v (%v), pending %+v, delayed %d", cs, err, p, a.admin.ZCard(ctx, keys.Delayed).Val())
	})
	w.mu.Lock()
	flakyRuns, ghostRuns := w.runs[ids[2]], w.runs[ids[0]]
	w.mu.Unlock()
	if flakyRuns != 2 || ghostRuns != 1 {
		t.Fatalf("flaky job ran %d times (want 2: a retry through the delayed set), the ghost's job %d (want 1)", flakyRuns, ghostRuns)
	}
	if hasPermissionText(logs.String()) {
		t.Fatalf("the consumer logged a permission error:\n%s", logs.String())
	}
	for _, want := range []string{"may not end a blocked read (CLIENT ID, CLIENT UNBLOCK)", "the Redis user may not run CONFIG GET"} {
		if strings.Count(logs.String(), want) != 1 {
			t.Fatalf("the consumer logged %q %d times, want once (the optional commands are not granted):\n%s",
				want, strings.Count(logs.String(), want), logs.String())
		}
	}
	wantDenied := []string{"orders-consumer: command client|id", "orders-consumer: command config|get", "orders-consumer: command info"}
	if got := a.denials(t); !slices.Equal(got, wantDenied) {
		t.Fatalf("ACL LOG: %q, want only the optional commands %q", got, wantDenied)
	}

	// The operator: replay one dead job with package dlq, forgetting its
	// failed idempotency record, the other with the CLI.
	w.fixed.Store(true)
	op := a.client(t, "orders-operator")
	d, err := dlq.New(op, aclStream, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := idem.NewRedisStore(op, idem.RedisConfig{})
	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{Limit: 1, BeforeMove: func(ctx context.Context, e dlq.Entry) error {
		_, err := store.Forget(ctx, keys.Idem+middleware.IdempotencyKey(e.Job, middleware.MissingUseJobID), idem.StatusFailed)
		return err
	}})
	if err != nil || res.Replayed != 1 {
		t.Fatalf("Replay as orders-operator: %+v, %v", res, err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		rest := w.notDone(bad)
		return len(rest) == 1, fmt.Sprintf("bad jobs not done: %v", rest)
	})
	e, _, err := d.List(ctx, dlq.Filter{}, 1, "")
	if err != nil || len(e) != 1 {
		t.Fatalf("List as orders-operator: %v, %v", e, err)
	}
	deadID := e[0].ID
	for _, args := range [][]string{
		{"stats", aclStream},
		{"stats"},
		{"pending", aclStream, "--group", "g"},
		{"dlq", "ls", aclStream},
		{"dlq", "show", aclStream, deadID},
		{"dlq", "replay", aclStream, "--dry-run"},
		{"dlq", "purge", aclStream, "--dry-run"},
		{"trim", aclStream, "--dry-run"},
	} {
		a.mustCLI(t, bin, "orders-dashboard", args...)
	}
	out := a.mustCLI(t, bin, "orders-operator", "dlq", "replay", aclStream, "--yes", "--rate", "0",
		"--forget-failed-idempotency", "--idempotency-prefix", "{orders}:idem:")
	if !strings.Contains(out, "forgot 1 failed idempotency records") {
		t.Fatalf("pelican dlq replay did not forget the failed record:\n%s", out)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		rest := w.notDone(bad)
		return len(rest) == 0, fmt.Sprintf("bad jobs not done: %v", rest)
	})
	if err := a.admin.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"type", "legacy", "dead_reason", "permanent"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"stats", aclStream},
		{"stats"},
		{"pending", aclStream, "--group", "g", "--min-idle", "0s"},
		{"enqueue", aclStream, "--type", "ok", "--payload", `{"n":1}`},
		{"enqueue", aclStream, "--type", "ok", "--payload", `{"n":2}`, "--in", "10ms"},
		{"trim", aclStream, "--dry-run"},
		{"trim", aclStream},
		{"dlq", "ls", aclStream},
		{"dlq", "purge", aclStream, "--type", "legacy", "--yes"},
	} {
		a.mustCLI(t, bin, "orders-operator", args...)
	}
	// stats without SCAN says so, names nothing, and succeeds.
	if out := a.mustCLI(t, bin, "orders-dashboard", "stats"); !strings.Contains(out, "may not run SCAN") {
		t.Fatalf("pelican stats without SCAN:\n%s", out)
	}
	reg := prometheus.NewRegistry()
	col := metrics.NewCollector(a.client(t, "orders-dashboard"), metrics.CollectorConfig{Queues: []metrics.Queue{{Stream: aclStream, Groups: []string{"g"}}}})
	reg.MustRegister(col)
	if _, err := reg.Gather(); err != nil || col.Err() != nil {
		t.Fatalf("metrics collector as orders-dashboard: %v, %v", err, col.Err())
	}
	wantDenied = []string{"orders-dashboard: command scan", "orders-operator: command scan"}
	if got := a.denials(t); !slices.Equal(got, wantDenied) {
		t.Fatalf("ACL LOG after the operator and the dashboard: %q, want only the optional SCAN of stats %q", got, wantDenied)
	}

	// With the optional lines: stats lists the streams, and a consumer
	// warns about nothing and is denied nothing.
	a.setUser(t, "orders-consumer", true)
	a.setUser(t, "orders-dashboard", true)
	if out := a.mustCLI(t, bin, "orders-dashboard", "stats"); strings.Contains(out, "SCAN") || !strings.Contains(out, aclStream) {
		t.Fatalf("pelican stats with SCAN:\n%s", out)
	}
	var logs2 syncBuffer
	t.Run("optional", func(t *testing.T) {
		running := startACLConsumer(t, a, "c2", w, &logs2)
		eventually(t, 10*time.Second, func() (bool, string) {
			running()
			cs, _ := a.admin.XInfoConsumers(ctx, aclStream, "g").Result()
			return slices.ContainsFunc(cs, func(c redis.XInfoConsumer) bool { return c.Name == "c2" }), "c2 did not start reading"
		})
	}) // c2 shuts down here, ending its blocked read with CLIENT UNBLOCK
	if strings.Contains(logs2.String(), "level=WARN") || hasPermissionText(logs2.String()) {
		t.Fatalf("a consumer with the optional commands warned:\n%s", logs2.String())
	}
	if got := a.denials(t); len(got) > 0 {
		t.Fatalf("ACL LOG with the optional lines: %q, want nothing denied", got)
	}

	// The dashboard writes nothing.
	if err := a.admin.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"type", "legacy", "dead_reason", "permanent"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"enqueue", aclStream, "--type", "ok", "--payload", "{}"},
		{"dlq", "replay", aclStream, "--yes"},
		{"dlq", "purge", aclStream, "--yes"},
		{"trim", aclStream},
	} {
		if code, out := a.cli(t, bin, "orders-dashboard", args...); code == 0 {
			t.Fatalf("pelican %s as orders-dashboard succeeded:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestACL_consumerRefusedAtStart: a consumer whose user lacks a command it
// needs, or a key pattern, fails Run at start with an error naming the
// command, its key and what it is for, and writes nothing: a due delayed job
// stays in the delayed set, neither lost nor duplicated by the promoter.
func TestACL_consumerRefusedAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		rules []string
		want  []string
	}{
		{"XAUTOCLAIM", []string{"-xautoclaim"}, []string{`XAUTOCLAIM on "orders" (the visibility-timeout sweep)`}},
		{"ZREM", []string{"-zrem"}, []string{`ZREM on "{orders}:delayed" (promoting delayed jobs)`}},
		{"XADD", []string{"-xadd"}, []string{`XADD on "orders" (retries, promoting delayed jobs)`, `XADD on "{orders}:dlq" (dead-lettering)`}},
		{"derived keys", []string{"resetkeys", "~orders"}, []string{`ZADD on "{orders}:delayed"`, `GET on "{orders}:crashes:0-1"`}},
		{"scripts", []string{"-evalsha", "-eval"}, []string{`EVALSHA, EVAL on "orders" (scripts)`, "NOPERM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			a := newACLServer(t)
			a.setUser(t, "orders-consumer", true, tc.rules...)
			keys, _ := stream.KeysFor(aclStream)
			due, _ := stream.NewJSONJob("ok", "due")
			if err := stream.NewProducer(a.admin, stream.ProducerConfig{Stream: aclStream}).EnqueueAt(ctx, due, time.Now().Add(-time.Minute)); err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int64
			var logs syncBuffer
			c := consumer.New(a.client(t, "orders-consumer"), consumer.Config{
				Stream: aclStream, Group: "g", Block: 50 * time.Millisecond, PromoteInterval: 10 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { ran.Add(1); return nil }))
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				_ = c.Shutdown(ctx)
				<-done
				t.Fatalf("Run did not fail at start; logs:\n%s", logs.String())
			}
			for _, w := range append(tc.want, "see docs/acl.md") {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Fatalf("Run = %v; want an error naming %s", err, w)
				}
			}
			if n, z := a.admin.XLen(ctx, aclStream).Val(), a.admin.ZCard(ctx, keys.Delayed).Val(); n != 0 || z != 1 || ran.Load() != 0 {
				t.Fatalf("after the refused start: stream length %d (want 0), delayed %d (want 1), %d runs (want 0)", n, z, ran.Load())
			}
			if tc.name != "ZREM" && tc.name != "XADD" {
				return
			}
			// The promoter itself, run by hand under that user: it checks
			// every command before its first write, so a denied ZREM (which
			// would leave copies) or XADD (which would lose the job after its
			// ZREM) writes nothing.
			rdb := a.client(t, "orders-consumer")
			for range 5 {
				if _, err := stream.PromoteDue(ctx, rdb, aclStream, 10); err == nil {
					t.Fatalf("PromoteDue without %s succeeded", tc.name)
				}
			}
			if n, z := a.admin.XLen(ctx, aclStream).Val(), a.admin.ZCard(ctx, keys.Delayed).Val(); n != 0 || z != 1 {
				t.Fatalf("PromoteDue without %s: stream length %d (want 0: no copy of the job), delayed %d (want 1: not lost)", tc.name, n, z)
			}
		})
	}
}

// TestACL_replayRefused: a replay whose user may not XDEL fails before it
// moves anything; the move's XADD comes before its XDEL, so a move would
// have added the job and left it dead, to be replayed again.
func TestACL_replayRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newACLServer(t)
	a.setUser(t, "orders-operator", false, "-xdel")
	keys, _ := stream.KeysFor(aclStream)
	if err := a.admin.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"type", "ok", "payload", "{}", "job_id", "j1", "dead_reason", "permanent"}}).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := dlq.New(a.client(t, "orders-operator"), aclStream, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
		if err == nil || !strings.Contains(err.Error(), `XDEL on "{orders}:dlq" (moving jobs back)`) || res.Replayed != 0 {
			t.Fatalf("Replay without XDEL: %+v, %v; want an error naming XDEL", res, err)
		}
	}
	lease, cursor := d.Keys()
	if n, dead, held := a.admin.XLen(ctx, aclStream).Val(), a.admin.XLen(ctx, keys.Dead).Val(), a.admin.Exists(ctx, lease, cursor).Val(); n != 0 || dead != 1 || held != 0 {
		t.Fatalf("after the refused replays: source length %d (want 0), dead letters %d (want 1), lease and cursor keys %d (want 0)", n, dead, held)
	}
}
