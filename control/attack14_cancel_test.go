package control_test

// Outside tests of cancelling a tracked job by ID (README "Finding and
// cancelling a job", control.Cancel, consumer.ErrCancelled, consumer.Decide),
// written from the docs only.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// a14q is one queue of a test: its own stream on a Redis.
type a14q struct {
	t    *testing.T
	rdb  *redis.Client
	name string
	keys stream.Keys
	prod *stream.Producer
}

func newA14Queue(t *testing.T, rdb *redis.Client) *a14q {
	t.Helper()
	if rdb == nil {
		rdb = redistest.Shared(t)
	}
	name := redistest.Name(t)
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rdb.Del(context.Background(), keys.Stream)
		redistest.DeleteKeys(rdb, "{"+name+"}:*")
	})
	return &a14q{t: t, rdb: rdb, name: name, keys: keys,
		prod: stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})}
}

// enqueue adds one tracked job with payload {"n": n} and returns its ID.
func (q *a14q) enqueue(n int) (id, entry string) {
	q.t.Helper()
	j, err := stream.NewJSONJob("a14", map[string]int{"n": n})
	if err != nil {
		q.t.Fatal(err)
	}
	entry, err = q.prod.Enqueue(context.Background(), j)
	if err != nil {
		q.t.Fatal(err)
	}
	return j.ID, entry
}

func (q *a14q) lookup(id string) control.JobInfo {
	q.t.Helper()
	info, err := control.Lookup(context.Background(), q.rdb, q.name, id)
	if err != nil {
		q.t.Fatalf("Lookup %s: %v", id, err)
	}
	return info
}

func (q *a14q) waitState(id string, timeout time.Duration, states ...string) control.JobInfo {
	q.t.Helper()
	var info control.JobInfo
	poll.Until(q.t, timeout, func() (bool, string) {
		info = q.lookup(id)
		for _, s := range states {
			if info.State == s {
				return true, ""
			}
		}
		return false, fmt.Sprintf("job %s is %q (%+v), want one of %v", id, info.State, info, states)
	})
	return info
}

// quiet checks that nothing of the queue is left anywhere: no dead letter,
// nothing delayed, nothing pending.
func (q *a14q) quiet(group string) {
	q.t.Helper()
	ctx := context.Background()
	if n := q.rdb.XLen(ctx, q.keys.Dead).Val(); n != 0 {
		q.t.Errorf("%d dead letters, want 0", n)
	}
	if n := q.rdb.ZCard(ctx, q.keys.Delayed).Val(); n != 0 {
		q.t.Errorf("%d delayed jobs, want 0", n)
	}
	if p, err := q.rdb.XPending(ctx, q.name, group).Result(); err == nil && p.Count != 0 {
		q.t.Errorf("%d pending, want 0", p.Count)
	}
}

type a14run struct {
	c       *consumer.Consumer
	stop    context.CancelFunc
	done    chan error
	stopped chan struct{} // closed when Run has returned
}

// start runs a consumer of q; it is stopped at the end of the test.
func (q *a14q) start(name string, h consumer.Handler, mod func(*consumer.Config), mws ...consumer.Middleware) *a14run {
	q.t.Helper()
	return q.startOn(q.rdb, name, h, mod, mws...)
}

func (q *a14q) startOn(rdb redis.UniversalClient, name string, h consumer.Handler, mod func(*consumer.Config), mws ...consumer.Middleware) *a14run {
	q.t.Helper()
	cfg := consumer.Config{
		Stream:            q.name,
		Group:             "g",
		Consumer:          name,
		Concurrency:       4,
		VisibilityTimeout: 20 * time.Second,
		Block:             100 * time.Millisecond,
		PromoteInterval:   50 * time.Millisecond,
		ShutdownTimeout:   2 * time.Second,
		Backoff:           consumer.Backoff{Base: 30 * time.Millisecond, Cap: 30 * time.Millisecond},
		Logger:            a14logger(),
	}
	if mod != nil {
		mod(&cfg)
	}
	c := consumer.New(rdb, cfg).Use(mws...).Handle(h)
	ctx, stop := context.WithCancel(context.Background())
	r := &a14run{c: c, stop: stop, done: make(chan error, 1), stopped: make(chan struct{})}
	go func() {
		r.done <- c.Run(ctx)
		close(r.stopped)
	}()
	q.t.Cleanup(func() {
		stop()
		select {
		case <-r.stopped:
		case <-time.After(30 * time.Second):
			q.t.Errorf("consumer %s did not stop", name)
		}
	})
	return r
}

// a14ledger records what handlers saw, per job ID.
type a14ledger struct {
	mu       sync.Mutex
	starts   map[string]int
	startOn  map[string][]string
	causes   map[string][]error
	doneAt   map[string]time.Time
	started  map[string]chan struct{}
	finished map[string]chan struct{}
}

func newA14Ledger() *a14ledger {
	return &a14ledger{starts: map[string]int{}, startOn: map[string][]string{}, causes: map[string][]error{},
		doneAt: map[string]time.Time{}, started: map[string]chan struct{}{}, finished: map[string]chan struct{}{}}
}

func (l *a14ledger) ch(m map[string]chan struct{}, id string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := m[id]
	if !ok {
		c = make(chan struct{})
		m[id] = c
	}
	return c
}

