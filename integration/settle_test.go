package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func init() { subprocessModes["settle"] = settleWorkerMain }

// settleConfig configures one settle worker subprocess (JSON in PWS_CONFIG).
type settleConfig struct {
	Addr, Stream, Consumer, Ledger string
	Visibility                     time.Duration
	// SlowSettle delays each retry and dead-letter script by this long, so
	// that settlements queue behind the one running.
	SlowSettle time.Duration
}

// settleKind is a settle job's payload: "done", "retry" (fails its first
// attempt, then is done) or "dead".
type settleKind struct {
	Kind string `json:"kind"`
}

// settleWorkerMain runs a consumer for the settle tests: its ledger gets
// "return <job id> <entry id> <consumer> <attempt> <outcome>" as each
// handler returns, and "settle <retry|dead> <begin|end>" around each retry
// and dead-letter script.
func settleWorkerMain() int {
	var cfg settleConfig
	if err := json.Unmarshal([]byte(os.Getenv("PWS_CONFIG")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ledger, err := os.OpenFile(cfg.Ledger, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	keys, _ := stream.KeysFor(cfg.Stream)
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr, MaxRetries: -1})
	defer rdb.Close()
	rdb.AddHook(&slowSettle{delay: cfg.SlowSettle, dead: keys.Dead, delayed: keys.Delayed, ledger: ledger})
	c := consumer.New(rdb, consumer.Config{
		Stream: cfg.Stream, Group: "g", Consumer: cfg.Consumer, Concurrency: 20,
		VisibilityTimeout: cfg.Visibility, SweepInterval: cfg.Visibility / 4, Block: 200 * time.Millisecond,
		PromoteInterval: 20 * time.Millisecond,
		Backoff:         consumer.Backoff{Base: 20 * time.Millisecond, Cap: 20 * time.Millisecond},
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		var k settleKind
		if err := j.Decode(&k); err != nil {
			return err
		}
		out := "done"
		var err error
		switch {
		case k.Kind == "retry" && j.Attempt == 0:
			out, err = "retry", consumer.Retry(time.Millisecond, errors.New("first attempt"))
		case k.Kind == "dead":
			out, err = "dead", consumer.Permanent(errors.New("never"))
		}
		fmt.Fprintf(ledger, "return %s %s %s %d %s\n", j.ID, j.EntryID, cfg.Consumer, j.Attempt, out)
		return err
	}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "PW_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

// slowSettle delays the retry and dead-letter scripts (recognised by their
// second key: the delayed set or the dead-letter stream) and records them.
type slowSettle struct {
	delay         time.Duration
	dead, delayed string
	ledger        *os.File
}

func (h *slowSettle) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowSettle) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowSettle) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) < 5 || (args[0] != "evalsha" && args[0] != "eval") {
			return next(ctx, cmd)
		}
		kind := ""
		switch args[4] {
		case h.dead:
			kind = "dead"
		case h.delayed:
			kind = "retry"
		default:
			return next(ctx, cmd)
		}
		fmt.Fprintf(h.ledger, "settle %s begin\n", kind)
		time.Sleep(h.delay)
		err := next(ctx, cmd)
		fmt.Fprintf(h.ledger, "settle %s end\n", kind)
		return err
	}
}

// startSettleWorker starts a settle worker subprocess.
func startSettleWorker(t *testing.T, s *scenario, name string, slow time.Duration) *worker {
	t.Helper()
	b, _ := json.Marshal(settleConfig{Addr: s.addr, Stream: s.stream, Consumer: name, Ledger: s.ledger,
		Visibility: time.Second, SlowSettle: slow})
	w := startSubprocess(t, "settle", "PWS_CONFIG="+string(b))
	w.name = name
	return w
}

// SIGKILL of a worker whose retries, snoozes and dead letters are queued
// (its retry and dead-letter scripts slowed, so that the batches queue up
// behind the one running): another worker reclaims what it held, and every
// job ends exactly once in its final state: done, retried once then done,
// or dead-lettered once; counted in (enqueued) and out (settled). Nothing
// queued is lost, and nothing settled by the killed worker settles again:
// a retry that ran before the kill is not retried a second time (one
// attempt-1 entry per retried job), and a dead letter is written once.
func TestSettle_killWithSettlementsQueued(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "slow", 100*time.Millisecond, settleKillQueued)
}

