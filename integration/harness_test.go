package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/leakcheck"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// The worker subprocess: the test binary re-executed with PW_WORKER=1 runs
// one consumer configured by PW_* variables, whose handler does what each
// job's payload (a [behaviour]) says, including SIGKILLing its own process
// at a chosen point. Every start, side effect and observed cancellation is
// appended to a ledger file, with the worker's time, which outlives the
// process, so a test can count what ran where and when. The worker also
// reports when it noticed SIGTERM and how long it stalled (see
// watchStalls), so that tests derive their timing bounds from what happened.

func TestMain(m *testing.M) {
	if os.Getenv("PW_WORKER") == "1" {
		os.Exit(workerMain())
	}
	if mode := os.Getenv("PW_MODE"); mode != "" {
		main, ok := subprocessModes[mode]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown PW_MODE %q\n", mode)
			os.Exit(2)
		}
		os.Exit(main())
	}
	redistest.WidenParallel(4) // most of its tests wait far more than they compute
	code := leakcheck.Run(m, 5*time.Second, "pelican/consumer.(*Consumer)", "pelican/claim.", "faultproxy.(*Proxy)")
	if cliDir != "" {
		os.RemoveAll(cliDir)
	}
	os.Exit(code)
}

// idleCases is how many subtests of one idleRuns run at once.
const idleCases = 8

// idleRuns runs a test's subtests from goroutines of the test (which the
// testing package allows), up to idleCases at once: for cases that spend
// their time waiting on Block, ReadTimeout, outages and visibility
// timeouts rather than computing, so that a family of them takes its
// parent's slot only instead of one of the -test.parallel slots per case
// (the attack30 read families: 330 s of the package's slot time in a quiet
// run, nearly all of it waiting). The subtests must not call t.Parallel.
type idleRuns struct {
	t   *testing.T
	sem chan struct{}
	wg  sync.WaitGroup
}

// runIdle returns an idleRuns for t's subtests. Call its Wait before t's
// function returns.
func runIdle(t *testing.T) *idleRuns {
	return &idleRuns{t: t, sem: make(chan struct{}, idleCases)}
}

// Run starts f as the subtest name and returns at once.
func (r *idleRuns) Run(name string, f func(t *testing.T)) {
	r.wg.Go(func() {
		r.sem <- struct{}{}
		defer func() { <-r.sem }()
		r.t.Run(name, f)
	})
}

// Wait waits for every subtest started by Run.
func (r *idleRuns) Wait() { r.wg.Wait() }

var (
	cliOnce sync.Once
	cliDir  string
	cliPath string
	cliErr  error
)

// pelicanCLI returns the path of the pelican command, built once for the
// whole package with the race detector (a build takes a minute or more on a
// loaded machine, and a race in the command is a bug like any other).
func pelicanCLI(t testing.TB) string {
	t.Helper()
	cliOnce.Do(func() {
		if cliDir, cliErr = os.MkdirTemp("", "pelican-cli"); cliErr != nil {
			return
		}
		cliPath = filepath.Join(cliDir, "pelican")
		out, err := exec.Command("go", "build", "-race", "-o", cliPath, "github.com/pelicanqueue/pelican/cmd/pelican").CombinedOutput()
		if err != nil {
			cliErr = fmt.Errorf("go build ./cmd/pelican: %v\n%s", err, out)
		}
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliPath
}

// subprocessModes are other subprocess programs of the test binary, run when
// PW_MODE names them (test files register theirs in init functions).
// Start one with startSubprocess.
var subprocessModes = map[string]func() int{}

// startSubprocess re-executes the test binary in mode with extra
// environment variables; the process is SIGKILLed at the end of the test if
// still running.
func startSubprocess(t testing.TB, mode string, env ...string) *worker {
	t.Helper()
	if _, ok := subprocessModes[mode]; !ok {
		t.Fatalf("no subprocess mode %q registered", mode)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "PW_MODE="+mode), env...)
	w := &worker{t: t, name: mode, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = w.stderr
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", mode, err)
	}
	go func() {
		w.err = cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-w.done
		if t.Failed() {
			t.Logf("%s output:\n%s", mode, tail(w.stderr.String(), 4000))
		}
	})
	return w
}