func (l *a14ledger) start(id, who string) {
	l.mu.Lock()
	l.starts[id]++
	l.startOn[id] = append(l.startOn[id], who)
	l.mu.Unlock()
	c := l.ch(l.started, id)
	select {
	case <-c:
	default:
		close(c)
	}
}

func (l *a14ledger) end(id string, cause error) {
	l.mu.Lock()
	l.causes[id] = append(l.causes[id], cause)
	if _, ok := l.doneAt[id]; !ok {
		l.doneAt[id] = time.Now()
	}
	l.mu.Unlock()
	c := l.ch(l.finished, id)
	select {
	case <-c:
	default:
		close(c)
	}
}

func (l *a14ledger) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.starts[id]
}

func waitCh(t *testing.T, c <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// blocking returns a handler that records its start, blocks until its
// context ends or release is closed, and then returns what ret says.
func blocking(l *a14ledger, who string, release <-chan struct{}, ret func(ctx context.Context) error) consumer.HandlerFunc {
	return func(ctx context.Context, job *stream.Job) error {
		l.start(job.ID, who)
		select {
		case <-ctx.Done():
			l.end(job.ID, context.Cause(ctx))
			return ret(ctx)
		case <-release:
			l.end(job.ID, nil)
			return nil
		}
	}
}

// TestAttack14Cancel_runningEndsOnce cancels a running tracked job whose
// handler then returns each kind of outcome: the docs promise the context is
// cancelled with cause ErrCancelled, and the job ends cancelled (done if the
// handler returned nil), acknowledged, never retried nor dead-lettered, never
// run again; a second Cancel is refused with ErrJobFinished.
func TestAttack14Cancel_runningEndsOnce(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ret  func(ctx context.Context) error
		want string
	}{
		{"returnsCause", func(ctx context.Context) error { return context.Cause(ctx) }, stream.StateCancelled},
		{"returnsPlainError", func(ctx context.Context) error { return errors.New("downstream broke") }, stream.StateCancelled},
		{"returnsRetry", func(ctx context.Context) error { return consumer.Retry(time.Millisecond, errors.New("again")) }, stream.StateCancelled},
		{"returnsDead", func(ctx context.Context) error { return consumer.Dead("bad", errors.New("dead")) }, stream.StateCancelled},
		{"returnsPanic", func(ctx context.Context) error { panic("boom after cancel") }, stream.StateCancelled},
		{"returnsSnooze", func(ctx context.Context) error { return consumer.Snooze(time.Millisecond) }, stream.StateCancelled},
		{"returnsNil", func(ctx context.Context) error { return nil }, stream.StateDone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := newA14Queue(t, nil)
			l := newA14Ledger()
			never := make(chan struct{})
			r := q.start("c1", blocking(l, "c1", never, tc.ret), nil)
			id, entry := q.enqueue(1)
			other, _ := q.enqueue(2)
			waitCh(t, l.ch(l.started, id), 20*time.Second, "the job to start")
			waitCh(t, l.ch(l.started, other), 20*time.Second, "the other job to start")

			was, err := control.Cancel(context.Background(), q.rdb, q.name, id)
			asked := time.Now()
			if err != nil || was != stream.StateCancelling {
				t.Fatalf("Cancel of a running job = %q, %v; want %q", was, err, stream.StateCancelling)
			}
			waitCh(t, l.ch(l.finished, id), 20*time.Second, "the handler's context to end")
			l.mu.Lock()
			cause, took := l.causes[id][0], l.doneAt[id].Sub(asked)
			l.mu.Unlock()
			t.Logf("handler cancelled %v after Cancel returned", took)
			if !errors.Is(cause, consumer.ErrCancelled) {
				t.Fatalf("handler's context cause = %v, want consumer.ErrCancelled", cause)
			}
			info := q.waitState(id, 20*time.Second, stream.StateDone, stream.StateCancelled, stream.StateDead, stream.StateRetrying)
			if info.State != tc.want {
				t.Fatalf("final state %q (%+v), want %q", info.State, info, tc.want)
			}
			if info.EntryID != "" && info.EntryID != entry {
				t.Errorf("final record names entry %s, the job's was %s", info.EntryID, entry)
			}
			// The other job of the same consumer is untouched.
			if o := q.lookup(other); o.State != control.StateRunning {
				t.Fatalf("the other running job is %q, want running: the cancel hit it", o.State)
			}
			if _, err := control.Cancel(context.Background(), q.rdb, q.name, id); !errors.Is(err, control.ErrJobFinished) {
				t.Errorf("second Cancel after it ended = %v, want ErrJobFinished", err)
			}
			close(never)
			q.waitState(other, 20*time.Second, stream.StateDone)
			if err := r.c.WaitIdle(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n := l.count(id); n != 1 {
				t.Errorf("the cancelled job ran %d times, want 1", n)
			}
			st := r.c.Stats()
			wantAck, wantCancelled := uint64(2), uint64(0)
			if tc.want == stream.StateCancelled {
				wantAck, wantCancelled = 1, 1
			}
			if st.Acked != wantAck || st.Cancelled != wantCancelled || st.Retried != 0 || st.Snoozed != 0 || st.DeadLettered != 0 {
				t.Errorf("Stats = %+v; want Acked %d Cancelled %d, nothing retried, snoozed or dead", st, wantAck, wantCancelled)
			}
			q.quiet("g")
		})
	}
}

