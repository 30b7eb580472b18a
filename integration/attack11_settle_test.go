package integration

// Outside tests of batched settlement (README "How it works" / Settlement,
// "Guarantees"): worker processes SIGKILLed at random moments and SIGSTOPped
// with settlements queued while another consumer takes their jobs over. Each
// job must end in exactly one final outcome: one retry entry per attempt, one
// dead letter, one OnDeadLetter call, nothing left pending or delayed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
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

// s11Job is a job's payload in these tests: what the s11 worker's handler
// does with it.
type s11Job struct {
	// Fails is how many attempts fail (Retry) before one succeeds; at least
	// MaxAttempts means the job dies exhausted.
	Fails int `json:"fails,omitempty"`
	// Dead dead-letters the job (reason "s11") at its first attempt.
	Dead bool `json:"dead,omitempty"`
	// Snooze snoozes the job once, at attempt 0, on the first entry that
	// reaches that point (a marker in Redis, so reruns of that entry snooze
	// again and later entries do not).
	Snooze bool `json:"snooze,omitempty"`
	// SleepMS is how long the handler works first.
	SleepMS int `json:"sleep_ms,omitempty"`
	// StopOn: the worker of that name SIGSTOPs itself after the sleep, once
	// per job (a marker in Redis).
	StopOn string `json:"stop_on,omitempty"`
}

func init() { subprocessModes["s11settle"] = s11WorkerMain }