// settleKillQueued runs TestSettle_killWithSettlementsQueued with the
// killed worker's scripts slowed by slow. A run in which nothing was queued
// at the kill checks nothing (beside busy loops the test's own poll once
// stalled until every dead letter was written): it asks for slower scripts.
func settleKillQueued(t *testing.T, slow time.Duration) time.Duration {
	s := newScenario(t, nil, "")
	const per = 300
	var ids []string
	kind := map[string]string{}
	for _, k := range []string{"done", "retry", "dead"} {
		for _, id := range s.enqueueJSON(per, settleKind{Kind: k}) {
			kind[id] = k
			ids = append(ids, id)
		}
	}
	a := startSettleWorker(t, s, "a", slow)
	// Kill a once some retries and dead letters returned from their
	// handlers but are not settled yet: more returned than settled.
	var queued string
	broken := false
	eventually(t, 60*time.Second, func() (bool, string) {
		led := settleLedger(t, s.ledger)
		returned := led.returned["retry"] + led.returned["dead"]
		written := s.rdb.XLen(context.Background(), s.keys.Dead).Val()
		if returned < per/2 || led.begun["dead"] < 1 || int64(led.returned["dead"]) < written+20 {
			return false, fmt.Sprintf("%d retries and dead letters returned, %d dead letters written, scripts begun %v", returned, written, led.begun)
		}
		a.kill()
		// The dead-letter stream only grows: dead letters returned from
		// their handlers before the kill but not in it were queued.
		written = s.rdb.XLen(context.Background(), s.keys.Dead).Val()
		led = settleLedger(t, s.ledger)
		if int64(led.returned["dead"]) <= written {
			t.Logf("precondition: %d dead letters returned from their handlers, %d written: none was queued at the kill; slower scripts next",
				led.returned["dead"], written)
			broken = true
			return true, ""
		}
		queued = fmt.Sprintf("%d retries and %d dead letters had returned from their handlers, %d dead letters were written",
			led.returned["retry"], led.returned["dead"], written)
		return true, ""
	})
	if broken {
		return 2 * slow
	}
	t.Logf("killed a: %s", queued)
	startSettleWorker(t, s, "b", 0)
	eventually(t, 120*time.Second, func() (bool, string) {
		ctx := context.Background()
		p := s.rdb.XPending(ctx, s.stream, "g").Val()
		n := s.rdb.ZCard(ctx, s.keys.Delayed).Val()
		d := s.rdb.XLen(ctx, s.keys.Dead).Val()
		led := settleLedger(t, s.ledger)
		finals := len(led.doneJobs())
		return p != nil && p.Count == 0 && n == 0 && d == per && finals == 2*per,
			fmt.Sprintf("pending %+v, delayed %d, dead %d (want %d), jobs done %d (want %d)", p, n, d, per, finals, 2*per)
	})
	led := settleLedger(t, s.ledger)
	done := led.doneJobs()
	dead := map[string]int{}
	for _, e := range s.dead() {
		id, _ := e.Values[stream.FieldJobID].(string)
		dead[id]++
	}
	out := 0
	for _, id := range ids {
		switch k := kind[id]; {
		case k == "dead":
			if dead[id] != 1 || done[id] {
				t.Errorf("dead job %s: %d dead letters, done %v; want one dead letter", id, dead[id], done[id])
			} else {
				out++
			}
		case dead[id] != 0 || !done[id]:
			t.Errorf("%s job %s: %d dead letters, done %v; want done", k, id, dead[id], done[id])
		case k == "retry" && len(led.retriedEntries[id]) != 1:
			t.Errorf("retried job %s ran its second attempt in entries %v; want one entry (retried once)", id, led.retriedEntries[id])
		default:
			out++
		}
	}
	t.Logf("%d jobs in, %d out in their final state", len(ids), out)
	if out != len(ids) {
		t.Errorf("%d jobs in, %d out", len(ids), out)
	}
	return 0
}

// settleLedgerView is what a settle ledger says.
type settleLedgerView struct {
	returned map[string]int // handler returns by outcome
	begun    map[string]int // scripts begun by kind
	// final: job ID -> done returns; retriedEntries: job ID -> the entries
	// its attempt 1 ran in.
	final          map[string]int
	retriedEntries map[string]map[string]bool
}

func (v settleLedgerView) doneJobs() map[string]bool {
	out := map[string]bool{}
	for id, n := range v.final {
		if n > 0 {
			out[id] = true
		}
	}
	return out
}

