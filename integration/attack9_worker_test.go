package integration

// Shared pieces of the attack9 tests: a worker subprocess of their own (the
// harness's worker cannot crash at random, keep settled entries or run the
// idempotency middleware), its job behaviours, and counting helpers. These
// tests are written from the README and the godoc only.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func init() { subprocessModes["attack9"] = a9WorkerMain }

// a9Config configures one attack9 worker subprocess (JSON in PW9_CONFIG).
type a9Config struct {
	Addr, Stream, Group, Consumer, Ledger string

	Visibility, Sweep, Heartbeat, Block, Shutdown time.Duration
	Concurrency, MaxCrashes, MaxAttempts          int
	Prefetch                                      int // 0: the default
	KeepSettled                                   bool
	DeadLetterMaxLen                              int64

	// Idem runs middleware.Idempotency (Redis store under IdemPrefix, lease
	// IdemLease) and middleware.Retry (MaxAttempts) around the handler.
	Idem       bool
	IdemPrefix string
	IdemLease  time.Duration
	// Lock runs middleware.Lock (lockx under IdemPrefix+"lock:", TTL
	// LockTTL, the key per job ID) outermost.
	Lock    bool
	LockTTL time.Duration
	// FixFile: a job marked Broken fails (as its Fail says) while this file
	// does not exist: creating it is "deploying the fix".
	FixFile string
}

// a9Job is the payload of an attack9 job: what the handler does.
type a9Job struct {
	SleepMS int `json:"sleep_ms,omitempty"`
	// SleepOn limits the sleep to the worker of that consumer name.
	SleepOn   string `json:"sleep_on,omitempty"`
	IgnoreCtx bool   `json:"ignore_ctx,omitempty"`
	// Crash "before" SIGKILLs the worker after the sleep and before the
	// effect, "after" after the effect.
	Crash string `json:"crash,omitempty"`
	// CrashOn limits Crash to the worker of that consumer name.
	CrashOn string `json:"crash_on,omitempty"`
	// CrashPct, when positive, limits Crash to that percentage of runs.
	CrashPct int `json:"crash_pct,omitempty"`
	// Fail: "retry" (plain error), "permanent", "panic", "snooze" (the
	// first FailTimes runs), after the effect is NOT recorded.
	Fail string `json:"fail,omitempty"`
	// Broken: fail as Fail says only while the fix file is missing.
	Broken bool `json:"broken,omitempty"`
	// FailAttempts, when positive, limits Fail to runs with Attempt below it.
	FailAttempts int `json:"fail_attempts,omitempty"`
	// WaitFile makes the handler wait (after the sleep) until this file
	// exists, or its context ends.
	WaitFile string `json:"wait_file,omitempty"`
	// N distinguishes otherwise equal payloads.
	N int `json:"n,omitempty"`
}

// a9Record appends one ledger line in the harness's format.
func a9Record(w io.Writer, mu *sync.Mutex, event string, job *stream.Job, me string) {
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(w, "%s %s %s %s %d %d %d\n", event, job.ID, job.EntryID, me, job.Deliveries, job.Attempt, time.Now().UnixNano())
}

// a9Handler is the handler of the attack9 worker (also used in process).
func a9Handler(ledger io.Writer, me, fixFile string) consumer.HandlerFunc {
	var mu sync.Mutex
	return func(ctx context.Context, job *stream.Job) error {
		var b a9Job
		if err := job.Decode(&b); err != nil {
			return err
		}
		a9Record(ledger, &mu, "start", job, me)
		cancelled := func() error {
			ev := "cancelled"
			switch cause := context.Cause(ctx); {
			case errors.Is(cause, consumer.ErrLeaseLost):
				ev = "cancel_lease"
			case errors.Is(cause, consumer.ErrShutdown):
				ev = "cancel_shutdown"
			}
			a9Record(ledger, &mu, ev, job, me)
			return context.Cause(ctx)
		}
		crash := b.Crash != "" && (b.CrashOn == "" || b.CrashOn == me) &&
			(b.CrashPct <= 0 || rand.IntN(100) < b.CrashPct)
		if b.SleepMS > 0 && (b.SleepOn == "" || b.SleepOn == me) {
			t := time.NewTimer(time.Duration(b.SleepMS) * time.Millisecond)
			defer t.Stop()
			if b.IgnoreCtx {
				<-t.C
			} else {
				select {
				case <-t.C:
				case <-ctx.Done():
					return cancelled()
				}
			}
		}
		for b.WaitFile != "" {
			if _, err := os.Stat(b.WaitFile); err == nil {
				break
			}
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
				return cancelled()
			}
		}
		if ctx.Err() != nil {
			a9Record(ledger, &mu, "late", job, me)
		}
		if crash && b.Crash == "before" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		fixed := true
		if b.Broken {
			_, err := os.Stat(fixFile)
			fixed = err == nil
		}
		if b.Fail != "" && (!b.Broken || !fixed) && (b.FailAttempts <= 0 || job.Attempt < b.FailAttempts) {
			a9Record(ledger, &mu, "fail", job, me)
			switch b.Fail {
			case "retry":
				return fmt.Errorf("boom %s attempt %d", job.ID, job.Attempt)
			case "permanent":
				return consumer.Permanent(fmt.Errorf("never %s attempt %d", job.ID, job.Attempt))
			case "panic":
				panic(fmt.Sprintf("panic %s attempt %d", job.ID, job.Attempt))
			case "snooze":
				return consumer.Snooze(20 * time.Millisecond)
			}
		}
		a9Record(ledger, &mu, "effect", job, me)
		if crash && b.Crash == "after" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		return nil
	}
}