// s11WorkerMain runs one consumer configured by S11_* variables.
func s11WorkerMain() int {
	env := os.Getenv
	num := func(k string) int { n, _ := strconv.Atoi(env(k)); return n }
	me := env("S11_CONSUMER")
	strm := env("S11_STREAM")
	vis, _ := time.ParseDuration(env("S11_VIS"))
	ledger, err := os.OpenFile(env("S11_LEDGER"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	record := func(event string, job *stream.Job, extra string) {
		if extra == "" {
			extra = "-"
		}
		// One write per line: O_APPEND keeps lines whole across processes.
		_, _ = ledger.WriteString(fmt.Sprintf("%s %s %s %s %d %d %s\n", event, job.ID, job.EntryID, me, job.Deliveries, job.Attempt, extra))
	}
	rdb := redis.NewClient(&redis.Options{Addr: env("S11_ADDR"), MaxRetries: -1})
	defer rdb.Close()
	bg := context.Background()
	markers := "{" + strm + "}:s11:"

	handler := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		var b s11Job
		if err := job.Decode(&b); err != nil {
			return err
		}
		record("start", job, "")
		if b.SleepMS > 0 {
			t := time.NewTimer(time.Duration(b.SleepMS) * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				record("cancelled", job, "")
				return context.Cause(ctx)
			}
		}
		if b.StopOn == me {
			if ok, _ := rdb.SetNX(bg, markers+"stop:"+job.ID, 1, time.Hour).Result(); ok {
				record("stopping", job, "")
				_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			}
		}
		if b.Snooze && job.Attempt == 0 {
			key := markers + "snooze:" + job.ID
			if _, err := rdb.SetNX(bg, key, job.EntryID, time.Hour).Result(); err != nil {
				return err
			}
			v, err := rdb.Get(bg, key).Result()
			if err != nil {
				return err
			}
			if v == job.EntryID {
				record("ret_snooze", job, "")
				return consumer.Snooze(20 * time.Millisecond)
			}
		}
		if b.Dead {
			record("ret_dead", job, "")
			return consumer.Dead("s11", errors.New("told to die"))
		}
		if job.Attempt < b.Fails {
			record("ret_retry", job, "")
			return consumer.Retry(20*time.Millisecond, fmt.Errorf("fail at attempt %d", job.Attempt))
		}
		record("ret_ok", job, "")
		return nil
	})
	c := consumer.New(rdb, consumer.Config{
		Stream:            strm,
		Group:             "g",
		Consumer:          me,
		VisibilityTimeout: vis,
		HeartbeatInterval: vis / 4,
		SweepInterval:     100 * time.Millisecond,
		Block:             200 * time.Millisecond,
		ShutdownTimeout:   10 * time.Second,
		Concurrency:       num("S11_CONC"),
		MaxAttempts:       num("S11_MAXATT"),
		MaxCrashes:        50,
		PromoteInterval:   50 * time.Millisecond,
		OnDeadLetter: func(_ context.Context, d consumer.DeadLetter) {
			if d.Job != nil {
				record("odl", d.Job, d.DeadEntryID)
			}
		},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}).Handle(handler)

	statsPath := env("S11_STATS")
	writeStats := func() {
		b, _ := json.Marshal(c.Stats())
		tmp := statsPath + ".tmp"
		if os.WriteFile(tmp, b, 0o644) == nil {
			_ = os.Rename(tmp, statsPath)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	go func() {
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				writeStats()
			}
		}
	}()
	err = c.Run(ctx)
	close(done)
	writeStats()
	st, _ := json.Marshal(c.Stats())
	fmt.Fprintf(os.Stderr, "S11_STATS %s\n", st)
	if err != nil {
		fmt.Fprintf(os.Stderr, "S11_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

// s11Env is one test's stream, ledger and jobs.
type s11Env struct {
	t      *testing.T
	rdb    *redis.Client
	addr   string
	stream string
	keys   stream.Keys
	dir    string
	maxAtt int
	specs  map[string]s11Job
}

func newS11Env(t *testing.T, maxAtt int) *s11Env {
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rdb.Del(context.Background(), keys.Stream)
		redistest.DeleteKeys(rdb, "{"+name+"}:*")
	})
	return &s11Env{t: t, rdb: rdb, addr: redistest.Addr(), stream: name, keys: keys, dir: t.TempDir(),
		maxAtt: maxAtt, specs: map[string]s11Job{}}
}

func (e *s11Env) ledger() string { return filepath.Join(e.dir, "ledger") }

func (e *s11Env) statsPath(name string) string { return filepath.Join(e.dir, "stats-"+name) }

func (e *s11Env) worker(name string, conc int) *worker {
	e.t.Helper()
	return startSubprocess(e.t, "s11settle",
		"S11_ADDR="+e.addr, "S11_STREAM="+e.stream, "S11_CONSUMER="+name, "S11_LEDGER="+e.ledger(),
		"S11_VIS=1s", "S11_CONC="+strconv.Itoa(conc), "S11_MAXATT="+strconv.Itoa(e.maxAtt),
		"S11_STATS="+e.statsPath(name))
}

func (e *s11Env) workerStats(name string) (consumer.Stats, bool) {
	var st consumer.Stats
	b, err := os.ReadFile(e.statsPath(name))
	if err != nil || json.Unmarshal(b, &st) != nil {
		return st, false
	}
	return st, true
}

// mixed returns a random job spec: ok, retried then ok, snoozed, dead at
// once, or exhausted.
func (e *s11Env) mixed(r *rand.Rand, sleepMS int) s11Job {
	j := s11Job{SleepMS: sleepMS, Snooze: r.IntN(4) == 0}
	switch r.IntN(6) {
	case 0:
	case 1, 2:
		j.Fails = 1 + r.IntN(e.maxAtt-1)
	case 3:
		j.Dead = true
	case 4:
		j.Fails = e.maxAtt
	case 5:
		j.Fails = 1
	}
	return j
}

func (e *s11Env) enqueue(specs ...s11Job) []string {
	e.t.Helper()
	p := stream.NewProducer(e.rdb, stream.ProducerConfig{Stream: e.stream})
	jobs := make([]*stream.Job, len(specs))
	for i, s := range specs {
		j, err := stream.NewJSONJob("s11", s)
		if err != nil {
			e.t.Fatal(err)
		}
		jobs[i] = j
	}
	if _, err := p.EnqueueBatch(context.Background(), jobs); err != nil {
		e.t.Fatal(err)
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		e.specs[j.ID] = specs[i]
		ids[i] = j.ID
	}
	return ids
}

type s11Event struct {
	Event, JobID, EntryID, Consumer string
	Deliveries, Attempt             int
	Extra                           string
}

func (e *s11Env) events() []s11Event {
	e.t.Helper()
	var out []s11Event
	for _, line := range ledgerLines(e.t, e.ledger()) {
		f := strings.Fields(line)
		if len(f) != 7 {
			continue // a line cut short by SIGKILL
		}
		d, err1 := strconv.Atoi(f[4])
		a, err2 := strconv.Atoi(f[5])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, s11Event{f[0], f[1], f[2], f[3], d, a, f[6]})
	}
	return out
}

// deadByJob returns the dead-letter entries per job ID.
func (e *s11Env) deadByJob() map[string][]redis.XMessage {
	e.t.Helper()
	msgs, err := e.rdb.XRange(context.Background(), e.keys.Dead, "-", "+").Result()
	if err != nil && err != redis.Nil {
		e.t.Fatal(err)
	}
	out := map[string][]redis.XMessage{}
	for _, m := range msgs {
		id, _ := m.Values["job_id"].(string)
		out[id] = append(out[id], m)
	}
	return out
}