// TestAttack14Cancel_notStartedStates cancels a job that is scheduled,
// waiting (no consumer), then runs a consumer: it never runs; Cancel again is
// ErrJobFinished; an untracked job and unknown IDs are ErrUnknownJob and change
// nothing; a job ID of another queue is unknown there.
func TestAttack14Cancel_notStartedStates(t *testing.T) {
	q := newA14Queue(t, nil)
	other := newA14Queue(t, nil)
	ctx := context.Background()

	waiting, _ := q.enqueue(1)
	sj, _ := stream.NewJSONJob("a14", map[string]int{"n": 2})
	if err := q.prod.EnqueueIn(ctx, sj, time.Hour); err != nil {
		t.Fatal(err)
	}
	scheduled := sj.ID
	untracked, _ := stream.NewJSONJob("a14", map[string]int{"n": 3})
	if _, err := stream.NewProducer(q.rdb, stream.ProducerConfig{Stream: q.name}).Enqueue(ctx, untracked); err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.enqueue(4)

	if was, err := control.Cancel(ctx, q.rdb, q.name, waiting); err != nil || was != stream.StateWaiting {
		t.Fatalf("Cancel waiting = %q, %v", was, err)
	}
	if was, err := control.Cancel(ctx, q.rdb, q.name, scheduled); err != nil || was != stream.StateScheduled {
		t.Fatalf("Cancel scheduled = %q, %v", was, err)
	}
	for _, id := range []string{waiting, scheduled} {
		if _, err := control.Cancel(ctx, q.rdb, q.name, id); !errors.Is(err, control.ErrJobFinished) {
			t.Errorf("second Cancel of %s = %v, want ErrJobFinished", id, err)
		}
	}
	for _, id := range []string{untracked.ID, foreign, "", "nope", strings.Repeat("x", control.MaxJobIDBytes+1), "\x00\xff{}*"} {
		was, err := control.Cancel(ctx, q.rdb, q.name, id)
		if err == nil {
			t.Errorf("Cancel(%.20q) = %q, nil; want an error", id, was)
		}
	}
	if info := other.lookup(foreign); info.State != stream.StateWaiting {
		t.Fatalf("the other queue's job is %q after a Cancel of its ID on this queue", info.State)
	}

	l := newA14Ledger()
	r := q.start("c1", consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		l.start(job.ID, "c1")
		return nil
	}), nil)
	if err := r.c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if l.count(waiting) != 0 || l.count(scheduled) != 0 {
		t.Fatalf("cancelled jobs ran: waiting %d, scheduled %d", l.count(waiting), l.count(scheduled))
	}
	if l.count(untracked.ID) != 1 {
		t.Fatalf("the untracked job ran %d times, want 1", l.count(untracked.ID))
	}
	for _, id := range []string{waiting, scheduled} {
		if s := q.lookup(id).State; s != stream.StateCancelled {
			t.Errorf("job %s is %q, want cancelled", id, s)
		}
	}
	if n := q.rdb.XLen(ctx, q.name).Val(); n != 0 {
		t.Logf("stream length %d after the run", n)
	}
	q.quiet("g")
}

// TestAttack14Cancel_severalConsumers runs long jobs on three consumers and
// cancels two: only those two handlers see ErrCancelled, each on the consumer
// that Lookup named, and the rest finish done.
func TestAttack14Cancel_severalConsumers(t *testing.T) {
	q := newA14Queue(t, nil)
	l := newA14Ledger()
	release := make(chan struct{})
	var runs []*a14run
	for _, n := range []string{"c1", "c2", "c3"} {
		runs = append(runs, q.start(n, blocking(l, n, release, func(ctx context.Context) error { return context.Cause(ctx) }),
			func(c *consumer.Config) { c.Concurrency = 2; c.Prefetch = -1 }))
	}
	var ids []string
	for i := 0; i < 6; i++ {
		id, _ := q.enqueue(i)
		ids = append(ids, id)
	}
	for _, id := range ids {
		waitCh(t, l.ch(l.started, id), 30*time.Second, "job "+id+" to start")
	}
	holders := map[string]string{}
	for _, id := range ids[:2] {
		info := q.lookup(id)
		holders[id] = info.Consumer
		if was, err := control.Cancel(context.Background(), q.rdb, q.name, id); err != nil || was != stream.StateCancelling {
			t.Fatalf("Cancel = %q, %v", was, err)
		}
		info = q.lookup(id)
		if info.State != stream.StateCancelling || info.Consumer != holders[id] {
			t.Logf("Lookup after Cancel: %+v (holder was %s)", info, holders[id])
		}
	}
	for _, id := range ids[:2] {
		waitCh(t, l.ch(l.finished, id), 20*time.Second, "cancelled job "+id+" to end")
	}
	for _, id := range ids[2:] {
		select {
		case <-l.ch(l.finished, id):
			t.Fatalf("job %s (not cancelled) ended before release: %v", id, l.causes[id])
		default:
		}
	}
	close(release)
	for _, id := range ids[:2] {
		q.waitState(id, 20*time.Second, stream.StateCancelled)
		l.mu.Lock()
		if len(l.causes[id]) != 1 || !errors.Is(l.causes[id][0], consumer.ErrCancelled) || l.startOn[id][0] != holders[id] {
			t.Errorf("job %s: causes %v on %v, want ErrCancelled once on %s", id, l.causes[id], l.startOn[id], holders[id])
		}
		l.mu.Unlock()
	}
	for _, id := range ids[2:] {
		q.waitState(id, 20*time.Second, stream.StateDone)
	}
	var st consumer.Stats
	for _, r := range runs {
		s := r.c.Stats()
		st.Acked += s.Acked
		st.Cancelled += s.Cancelled
		st.Retried += s.Retried
		st.DeadLettered += s.DeadLettered
	}
	if st.Acked != 4 || st.Cancelled != 2 || st.Retried != 0 || st.DeadLettered != 0 {
		t.Errorf("summed Stats %+v; want 4 acked, 2 cancelled", st)
	}
	q.quiet("g")
}