// behaviour is a job's payload in these tests: what the worker's handler does.
type behaviour struct {
	// SleepMS is how long the handler works before its side effect.
	SleepMS int `json:"sleep_ms,omitempty"`
	// SleepOn limits the sleep to the worker with this consumer name;
	// empty means every worker.
	SleepOn string `json:"sleep_on,omitempty"`
	// Crash: "before" SIGKILLs the worker after the sleep and before the
	// effect; "after" SIGKILLs it after the effect, before the handler
	// returns (so before the ack).
	Crash string `json:"crash,omitempty"`
	// CrashOn limits Crash to the worker with this consumer name; empty
	// means every worker.
	CrashOn string `json:"crash_on,omitempty"`
	// IgnoreCtx makes the sleep ignore the handler's context.
	IgnoreCtx bool `json:"ignore_ctx,omitempty"`
	// Fail makes the handler return a permanent error after the effect.
	Fail bool `json:"fail,omitempty"`
}

// workerOpts configures a worker subprocess; zero durations and counts take
// the test defaults of startWorker.
type workerOpts struct {
	Addr        string
	Stream      string
	Group       string
	Consumer    string
	Ledger      string
	Visibility  time.Duration
	Sweep       time.Duration
	Heartbeat   time.Duration // negative disables the heartbeat
	Block       time.Duration
	Shutdown    time.Duration
	Concurrency int
	Prefetch    int // 0: the default; negative disables
	MaxCrashes  int
}

// worker is a running worker subprocess.
type worker struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error // set when done is closed
}

// startWorker starts a worker subprocess; it is SIGKILLed at the end of the
// test if still running.
func startWorker(t testing.TB, o workerOpts) *worker {
	t.Helper()
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.Visibility, 600*time.Millisecond)
	def(&o.Sweep, 100*time.Millisecond)
	def(&o.Heartbeat, o.Visibility/4)
	def(&o.Block, 200*time.Millisecond)
	def(&o.Shutdown, 2*time.Second)
	if o.Concurrency == 0 {
		o.Concurrency = 8
	}
	if o.MaxCrashes == 0 {
		o.MaxCrashes = 10
	}
	if o.Group == "" {
		o.Group = "g"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"PW_WORKER=1",
		"PW_ADDR="+o.Addr, "PW_STREAM="+o.Stream, "PW_GROUP="+o.Group, "PW_CONSUMER="+o.Consumer,
		"PW_LEDGER="+o.Ledger,
		"PW_VISIBILITY="+o.Visibility.String(), "PW_SWEEP="+o.Sweep.String(),
		"PW_HEARTBEAT="+o.Heartbeat.String(), "PW_BLOCK="+o.Block.String(),
		"PW_SHUTDOWN="+o.Shutdown.String(),
		"PW_CONCURRENCY="+strconv.Itoa(o.Concurrency), "PW_MAX_CRASHES="+strconv.Itoa(o.MaxCrashes),
		"PW_PREFETCH="+strconv.Itoa(o.Prefetch),
	)
	w := &worker{t: t, name: o.Consumer, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker %s: %v", o.Consumer, err)
	}
	go func() {
		w.err = cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-w.done
		if t.Failed() {
			t.Logf("worker %s stderr:\n%s", w.name, tail(w.stderr.String(), 4000))
		}
	})
	return w
}

func (w *worker) signal(sig syscall.Signal) {
	w.t.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		w.t.Fatalf("signal %v to worker %s: %v", sig, w.name, err)
	}
}

// kill SIGKILLs the worker and waits for it to exit.
func (w *worker) kill() {
	w.t.Helper()
	_ = w.cmd.Process.Kill()
	<-w.done
}

// stop and cont send SIGSTOP and SIGCONT.
func (w *worker) stop() { w.signal(syscall.SIGSTOP) }
func (w *worker) cont() { w.signal(syscall.SIGCONT) }

// term sends SIGTERM: the worker shuts down gracefully.
func (w *worker) term() { w.signal(syscall.SIGTERM) }

// wait waits up to d for the worker to exit and returns its exit error.
func (w *worker) wait(d time.Duration) error {
	w.t.Helper()
	select {
	case <-w.done:
		return w.err
	case <-time.After(d):
		w.t.Fatalf("worker %s still running after %v", w.name, d)
		return nil
	}
}