// final reports whether every job has reached its outcome (as the ledger
// and the dead-letter stream show it) and nothing is pending or delayed.
func (e *s11Env) final() (bool, string) {
	ctx := context.Background()
	p, err := e.rdb.XPending(ctx, e.stream, "g").Result()
	if err != nil {
		return false, fmt.Sprintf("XPENDING: %v", err)
	}
	delayed, err := e.rdb.ZCard(ctx, e.keys.Delayed).Result()
	if err != nil {
		return false, fmt.Sprintf("ZCARD: %v", err)
	}
	dead := e.deadByJob()
	ok := map[string]bool{}
	for _, ev := range e.events() {
		if ev.Event == "ret_ok" {
			ok[ev.JobID] = true
		}
	}
	missing := 0
	for id, s := range e.specs {
		if s.Dead || s.Fails >= e.maxAtt {
			if len(dead[id]) == 0 {
				missing++
			}
		} else if !ok[id] {
			missing++
		}
	}
	unread := e.unread()
	return p.Count == 0 && delayed == 0 && missing == 0 && unread == 0,
		fmt.Sprintf("pending %d, delayed %d, jobs without their outcome %d of %d, unread entries %d", p.Count, delayed, missing, len(e.specs), unread)
}

// unread returns the number of stream entries after the group's last
// delivered ID: entries nobody has read (a doubled retry promoted late).
func (e *s11Env) unread() int {
	ctx := context.Background()
	groups, err := e.rdb.XInfoGroups(ctx, e.stream).Result()
	if err != nil || len(groups) == 0 {
		return 0
	}
	msgs, err := e.rdb.XRange(ctx, e.stream, "("+groups[0].LastDeliveredID, "+").Result()
	if err != nil {
		return 0
	}
	return len(msgs)
}

// verify checks every job's history: as many distinct entries as its
// outcomes call for (one per attempt, one more for a snooze), its outcome
// once, one dead letter for a dead job, with the attempts it made, and
// OnDeadLetter at most once (exactly once when odlExact) per dead letter.
func (e *s11Env) verify(odlExact bool) {
	e.t.Helper()
	entries := map[string]map[string]int{} // job -> entry -> attempt
	okAt := map[string][]int{}
	odl := map[string]map[string]bool{} // job -> dead entry IDs called for
	odlCalls := map[string]int{}
	for _, ev := range e.events() {
		switch ev.Event {
		case "start":
			if entries[ev.JobID] == nil {
				entries[ev.JobID] = map[string]int{}
			}
			entries[ev.JobID][ev.EntryID] = ev.Attempt
		case "ret_ok":
			okAt[ev.JobID] = append(okAt[ev.JobID], ev.Attempt)
		case "odl":
			if odl[ev.JobID] == nil {
				odl[ev.JobID] = map[string]bool{}
			}
			odl[ev.JobID][ev.Extra] = true
			odlCalls[ev.JobID]++
		}
	}
	dead := e.deadByJob()
	bad := 0
	report := func(format string, args ...any) {
		bad++
		if bad <= 20 {
			e.t.Errorf(format, args...)
		}
	}
	for id, s := range e.specs {
		want := 0
		switch {
		case s.Dead:
			want = 1
		case s.Fails >= e.maxAtt:
			want = e.maxAtt
		default:
			want = s.Fails + 1
		}
		if s.Snooze {
			want++
		}
		if got := len(entries[id]); got != want {
			byAttempt := map[int]int{}
			for _, a := range entries[id] {
				byAttempt[a]++
			}
			report("job %s (%+v): %d distinct entries ran, want %d (entries per attempt %v)", id, s, got, want, byAttempt)
		}
		isDead := s.Dead || s.Fails >= e.maxAtt
		if isDead {
			if len(dead[id]) != 1 {
				report("job %s (%+v): %d dead letters, want 1", id, s, len(dead[id]))
			}
			if len(okAt[id]) != 0 {
				report("job %s (%+v): dead job also succeeded", id, s)
			}
			for _, m := range dead[id] {
				reason, _ := m.Values["dead_reason"].(string)
				wantReason, wantAtt := "s11", "1"
				if !s.Dead {
					wantReason, wantAtt = consumer.ReasonExhausted, strconv.Itoa(e.maxAtt)
				}
				if reason != wantReason || m.Values["dead_attempts"] != wantAtt {
					report("job %s (%+v): dead letter reason %q attempts %v, want %q %s", id, s, reason, m.Values["dead_attempts"], wantReason, wantAtt)
				}
				if odlExact && !odl[id][m.ID] {
					report("job %s: OnDeadLetter not called for dead letter %s", id, m.ID)
				}
			}
			if n := odlCalls[id]; n > len(dead[id]) || (odlExact && n != len(dead[id])) {
				report("job %s: OnDeadLetter called %d times for %d dead letters", id, n, len(dead[id]))
			}
		} else {
			if len(dead[id]) != 0 {
				report("job %s (%+v): %d dead letters, want none", id, s, len(dead[id]))
			}
			if len(okAt[id]) == 0 {
				report("job %s (%+v): never succeeded", id, s)
			}
			for _, a := range okAt[id] {
				if a != s.Fails {
					report("job %s (%+v): succeeded at attempt %d, want %d", id, s, a, s.Fails)
				}
			}
		}
	}
	for id := range dead {
		if _, ok := e.specs[id]; !ok {
			report("dead letter of unknown job %q", id)
		}
	}
	if bad > 0 {
		e.t.Errorf("%d problems over %d jobs", bad, len(e.specs))
	}
}