// a14private starts a private Redis for a test that cuts connections.
func a14private(t *testing.T) (*redistest.Server, *redis.Client) {
	srv := redistest.Start(t, redistest.Options{})
	return srv, srv.Client(t)
}

// cancelRunning enqueues one job on consumer r's queue, waits for it to run,
// cancels it through admin, and returns how long the handler took to see the
// cancel after Cancel returned. between runs after the job started and
// before Cancel; after runs right after Cancel.
func cancelLatency(t *testing.T, q *a14q, l *a14ledger, admin *redis.Client, before, after func()) (string, time.Duration) {
	t.Helper()
	id, _ := q.enqueue(1)
	waitCh(t, l.ch(l.started, id), 30*time.Second, "the job to start")
	if before != nil {
		before()
	}
	was, err := control.Cancel(context.Background(), admin, q.name, id)
	asked := time.Now()
	if err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel = %q, %v", was, err)
	}
	if after != nil {
		after()
	}
	waitCh(t, l.ch(l.finished, id), 30*time.Second, "the handler to see the cancel")
	l.mu.Lock()
	cause, took := l.causes[id][0], l.doneAt[id].Sub(asked)
	l.mu.Unlock()
	if !errors.Is(cause, consumer.ErrCancelled) {
		t.Fatalf("cause %v, want ErrCancelled", cause)
	}
	q.waitState(id, 20*time.Second, stream.StateCancelled)
	return id, took
}

// TestAttack14Cancel_messageLostThroughProxy puts a faultproxy between the
// consumer and Redis and resets every connection while the cancel is
// published (the message is lost), then delays every byte: the docs promise
// the cancel still arrives, within about a second, by the record check.
func TestAttack14Cancel_messageLostThroughProxy(t *testing.T) {
	t.Parallel()
	srv, admin := a14private(t)
	proxy, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	crdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { crdb.Close() })
	q := newA14Queue(t, admin)
	l := newA14Ledger()
	q.startOn(crdb, "c1", blocking(l, "c1", nil, func(ctx context.Context) error { return context.Cause(ctx) }), nil)

	// Lost: every connection reset during the publish, back 300 ms later.
	_, lost := cancelLatency(t, q, l, admin, proxy.Refuse, func() {
		time.Sleep(300 * time.Millisecond) // the length of the outage, not a wait for a condition
		proxy.Pass()
	})
	t.Logf("message lost (connections reset for 300 ms): handler cancelled %v after Cancel", lost)

	// Delayed: 400 ms each way on every byte.
	proxy.Delay(faultproxy.Latency{}, faultproxy.Latency{})
	_, delayed := cancelLatency(t, q, l, admin, func() {
		proxy.Delay(a14lat(400*time.Millisecond), a14lat(400*time.Millisecond))
	}, nil)
	t.Logf("every byte delayed 400 ms each way: handler cancelled %v after Cancel", delayed)
	proxy.Pass()
}

// TestAttack14Cancel_noSubscribePermission runs a consumer as a Redis user
// with the docs' consumer ACL line (docs/acl.md) but without SUBSCRIBE, as
// the README allows ("a consumer whose ACL denies SUBSCRIBE costs at most
// about a second").
func TestAttack14Cancel_noSubscribePermission(t *testing.T) {
	t.Parallel()
	a14noSubscribe(t, "")
}

// TestAttack14Cancel_noSubscribeWithMGET is the same with MGET added to the
// line: it measures the delay of the fallback.
func TestAttack14Cancel_noSubscribeWithMGET(t *testing.T) {
	t.Parallel()
	a14noSubscribe(t, " +mget")
}