func settleLedger(t *testing.T, path string) settleLedgerView {
	v := settleLedgerView{returned: map[string]int{}, begun: map[string]int{}, final: map[string]int{},
		retriedEntries: map[string]map[string]bool{}}
	for _, line := range ledgerLines(t, path) {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "settle" && f[2] == "begin":
			v.begun[f[1]]++
		case len(f) == 6 && f[0] == "return":
			v.returned[f[5]]++
			if f[5] == "done" {
				v.final[f[1]]++
			}
			if a, _ := strconv.Atoi(f[4]); a == 1 {
				if v.retriedEntries[f[1]] == nil {
					v.retriedEntries[f[1]] = map[string]bool{}
				}
				v.retriedEntries[f[1]][f[2]] = true
			}
		}
	}
	return v
}

// enqueueJSON adds n jobs with payload v and returns their job IDs.
func (s *scenario) enqueueJSON(n int, v any) []string {
	s.t.Helper()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	jobs := make([]*stream.Job, n)
	for i := range jobs {
		j, err := stream.NewJSONJob("test", v)
		if err != nil {
			s.t.Fatal(err)
		}
		jobs[i] = j
	}
	if _, err := p.EnqueueBatch(context.Background(), jobs); err != nil {
		s.t.Fatal(err)
	}
	out := make([]string, n)
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}

// A stale worker cannot dead-letter a reclaimed job: worker a is stopped
// (SIGSTOP) with dead letters queued, b reclaims and dead-letters them, and
// once a continues, its queued batches run and settle none of them: each
// job has one dead letter, written by b.
func TestSettle_staleWorkerQueuedDeadLetters(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	const per = 200
	ids := s.enqueueJSON(per, settleKind{Kind: "dead"})
	a := startSettleWorker(t, s, "a", 300*time.Millisecond)
	ctx := context.Background()
	var begunAtStop int
	eventually(t, 60*time.Second, func() (bool, string) {
		led := settleLedger(t, s.ledger)
		written := s.rdb.XLen(ctx, s.keys.Dead).Val()
		if led.begun["dead"] < 1 || int64(led.returned["dead"]) < written+20 {
			return false, fmt.Sprintf("%d dead letters returned, %d written", led.returned["dead"], written)
		}
		a.stop()
		written = s.rdb.XLen(ctx, s.keys.Dead).Val()
		led = settleLedger(t, s.ledger)
		if int64(led.returned["dead"]) <= written {
			t.Fatalf("precondition: %d dead letters returned from their handlers, %d written: none was queued at the stop", led.returned["dead"], written)
		}
		begunAtStop = led.begun["dead"]
		t.Logf("stopped a: %d dead letters returned, %d written", led.returned["dead"], written)
		return true, ""
	})
	startSettleWorker(t, s, "b", 0)
	eventually(t, 60*time.Second, func() (bool, string) {
		p := s.rdb.XPending(ctx, s.stream, "g").Val()
		d := s.rdb.XLen(ctx, s.keys.Dead).Val()
		return p != nil && p.Count == 0 && d == per, fmt.Sprintf("pending %+v, dead %d (want %d)", p, d, per)
	})
	a.cont()
	// a's queued batches run: wait for one more dead-letter script than
	// had begun at the stop, and for every one begun to end.
	eventually(t, 60*time.Second, func() (bool, string) {
		var begun, ended int
		for _, line := range ledgerLines(t, s.ledger) {
			switch line {
			case "settle dead begin":
				begun++
			case "settle dead end":
				ended++
			}
		}
		return begun > begunAtStop && begun == ended, fmt.Sprintf("%d dead-letter scripts begun (%d at the stop), %d ended", begun, begunAtStop, ended)
	})
	a.term()
	if err := a.wait(30 * time.Second); err != nil {
		t.Errorf("a: %v", err)
	}
	dead := map[string]string{}
	for _, e := range s.dead() {
		id, _ := e.Values[stream.FieldJobID].(string)
		if by, ok := dead[id]; ok {
			t.Errorf("job %s dead-lettered twice (by %s and %v)", id, by, e.Values["dead_consumer"])
		}
		dead[id], _ = e.Values["dead_consumer"].(string)
	}
	byB := 0
	for _, id := range ids {
		if dead[id] == "" {
			t.Errorf("job %s not dead-lettered", id)
		}
		if dead[id] == "b" {
			byB++
		}
	}
	t.Logf("%d jobs dead-lettered once each, %d of them by b", len(dead), byB)
	if byB == 0 {
		t.Error("b dead-lettered none: a's queued dead letters were not reclaimed")
	}
}