// TestAttack11Settle_killRandom SIGKILLs one of three workers at random
// moments while jobs keep failing, retrying, snoozing and dying (restarted
// under the same name or a new one), then checks that every job ended in
// one outcome with one entry per attempt and one dead letter.
func TestAttack11Settle_killRandom(t *testing.T) {
	t.Parallel()
	e := newS11Env(t, 3)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	names := []string{"k0", "k1", "k2"}
	workers := make([]*worker, len(names))
	gen := 0
	for i, n := range names {
		workers[i] = e.worker(n, 16)
	}
	kills := 0
	end := time.Now().Add(8 * time.Second)
	for time.Now().Before(end) {
		specs := make([]s11Job, 40)
		for i := range specs {
			specs[i] = e.mixed(r, r.IntN(30))
		}
		e.enqueue(specs...)
		time.Sleep(time.Duration(150+r.IntN(500)) * time.Millisecond)
		i := r.IntN(len(workers))
		workers[i].kill()
		kills++
		if r.IntN(2) == 0 {
			gen++
			names[i] = fmt.Sprintf("k%d-%d", i, gen) // a new name: its jobs wait for the sweep
		}
		workers[i] = e.worker(names[i], 16)
	}
	eventually(t, 3*time.Minute, e.final)
	for _, w := range workers {
		w.term()
	}
	for _, w := range workers {
		_ = w.wait(30 * time.Second)
	}
	e.verify(false)
	t.Logf("%d jobs, %d kills", len(e.specs), kills)
}

// TestAttack11Settle_staleStopped has worker A SIGSTOP itself about when a
// burst of its jobs (retries, snoozes, dead letters, acks) has just returned,
// so that their settlements are queued or on their way; worker B takes the
// jobs over after the visibility timeout and settles them; then A continues.
// A must settle none of what B took: no second retry entry, no second dead
// letter, no second OnDeadLetter call.
func TestAttack11Settle_staleStopped(t *testing.T) {
	t.Parallel()
	e := newS11Env(t, 3)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 12))
	a := e.worker("A", 64)
	var aPID = a.cmd.Process.Pid
	stopped := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", aPID))
		if err != nil {
			return false
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		return i >= 0 && i+2 < len(s) && s[i+2] == 'T'
	}
	rounds := 5
	for round := 0; round < rounds; round++ {
		specs := make([]s11Job, 40)
		for i := range specs {
			specs[i] = e.mixed(r, 150)
			specs[i].Snooze = false // a snooze would give B new entries A never held
		}
		// The stopper returns (and stops A) round ms after the others.
		specs = append(specs, s11Job{SleepMS: 150 + round, StopOn: "A"})
		e.enqueue(specs...)
		eventually(t, time.Minute, func() (bool, string) { return stopped(), "A has not stopped itself" })
		b := e.worker(fmt.Sprintf("B%d", round), 64)
		eventually(t, 2*time.Minute, e.final)
		b.term()
		_ = b.wait(30 * time.Second)
		a.cont()
		// Let A run what it had queued before the next round.
		before, _ := e.workerStats("A")
		contAt := time.Now()
		eventually(t, time.Minute, func() (bool, string) {
			fi, err := os.Stat(e.statsPath("A"))
			return err == nil && fi.ModTime().After(contAt.Add(300*time.Millisecond)), "A's stats not written since it continued"
		})
		after, _ := e.workerStats("A")
		t.Logf("round %d: A's Stale %d -> %d, Retried %d, DeadLettered %d", round, before.Stale, after.Stale, after.Retried, after.DeadLettered)
	}
	a.term()
	_ = a.wait(30 * time.Second)
	if ok, state := e.final(); !ok {
		t.Errorf("after A's exit: %s", state)
	}
	e.verify(true)
	st, _ := e.workerStats("A")
	t.Logf("%d jobs; A: %+v", len(e.specs), st)
	keys := make([]string, 0)
	for k := range e.deadByJob() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("%d dead jobs", len(keys))
}