func a14noSubscribe(t *testing.T, extra string) {
	srv, admin := a14private(t)
	q := newA14Queue(t, admin)
	// The docs' line (docs/acl.md), for this stream, less "+subscribe".
	line := "reset on >pw ~" + q.name + " ~{" + q.name + "}:* +xgroup|create +xgroup|delconsumer +xinfo|groups +xinfo|consumers +xreadgroup +xpending +xack +xautoclaim +xclaim +xrange +xadd +xdel +xtrim +xlen +zadd +zrangebyscore +zrem +get +set +del +time +evalsha +eval +incr +pexpire +pttl +hmget +hset +type +zremrangebyscore +zscore +zcard +zrange +hgetall &{" + q.name + "}:control" + extra
	args := []any{"ACL", "SETUSER", "a14consumer"}
	for _, f := range strings.Fields(line) {
		args = append(args, f)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	crdb := srv.Client(t, func(o *redis.Options) { o.Username, o.Password = "a14consumer", "pw" })
	l := newA14Ledger()
	r := q.startOn(crdb, "c1", blocking(l, "c1", nil, func(ctx context.Context) error { return context.Cause(ctx) }), nil)
	var took []time.Duration
	for i := 0; i < 3; i++ {
		_, d := cancelLatency(t, q, l, admin, nil, nil)
		took = append(took, d)
	}
	t.Logf("without SUBSCRIBE: handler cancelled after %v", took)
	select {
	case err := <-r.done:
		t.Fatalf("consumer stopped: %v", err)
	default:
	}
	poll.Until(t, 20*time.Second, func() (bool, string) {
		st := r.c.Stats()
		return st.Cancelled == 3, fmt.Sprintf("stats %+v, want 3 cancelled", st)
	})
}

func a14logger() *slog.Logger {
	if os.Getenv("A14_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func a14lat(d time.Duration) faultproxy.Latency {
	var l faultproxy.Latency
	l.Fixed = d
	return l
}

// TestAttack14Cancel_heldByPause cancels jobs held by a pause of their type
// (read, parked, not started): they are settled without running and never
// run after the resume.
func TestAttack14Cancel_heldByPause(t *testing.T) {
	q := newA14Queue(t, nil)
	ctx := context.Background()
	l := newA14Ledger()
	r := q.start("c1", consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		l.start(job.ID, "c1")
		return nil
	}), nil)
	if err := control.Pause(ctx, q.rdb, q.name, control.PauseOptions{Type: "a14"}); err != nil {
		t.Fatal(err)
	}
	// Wait until the consumer knows (a probe job of the type is held).
	probe, _ := q.enqueue(0)
	poll.Until(t, 20*time.Second, func() (bool, string) {
		st := r.c.Stats()
		return st.Held == 1, fmt.Sprintf("held %d, probe %+v", st.Held, q.lookup(probe))
	})
	var ids []string
	for i := 1; i <= 5; i++ {
		id, _ := q.enqueue(i)
		ids = append(ids, id)
	}
	poll.Until(t, 20*time.Second, func() (bool, string) {
		st := r.c.Stats()
		return st.Held == 6, fmt.Sprintf("held %d", st.Held)
	})
	for _, id := range append([]string{probe}, ids[:3]...) {
		was, err := control.Cancel(ctx, q.rdb, q.name, id)
		if err != nil || was != stream.StateCancelling {
			t.Fatalf("Cancel of a held job = %q, %v; want cancelling", was, err)
		}
	}
	for _, id := range append([]string{probe}, ids[:3]...) {
		q.waitState(id, 20*time.Second, stream.StateCancelled)
	}
	poll.Until(t, 20*time.Second, func() (bool, string) {
		st := r.c.Stats()
		return st.Held == 2 && st.Cancelled == 4, fmt.Sprintf("stats %+v", st)
	})
	if err := control.Resume(ctx, q.rdb, q.name, control.ResumeOptions{Type: "a14"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[3:] {
		q.waitState(id, 20*time.Second, stream.StateDone)
	}
	if err := r.c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range append([]string{probe}, ids[:3]...) {
		if n := l.count(id); n != 0 {
			t.Errorf("held job %s cancelled before it started ran %d times", id, n)
		}
	}
	if st := r.c.Stats(); st.Acked != 2 || st.Cancelled != 4 || st.Held != 0 {
		t.Errorf("Stats %+v; want 2 acked, 4 cancelled, none held", st)
	}
	q.quiet("g")
}

// TestAttack14Cancel_raceRetry races Cancel with handlers that fail fast (a
// plain error: retried with a 30 ms backoff, MaxAttempts high): whatever the
// order, each job must end cancelled, never dead, never done, and start at
// most once after Cancel returned (a run already under way may be cancelled).
func TestAttack14Cancel_raceRetry(t *testing.T) {
	q := newA14Queue(t, nil)
	ctx := context.Background()
	var mu sync.Mutex
	startsAt := map[string][]time.Time{}
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		mu.Lock()
		startsAt[job.ID] = append(startsAt[job.ID], time.Now())
		mu.Unlock()
		select {
		case <-time.After(time.Duration(rand.IntN(3)) * time.Millisecond):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		return errors.New("flaky")
	})
	var runs []*a14run
	for _, n := range []string{"c1", "c2"} {
		runs = append(runs, q.start(n, h, func(c *consumer.Config) { c.MaxAttempts = 1000; c.Concurrency = 8 }))
	}
	const n = 60
	var ids []string
	for i := 0; i < n; i++ {
		id, _ := q.enqueue(i)
		ids = append(ids, id)
	}
	cancelledAt := map[string]time.Time{}
	for _, id := range ids {
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond) // spread the cancels over attempts
		was, err := control.Cancel(ctx, q.rdb, q.name, id)
		if err != nil {
			t.Fatalf("Cancel %s = %q, %v", id, was, err)
		}
		cancelledAt[id] = time.Now()
	}
	for _, id := range ids {
		q.waitState(id, 30*time.Second, stream.StateCancelled, stream.StateDead, stream.StateDone)
	}
	for _, r := range runs {
		if err := r.c.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var cancelled uint64
	for _, r := range runs {
		st := r.c.Stats()
		cancelled += st.Cancelled
		if st.Acked != 0 || st.DeadLettered != 0 {
			t.Errorf("stats %+v: a failing job was acked or dead-lettered", st)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if s := q.lookup(id).State; s != stream.StateCancelled {
			t.Errorf("job %s ended %q, want cancelled", id, s)
		}
		late := 0
		for _, s := range startsAt[id] {
			if s.After(cancelledAt[id]) {
				late++
			}
		}
		if late > 1 {
			t.Errorf("job %s started %d times after Cancel returned (of %d runs)", id, late, len(startsAt[id]))
		}
	}
	t.Logf("%d of %d cancelled by a consumer (the rest out of the delayed set or stream)", cancelled, n)
	q.quiet("g")
}

// TestAttack14Cancel_raceCompletion races Cancel with short jobs that return
// nil or the cause: exactly one final state, matching what the handler did.
func TestAttack14Cancel_raceCompletion(t *testing.T) {
	t.Parallel()
	q := newA14Queue(t, nil)
	ctx := context.Background()
	var mu sync.Mutex
	outcome := map[string][]string{} // what each run of the handler did
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		select {
		case <-time.After(time.Duration(5+rand.IntN(30)) * time.Millisecond):
			mu.Lock()
			outcome[job.ID] = append(outcome[job.ID], "completed")
			mu.Unlock()
			return nil
		case <-ctx.Done():
			mu.Lock()
			outcome[job.ID] = append(outcome[job.ID], "cancelled")
			mu.Unlock()
			return context.Cause(ctx)
		}
	})
	r := q.start("c1", h, func(c *consumer.Config) { c.Concurrency = 4 })
	const n = 200
	var ids []string
	for i := 0; i < n; i++ {
		id, _ := q.enqueue(i)
		ids = append(ids, id)
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond)
			_, err := control.Cancel(ctx, q.rdb, q.name, id)
			if err != nil && !errors.Is(err, control.ErrJobFinished) {
				t.Errorf("Cancel %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		q.waitState(id, 30*time.Second, stream.StateCancelled, stream.StateDone)
	}
	if err := r.c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var done, cancelled int
	for _, id := range ids {
		s := q.lookup(id).State
		o := outcome[id]
		switch {
		case len(o) > 1:
			t.Errorf("job %s ran %d times: %v", id, len(o), o)
		case s == stream.StateDone && (len(o) != 1 || o[0] != "completed"):
			t.Errorf("job %s recorded done, its handler %v", id, o)
		case s == stream.StateCancelled && len(o) == 1 && o[0] == "completed":
			t.Errorf("job %s recorded cancelled, but its handler completed", id)
		}
		if s == stream.StateDone {
			done++
		} else {
			cancelled++
		}
	}
	st := r.c.Stats()
	t.Logf("%d done, %d cancelled; stats %+v", done, cancelled, st)
	if int(st.Acked) != done {
		t.Errorf("Stats.Acked %d, records done %d", st.Acked, done)
	}
	if st.Retried != 0 || st.DeadLettered != 0 {
		t.Errorf("stats %+v", st)
	}
	q.quiet("g")
}

// TestAttack14Cancel_openBreaker cancels a job that an open circuit breaker
// keeps snoozing: it ends cancelled and never reaches the handler.
func TestAttack14Cancel_openBreaker(t *testing.T) {
	q := newA14Queue(t, nil)
	ctx := context.Background()
	var ran atomic.Int64
	var first atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran.Add(1)
		if first.CompareAndSwap(false, true) {
			return errors.New("trip the breaker")
		}
		return nil
	})
	r := q.start("c1", h, nil, middleware.CircuitBreaker(middleware.CircuitBreakerConfig{Threshold: 1, OpenFor: 300 * time.Millisecond}))
	trip, _ := q.enqueue(0)
	q.waitState(trip, 20*time.Second, stream.StateRetrying, stream.StateWaiting, stream.StateDone)
	var ids []string
	for i := 1; i <= 20; i++ {
		id, _ := q.enqueue(i)
		ids = append(ids, id)
	}
	// Cancel while they bounce between the delayed set and the stream.
	for _, id := range ids {
		if _, err := control.Cancel(ctx, q.rdb, q.name, id); err != nil && !errors.Is(err, control.ErrJobFinished) {
			t.Fatalf("Cancel: %v", err)
		}
	}
	for _, id := range ids {
		info := q.waitState(id, 20*time.Second, stream.StateCancelled, stream.StateDone)
		if info.State != stream.StateCancelled {
			t.Logf("job %s ended %q (it ran before the Cancel)", id, info.State)
		}
	}
	q.waitState(trip, 20*time.Second, stream.StateDone)
	if err := r.c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("handler ran %d times; stats %+v", ran.Load(), r.c.Stats())
	q.quiet("g")
}