// a9WorkerMain runs one consumer configured by PW9_CONFIG until SIGTERM.
func a9WorkerMain() int {
	var cfg a9Config
	if err := json.Unmarshal([]byte(os.Getenv("PW9_CONFIG")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bad PW9_CONFIG:", err)
		return 2
	}
	ledger, err := os.OpenFile(cfg.Ledger, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr, MaxRetries: -1})
	defer rdb.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c := consumer.New(rdb, consumer.Config{
		Stream:            cfg.Stream,
		Group:             cfg.Group,
		Consumer:          cfg.Consumer,
		VisibilityTimeout: cfg.Visibility,
		SweepInterval:     cfg.Sweep,
		HeartbeatInterval: cfg.Heartbeat,
		Block:             cfg.Block,
		ShutdownTimeout:   cfg.Shutdown,
		Concurrency:       cfg.Concurrency,
		Prefetch:          cfg.Prefetch,
		MaxCrashes:        cfg.MaxCrashes,
		MaxAttempts:       cfg.MaxAttempts,
		KeepSettled:       cfg.KeepSettled,
		DeadLetterMaxLen:  cfg.DeadLetterMaxLen,
		PromoteInterval:   50 * time.Millisecond,
		Backoff:           consumer.Backoff{Base: 30 * time.Millisecond, Cap: 30 * time.Millisecond},
		Logger:            logger,
	})
	if cfg.Lock {
		c.Use(middleware.Lock(rdb, middleware.LockConfig{Prefix: cfg.IdemPrefix + "lock:", TTL: cfg.LockTTL, ConflictDelay: 100 * time.Millisecond,
			Key: func(j *stream.Job) string { return "job-" + j.ID }}))
	}
	if cfg.Idem {
		store := idem.NewRedisStore(rdb, idem.RedisConfig{})
		c.Use(
			middleware.Idempotency(store, middleware.IdempotencyConfig{Prefix: cfg.IdemPrefix, Lease: cfg.IdemLease, InProgressDelay: 100 * time.Millisecond, Logger: logger}),
			middleware.Retry(middleware.RetryConfig{}),
		)
	}
	c.Handle(a9Handler(ledger, cfg.Consumer, cfg.FixFile))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = c.Run(ctx)
	fmt.Fprintf(os.Stderr, "PW9_RUN_RETURNED %d\n", time.Now().UnixNano())
	st, _ := json.Marshal(c.Stats())
	fmt.Fprintf(os.Stderr, "PW_STATS %s\n", st)
	if err != nil {
		fmt.Fprintf(os.Stderr, "PW_RUN_ERROR %v\n", err)
		fmt.Fprintf(os.Stderr, "PW9_EXIT %d\n", time.Now().UnixNano())
		return 3
	}
	fmt.Fprintf(os.Stderr, "PW9_EXIT %d\n", time.Now().UnixNano())
	return 0
}

// newA9Scenario is newScenario on the shared Redis that also deletes the
// queue's crash counters at the end.
func newA9Scenario(t testing.TB) *scenario {
	s := newScenario(t, nil, "")
	t.Cleanup(func() { redistest.DeleteKeys(s.rdb, s.keys.Crashes+"*") })
	return s
}