// exitedBy reports whether the worker has exited and was killed by SIGKILL
// (its own crash point, or the test).
func (w *worker) killed() bool {
	select {
	case <-w.done:
	default:
		return false
	}
	ws, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// stats returns the consumer stats the worker printed when it exited.
func (w *worker) stats() (consumer.Stats, bool) {
	for _, line := range strings.Split(w.stderr.String(), "\n") {
		if s, ok := strings.CutPrefix(line, "PW_STATS "); ok {
			var st consumer.Stats
			if json.Unmarshal([]byte(s), &st) == nil {
				return st, true
			}
		}
	}
	return consumer.Stats{}, false
}

// watchStalls starts a [redistest.StallWatch] on rdb in a subprocess and
// returns it with a function that stops it and prints the longest stall on
// stderr, where [worker.longestStall] finds it. Call that when the
// subprocess's consumer has returned.
func watchStalls(rdb redis.UniversalClient) (w *redistest.StallWatch, report func()) {
	w = redistest.WatchStalls(rdb, 2*redistest.StallInterval)
	return w, func() {
		w.Stop()
		fmt.Fprintf(os.Stderr, "PW_LONGEST_STALL %v\n", w.Longest())
	}
}

// longestStall returns the longest time the worker's process went without
// a Redis reply, as it printed at its exit (see watchStalls); false if it
// printed none (it was killed, or does not watch).
func (w *worker) longestStall() (time.Duration, bool) {
	for _, line := range strings.Split(w.stderr.String(), "\n") {
		if s, ok := strings.CutPrefix(line, "PW_LONGEST_STALL "); ok {
			d, err := time.ParseDuration(s)
			return d, err == nil
		}
	}
	return 0, false
}

// shutdown returns what the worker printed of its shutdown when it exited:
// when it noticed SIGTERM, when Run returned (by its clock, in whole
// milliseconds) and how long it stalled meanwhile (see watchStalls).
func (w *worker) shutdown() (term, ended time.Time, stalled time.Duration, ok bool) {
	for _, line := range strings.Split(w.stderr.String(), "\n") {
		if s, found := strings.CutPrefix(line, "PW_SHUTDOWN "); found {
			var t, e int64
			var d string
			if _, err := fmt.Sscanf(s, "%d %d %s", &t, &e, &d); err != nil {
				return term, ended, 0, false
			}
			stalled, err := time.ParseDuration(d)
			return time.UnixMilli(t), time.UnixMilli(e), stalled, err == nil
		}
	}
	return term, ended, 0, false
}

// workerMain is the worker subprocess's main function.
func workerMain() int {
	env := func(k string) string { return os.Getenv(k) }
	dur := func(k string) time.Duration {
		d, err := time.ParseDuration(env(k))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad %s: %v\n", k, err)
			os.Exit(2)
		}
		return d
	}
	num := func(k string) int { n, _ := strconv.Atoi(env(k)); return n }
	me := env("PW_CONSUMER")
	ledger, err := os.OpenFile(env("PW_LEDGER"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	record := func(event string, job *stream.Job) {
		fmt.Fprintf(ledger, "%s %s %s %s %d %d %d\n", event, job.ID, job.EntryID, me, job.Deliveries, job.Attempt, time.Now().UnixNano())
	}
	rdb := redis.NewClient(&redis.Options{Addr: env("PW_ADDR"), MaxRetries: -1})
	defer rdb.Close()

	handler := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		var b behaviour
		if err := job.Decode(&b); err != nil {
			return err
		}
		record("start", job)
		crash := b.Crash != "" && (b.CrashOn == "" || b.CrashOn == me)
		if b.SleepMS > 0 && (b.SleepOn == "" || b.SleepOn == me) {
			t := time.NewTimer(time.Duration(b.SleepMS) * time.Millisecond)
			if b.IgnoreCtx {
				<-t.C
			} else {
				select {
				case <-t.C:
				case <-ctx.Done():
					if errors.Is(context.Cause(ctx), consumer.ErrCancelled) {
						record("operator_cancel", job) // control.Cancel
					} else {
						record("cancelled", job)
					}
					return context.Cause(ctx)
				}
			}
		}
		if crash && b.Crash == "before" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		record("effect", job)
		if crash && b.Crash == "after" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if b.Fail {
			return consumer.Dead(consumer.ReasonPermanent, fmt.Errorf("told to fail"))
		}
		return nil
	})
	c := consumer.New(rdb, consumer.Config{
		Stream:            env("PW_STREAM"),
		Group:             env("PW_GROUP"),
		Consumer:          me,
		VisibilityTimeout: dur("PW_VISIBILITY"),
		SweepInterval:     dur("PW_SWEEP"),
		HeartbeatInterval: dur("PW_HEARTBEAT"),
		Block:             dur("PW_BLOCK"),
		ShutdownTimeout:   dur("PW_SHUTDOWN"),
		Concurrency:       num("PW_CONCURRENCY"),
		Prefetch:          num("PW_PREFETCH"),
		MaxCrashes:        num("PW_MAX_CRASHES"),
		PromoteInterval:   50 * time.Millisecond,
		Backoff:           consumer.Backoff{Base: 50 * time.Millisecond, Cap: 50 * time.Millisecond},
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}).Handle(handler)
	stalls, report := watchStalls(rdb)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	termAt := make(chan time.Time, 1)
	go func() {
		<-ctx.Done()
		termAt <- time.Now()
	}()
	err = c.Run(ctx)
	if ctx.Err() != nil {
		t, ended := <-termAt, time.Now()
		fmt.Fprintf(os.Stderr, "PW_SHUTDOWN %d %d %v\n", t.UnixMilli(), ended.UnixMilli(), stalls.Within(t, ended))
	}
	report()
	st, _ := json.Marshal(c.Stats())
	fmt.Fprintf(os.Stderr, "PW_STATS %s\n", st)
	if err != nil {
		fmt.Fprintf(os.Stderr, "PW_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

// ledgerEntry is one line of a ledger file.
type ledgerEntry struct {
	Event      string // start, effect, cancelled
	JobID      string
	EntryID    string
	Consumer   string
	Deliveries int
	Attempt    int
	At         time.Time // when the worker wrote it (the machine's clock)
}

// ledgerLines returns the lines of a ledger file that worker processes
// append to (none if it does not exist yet).
func ledgerLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// readLedger returns the ledger's entries.
func readLedger(t testing.TB, path string) []ledgerEntry {
	t.Helper()
	var out []ledgerEntry
	for _, line := range ledgerLines(t, path) {
		var e ledgerEntry
		var at int64
		if _, err := fmt.Sscanf(line, "%s %s %s %s %d %d %d", &e.Event, &e.JobID, &e.EntryID, &e.Consumer, &e.Deliveries, &e.Attempt, &at); err != nil {
			continue // a line cut short by SIGKILL
		}
		e.At = time.Unix(0, at)
		out = append(out, e)
	}
	return out
}

// countEvents returns, per job ID, how many ledger entries have event.
func countEvents(entries []ledgerEntry, event string) map[string]int {
	n := make(map[string]int)
	for _, e := range entries {
		if e.Event == event {
			n[e.JobID]++
		}
	}
	return n
}

// scenario is the common setup of a crash test: a stream of its own on a
// Redis, and a ledger file.
type scenario struct {
	t      testing.TB
	rdb    *redis.Client
	addr   string
	stream string
	keys   stream.Keys
	ledger string
}

// newScenario returns a scenario on the shared test Redis (addr "") or on
// the Redis at addr.
func newScenario(t testing.TB, rdb *redis.Client, addr string) *scenario {
	t.Helper()
	if rdb == nil {
		rdb = redistest.Shared(t)
		addr = redistest.Addr()
	}
	name := redistest.Name(t)
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The stream, and its namespace: dead letters, delayed jobs, crash
		// counters, locks, idempotency records, limits.
		rdb.Del(context.Background(), keys.Stream)
		redistest.DeleteKeys(rdb, "{"+name+"}:*")
	})
	return &scenario{t: t, rdb: rdb, addr: addr, stream: name, keys: keys,
		ledger: filepath.Join(t.TempDir(), "ledger")}
}

// worker starts a worker subprocess for this scenario's stream.
func (s *scenario) worker(name string, o workerOpts) *worker {
	s.t.Helper()
	o.Addr, o.Stream, o.Consumer, o.Ledger = s.addr, s.stream, name, s.ledger
	return startWorker(s.t, o)
}

// enqueue adds n jobs with behaviour b and returns their job IDs.
func (s *scenario) enqueue(n int, b behaviour) []string {
	s.t.Helper()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	jobs := make([]*stream.Job, n)
	ids := make([]string, n)
	for i := range jobs {
		j, err := stream.NewJSONJob("test", b)
		if err != nil {
			s.t.Fatal(err)
		}
		jobs[i] = j
	}
	for i := 0; i < n; i += 500 {
		if _, err := p.EnqueueBatch(context.Background(), jobs[i:min(i+500, n)]); err != nil {
			s.t.Fatal(err)
		}
	}
	for i, j := range jobs {
		ids[i] = j.ID
	}
	return ids
}

// pending returns the group's pending count.
func (s *scenario) pending(group string) int64 {
	s.t.Helper()
	p, err := s.rdb.XPending(context.Background(), s.stream, group).Result()
	if err != nil {
		s.t.Fatalf("XPENDING: %v", err)
	}
	return p.Count
}

// dead returns the dead-letter stream's entries.
func (s *scenario) dead() []redis.XMessage {
	s.t.Helper()
	msgs, err := s.rdb.XRange(context.Background(), s.keys.Dead, "-", "+").Result()
	if err != nil {
		s.t.Fatalf("XRANGE dead: %v", err)
	}
	return msgs
}

// eventually polls cond every 20 ms until it returns true, and fails the
// test with cond's last message after timeout.
func eventually(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	poll.Until(t, timeout, cond)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