// TestAttack14Cancel_duringDrain cancels a running job while its consumer
// drains at shutdown (Shutdown's context without a deadline: the drain waits
// for the handler): the docs promise the consumer that holds the entry cancels
// the handler's context with cause ErrCancelled within about a second; they
// make no exception for a draining consumer.
func TestAttack14Cancel_duringDrain(t *testing.T) {
	q := newA14Queue(t, nil)
	ctx := context.Background()
	l := newA14Ledger()
	r1 := q.start("c1", blocking(l, "c1", nil, func(ctx context.Context) error { return context.Cause(ctx) }), nil)
	id, _ := q.enqueue(1)
	waitCh(t, l.ch(l.started, id), 20*time.Second, "start")
	shut := make(chan error, 1)
	go func() { shut <- r1.c.Shutdown(context.Background()) }()
	poll.Until(t, 20*time.Second, poll.True("the consumer draining", func() bool { return r1.c.Health().Draining }))
	if was, err := control.Cancel(ctx, q.rdb, q.name, id); err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel = %q, %v", was, err)
	}
	asked := time.Now()
	select {
	case <-l.ch(l.finished, id):
		l.mu.Lock()
		cause := l.causes[id][0]
		l.mu.Unlock()
		t.Logf("handler saw %v %v after Cancel", cause, time.Since(asked))
		if !errors.Is(cause, consumer.ErrCancelled) {
			t.Errorf("cause %v, want ErrCancelled", cause)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("a draining consumer did not cancel its running job within 20 s of Cancel; record %+v", q.lookup(id))
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown did not return once the job was cancelled")
	}
	q.waitState(id, 20*time.Second, stream.StateCancelled)
	if st := r1.c.Stats(); st.Cancelled != 1 {
		t.Errorf("stats %+v", st)
	}
	q.quiet("g")
}