// a9Worker starts an attack9 worker on s's stream with cfg (zero values:
// visibility 600ms, sweep 100ms, heartbeat visibility/4, block 200ms,
// shutdown 2s, concurrency 8, max crashes 3, max attempts 25, group "g").
func (s *scenario) a9Worker(name string, cfg a9Config) *worker {
	s.t.Helper()
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.Visibility, 600*time.Millisecond)
	def(&cfg.Sweep, 100*time.Millisecond)
	def(&cfg.Heartbeat, cfg.Visibility/4)
	def(&cfg.Block, 200*time.Millisecond)
	def(&cfg.Shutdown, 2*time.Second)
	def(&cfg.IdemLease, 5*time.Second)
	def(&cfg.LockTTL, 5*time.Second)
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 8
	}
	if cfg.MaxCrashes == 0 {
		cfg.MaxCrashes = 3
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 25
	}
	if cfg.Group == "" {
		cfg.Group = "g"
	}
	if cfg.Addr == "" {
		cfg.Addr = s.addr
	}
	cfg.Stream, cfg.Consumer, cfg.Ledger = s.stream, name, s.ledger
	b, err := json.Marshal(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	w := startSubprocess(s.t, "attack9", "PW9_CONFIG="+string(b))
	w.name = name
	return w
}

// a9Enqueue adds one job per behaviour and returns the job IDs in order.
func (s *scenario) a9Enqueue(jobs ...a9Job) []string {
	s.t.Helper()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	js := make([]*stream.Job, len(jobs))
	for i, b := range jobs {
		j, err := stream.NewJSONJob("a9", b)
		if err != nil {
			s.t.Fatal(err)
		}
		j.IdempotencyKey = "op-" + s.stream + "-" + fmt.Sprint(i) + "-" + fmt.Sprint(time.Now().UnixNano())
		js[i] = j
	}
	for i := 0; i < len(js); i += 500 {
		if _, err := p.EnqueueBatch(context.Background(), js[i:min(i+500, len(js))]); err != nil {
			s.t.Fatal(err)
		}
	}
	ids := make([]string, len(js))
	for i, j := range js {
		ids[i] = j.ID
	}
	return ids
}

// a9Repeat returns n copies of b, numbered.
func a9Repeat(n int, b a9Job) []a9Job {
	out := make([]a9Job, n)
	for i := range out {
		out[i] = b
		out[i].N = i
	}
	return out
}

// a9Dead is one dead-letter entry, decoded loosely.
type a9Dead struct {
	ID, JobID, Reason, Error, LastError, ErrorHistory string
	Fields                                            map[string]string
}

// a9DeadLetters returns the dead-letter entries of s.
func (s *scenario) a9DeadLetters() []a9Dead {
	s.t.Helper()
	var out []a9Dead
	for _, m := range s.dead() {
		d := a9Dead{ID: m.ID, Fields: map[string]string{}}
		for k, v := range m.Values {
			d.Fields[k] = fmt.Sprint(v)
		}
		d.JobID = d.Fields["job_id"]
		d.Reason = d.Fields["dead_reason"]
		d.Error = d.Fields["dead_error"]
		d.LastError = d.Fields["last_error"]
		d.ErrorHistory = d.Fields["error_history"]
		out = append(out, d)
	}
	return out
}

// a9DeadByJob returns, per job ID, the reasons it was dead-lettered with.
func (s *scenario) a9DeadByJob() map[string][]string {
	s.t.Helper()
	out := map[string][]string{}
	for _, d := range s.a9DeadLetters() {
		out[d.JobID] = append(out[d.JobID], d.Reason)
	}
	return out
}

// a9Queue is a snapshot of a queue's state.
type a9Queue struct {
	Len, Pending, Delayed, Dead int64
}

func (q a9Queue) String() string {
	return fmt.Sprintf("len=%d pending=%d delayed=%d dead=%d", q.Len, q.Pending, q.Delayed, q.Dead)
}

// a9State reads the queue's state for group.
func (s *scenario) a9State(group string) a9Queue {
	s.t.Helper()
	ctx := context.Background()
	var q a9Queue
	q.Len, _ = s.rdb.XLen(ctx, s.stream).Result()
	if p, err := s.rdb.XPending(ctx, s.stream, group).Result(); err == nil {
		q.Pending = p.Count
	}
	q.Delayed, _ = s.rdb.ZCard(ctx, s.keys.Delayed).Result()
	q.Dead, _ = s.rdb.XLen(ctx, s.keys.Dead).Result()
	return q
}

// a9Idle reports whether nothing is pending in group nor delayed.
func (s *scenario) a9Idle(group string) bool {
	q := s.a9State(group)
	return q.Pending == 0 && q.Delayed == 0
}