// TestAttack14Cancel_shutdownGiveBack cancels running jobs at the moment
// their consumer shuts down with a 50 ms drain deadline: whether the cancel
// or ErrShutdown reaches a handler first (a job given back stays pending,
// its record cancelling), every job ends cancelled and a second consumer
// never runs one.
func TestAttack14Cancel_shutdownGiveBack(t *testing.T) {
	q := newA14Queue(t, nil)
	ctx := context.Background()
	l := newA14Ledger()
	r1 := q.start("c1", blocking(l, "c1", nil, func(ctx context.Context) error { return context.Cause(ctx) }),
		func(c *consumer.Config) { c.ShutdownTimeout = 50 * time.Millisecond; c.Concurrency = 8 })
	var ids []string
	for i := 0; i < 8; i++ {
		id, _ := q.enqueue(i)
		ids = append(ids, id)
	}
	for _, id := range ids {
		waitCh(t, l.ch(l.started, id), 20*time.Second, "start")
	}
	r1.stop() // Run's context: drain for ShutdownTimeout, then ErrShutdown
	for _, id := range ids {
		if was, err := control.Cancel(ctx, q.rdb, q.name, id); err != nil {
			t.Fatalf("Cancel = %q, %v", was, err)
		}
	}
	select {
	case <-r1.done:
	case <-time.After(20 * time.Second):
		t.Fatal("c1 did not stop")
	}
	st1 := r1.c.Stats()
	l.mu.Lock()
	var byCancel, byShutdown int
	for _, id := range ids {
		switch c := l.causes[id][0]; {
		case errors.Is(c, consumer.ErrCancelled):
			byCancel++
		case errors.Is(c, consumer.ErrShutdown):
			byShutdown++
		default:
			t.Errorf("job %s ended with cause %v", id, c)
		}
	}
	l.mu.Unlock()
	var ran2 atomic.Int64
	r2 := q.start("c2", consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran2.Add(1)
		return nil
	}), nil)
	for _, id := range ids {
		q.waitState(id, 30*time.Second, stream.StateCancelled, stream.StateDone)
	}
	if err := r2.c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	st2 := r2.c.Stats()
	t.Logf("handlers ended by the cancel %d, by shutdown %d; c1 %+v; c2 %+v", byCancel, byShutdown, st1, st2)
	for _, id := range ids {
		if s := q.lookup(id).State; s != stream.StateCancelled {
			t.Errorf("job %s ended %q, want cancelled", id, s)
		}
	}
	if ran2.Load() != 0 {
		t.Errorf("c2 ran %d cancelled jobs", ran2.Load())
	}
	if st1.Cancelled+st2.Cancelled != uint64(len(ids)) || st1.Acked+st2.Acked != 0 {
		t.Errorf("cancelled %d+%d acked %d+%d, want %d cancelled", st1.Cancelled, st2.Cancelled, st1.Acked, st2.Acked, len(ids))
	}
	q.quiet("g")
}

// TestCancel_givenBackThenCancelled stops a consumer whose handlers end
// by ErrShutdown (the jobs are given back, their delivery count lowered:
// no suspects), then cancels the jobs, pending with nobody running them: the
// consumer that reclaims them settles them cancelled without running them;
// the untracked job given back beside them runs.
func TestCancel_givenBackThenCancelled(t *testing.T) {
	q := newA14Queue(t, nil)
	ctx := context.Background()
	l := newA14Ledger()
	r1 := q.start("c1", blocking(l, "c1", nil, func(ctx context.Context) error { return context.Cause(ctx) }),
		func(c *consumer.Config) { c.ShutdownTimeout = time.Millisecond })
	var ids []string
	for i := 0; i < 3; i++ {
		id, _ := q.enqueue(i)
		ids = append(ids, id)
	}
	uj, _ := stream.NewJSONJob("a14", map[string]int{"n": 9})
	if _, err := stream.NewProducer(q.rdb, stream.ProducerConfig{Stream: q.name}).Enqueue(ctx, uj); err != nil {
		t.Fatal(err)
	}
	for _, id := range append([]string{uj.ID}, ids...) {
		waitCh(t, l.ch(l.started, id), 20*time.Second, "start")
	}
	r1.stop()
	<-r1.stopped
	l.mu.Lock()
	for _, id := range ids {
		if c := l.causes[id]; len(c) != 1 || !errors.Is(c[0], consumer.ErrShutdown) {
			l.mu.Unlock()
			t.Fatalf("job %s ended with %v before the cancel, want ErrShutdown: the precondition broke", id, c)
		}
	}
	l.mu.Unlock()
	for _, id := range ids {
		if was, err := control.Cancel(ctx, q.rdb, q.name, id); err != nil || was != stream.StateCancelling {
			t.Fatalf("Cancel of a given-back job = %q, %v; want cancelling", was, err)
		}
	}
	var ran2 sync.Map
	r2 := q.start("c2", consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		ran2.Store(job.ID, true)
		return nil
	}), nil)
	for _, id := range ids {
		q.waitState(id, 30*time.Second, stream.StateCancelled, stream.StateDone)
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		_, ok := ran2.Load(uj.ID)
		return ok, "the untracked job given back has not run on c2"
	})
	if err := r2.c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if s := q.lookup(id).State; s != stream.StateCancelled {
			t.Errorf("job %s ended %q, want cancelled", id, s)
		}
		if _, ok := ran2.Load(id); ok {
			t.Errorf("c2 ran cancelled job %s", id)
		}
	}
	if st := r2.c.Stats(); st.Cancelled != 3 || st.Acked != 1 {
		t.Errorf("c2 stats %+v; want 3 cancelled, 1 acked", st)
	}
	q.quiet("g")
}

// TestAttack14Cancel_hostileControlMessages publishes garbage, huge and
// forged "cancel" messages on the queue's control channel while tracked and
// untracked jobs run: nothing that Cancel was not asked for is cancelled, and
// the consumer keeps running.
func TestAttack14Cancel_hostileControlMessages(t *testing.T) {
	t.Parallel()
	q := newA14Queue(t, nil)
	otherQ := newA14Queue(t, nil)
	ctx := context.Background()
	l := newA14Ledger()
	release := make(chan struct{})
	r := q.start("c1", blocking(l, "c1", release, func(ctx context.Context) error { return context.Cause(ctx) }),
		func(c *consumer.Config) { c.Concurrency = 8 })
	tracked, trackedEntry := q.enqueue(1)
	uj, _ := stream.NewJSONJob("a14", map[string]int{"n": 2})
	untrackedEntry, err := stream.NewProducer(q.rdb, stream.ProducerConfig{Stream: q.name}).Enqueue(ctx, uj)
	if err != nil {
		t.Fatal(err)
	}
	victim, victimEntry := q.enqueue(3) // will be cancelled for real, as the control
	_, foreignEntry := otherQ.enqueue(4)
	for _, id := range []string{tracked, uj.ID, victim} {
		waitCh(t, l.ch(l.started, id), 20*time.Second, "start of "+id)
	}
	msgs := []string{
		"cancel " + trackedEntry,   // a forged cancel of a tracked job nobody cancelled
		"cancel " + untrackedEntry, // and of an untracked one
		"cancel " + foreignEntry,
		"cancel",
		"cancel ",
		"cancel  " + trackedEntry,
		"cancel " + trackedEntry + " " + untrackedEntry,
		"cancel " + strings.Repeat("9", 1<<20),
		"cancel 0-0",
		"cancel 18446744073709551615-18446744073709551615",
		"cancel \x00\xff\xfe",
		"cancel -",
		"cancel +",
		"CANCEL " + untrackedEntry,
		strings.Repeat("x", 4<<20),
		"",
		"pause",
		"resume",
	}
	for _, m := range msgs {
		if err := q.rdb.Publish(ctx, q.keys.Control, m).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The real cancel, published after the forged ones, is a barrier: once
	// its handler has seen it the forged ones were read too.
	if was, err := control.Cancel(ctx, q.rdb, q.name, victim); err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel = %q, %v", was, err)
	}
	waitCh(t, l.ch(l.finished, victim), 20*time.Second, "the real cancel")
	// Give the per-second record check a few rounds too.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, id := range []string{tracked, uj.ID} {
			select {
			case <-l.ch(l.finished, id):
				l.mu.Lock()
				t.Fatalf("job %s was cancelled by a forged control message: %v", id, l.causes[id])
				l.mu.Unlock()
			default:
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = victimEntry
	close(release)
	if err := r.c.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		t.Fatalf("consumer stopped: %v", err)
	default:
	}
	if s := q.lookup(tracked).State; s != stream.StateDone {
		t.Errorf("forged-cancel tracked job ended %q, want done", s)
	}
	if s := q.lookup(victim).State; s != stream.StateCancelled {
		t.Errorf("cancelled job ended %q", s)
	}
	if st := r.c.Stats(); st.Acked != 2 || st.Cancelled != 1 {
		t.Errorf("stats %+v; want 2 acked, 1 cancelled", st)
	}
	q.quiet("g")
}