// a9Missing returns the job IDs of ids without an event in entries.
func a9Missing(entries []ledgerEntry, event string, ids []string) []string {
	n := countEvents(entries, event)
	var out []string
	for _, id := range ids {
		if n[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// a9Short abbreviates a list of IDs for messages.
func a9Short(ids []string) string {
	sort.Strings(ids)
	if len(ids) > 5 {
		return strings.Join(ids[:5], ",") + fmt.Sprintf(",... (%d)", len(ids))
	}
	return strings.Join(ids, ",")
}

// a9Exited reports whether w has exited.
func a9Exited(w *worker) bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// a9Supervisor keeps a set of attack9 workers running: a worker that exited
// (crashed) is started again, under the same name or a new one.
type a9Supervisor struct {
	s        *scenario
	cfg      a9Config
	newNames bool
	workers  map[string]*worker // slot -> current worker
	names    map[string]string  // slot -> current name
	restarts int
	// delay is how long a crashed worker stays down before its restart.
	delay time.Duration
}

func (s *scenario) a9Supervise(slots []string, cfg a9Config, newNames bool) *a9Supervisor {
	sv := &a9Supervisor{s: s, cfg: cfg, newNames: newNames, workers: map[string]*worker{}, names: map[string]string{}}
	for _, slot := range slots {
		sv.names[slot] = slot
		sv.workers[slot] = s.a9Worker(slot, cfg)
	}
	return sv
}

// tick restarts the workers that exited.
func (sv *a9Supervisor) tick() {
	for slot, w := range sv.workers {
		if !a9Exited(w) {
			continue
		}
		if !w.killed() {
			sv.s.t.Fatalf("worker %s exited without SIGKILL: %v\n%s", w.name, w.err, tail(w.stderr.String(), 3000))
		}
		sv.restarts++
		time.Sleep(sv.delay)
		name := slot
		if sv.newNames {
			name = fmt.Sprintf("%s-r%d", slot, sv.restarts)
		}
		sv.names[slot] = name
		sv.workers[slot] = sv.s.a9Worker(name, sv.cfg)
	}
}

// until supervises until cond holds, failing after timeout.
func (sv *a9Supervisor) until(timeout time.Duration, cond func() (bool, string)) {
	sv.s.t.Helper()
	eventually(sv.s.t, timeout, func() (bool, string) {
		sv.tick()
		return cond()
	})
}

// stopAll SIGTERMs every running worker and waits for them; it returns the
// sum of the stats they printed.
func (sv *a9Supervisor) stopAll() consumer.Stats {
	sv.s.t.Helper()
	var sum consumer.Stats
	for _, w := range sv.workers {
		if a9Exited(w) {
			continue
		}
		w.term()
		_ = w.wait(30 * time.Second)
		st, _ := w.stats()
		sum.Acked += st.Acked
		sum.Suspects += st.Suspects
		sum.DeadLettered += st.DeadLettered
	}
	return sum
}

// a9Proc is a consumer running in the test's process.
type a9Proc struct {
	t    testing.TB
	c    *consumer.Consumer
	done chan error
	once sync.Once
	err  error
}

// a9Run starts a consumer of s's stream in this process, with a9Handler
// writing to s's ledger (its fix file is the ledger's name + ".fix"); cfg's zero fields get test defaults (group "g",
// visibility 2s, sweep 200ms, block 200ms, promote 50ms, retry backoff
// 30ms). The consumer is shut down at the end of the test.
func (s *scenario) a9Run(name string, cfg consumer.Config, mws ...consumer.Middleware) *a9Proc {
	s.t.Helper()
	ledger, err := os.OpenFile(s.ledger, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { ledger.Close() })
	if cfg.Stream == "" {
		cfg.Stream = s.stream
	}
	if cfg.Group == "" {
		cfg.Group = "g"
	}
	cfg.Consumer = name
	if cfg.VisibilityTimeout == 0 {
		cfg.VisibilityTimeout = 2 * time.Second
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = 200 * time.Millisecond
	}
	if cfg.Block == 0 {
		cfg.Block = 200 * time.Millisecond
	}
	if cfg.PromoteInterval == 0 {
		cfg.PromoteInterval = 50 * time.Millisecond
	}
	if cfg.Backoff == (consumer.Backoff{}) {
		cfg.Backoff = consumer.Backoff{Base: 30 * time.Millisecond, Cap: 30 * time.Millisecond}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	p := &a9Proc{t: s.t, done: make(chan error, 1)}
	p.c = consumer.New(s.rdb, cfg).Use(mws...).Handle(a9Handler(ledger, name, s.ledger+".fix"))
	go func() { p.done <- p.c.Run(context.Background()) }()
	s.t.Cleanup(func() { p.stop() })
	return p
}

// stop shuts the consumer down and returns Run's error.
func (p *a9Proc) stop() error {
	p.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = p.c.Shutdown(ctx)
		select {
		case p.err = <-p.done:
		case <-time.After(30 * time.Second):
			p.t.Errorf("consumer did not stop")
		}
	})
	return p.err
}

// quietA9 is a logger that drops everything.
func quietA9() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
