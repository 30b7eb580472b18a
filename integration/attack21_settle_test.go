package integration

// Attack 21 (settlement), with worker subprocesses on private redis-servers:
// an outside tester's tests written from README.md and the consumer godoc.
//   - SIGKILLs at random moments while batches of acks, retries, snoozes and
//     dead letters are in flight lose nothing and double nothing;
//   - a SIGSTOPped worker whose running and queued jobs were reclaimed
//     settles none of them when it resumes (mixed outcomes) and starts none of
//     its queued jobs.

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

func init() { subprocessModes["attack21settle"] = a21WorkerMain }

// a21Behaviour is a job's payload: Kind is its outcome (ack, retry: Retry
// on attempt 0 then done, snooze: Snooze on its first entry then done, dead:
// Dead), Sleep the time it works per consumer name ("*" for any other),
// ignoring its context.
type a21Behaviour struct {
	Kind  string         `json:"kind"`
	Sleep map[string]int `json:"sleep,omitempty"`
}

// a21WorkerMain runs one consumer configured by A21_* variables. Ledger
// lines: "<event> <job id> <entry id> <consumer> <deliveries> <attempt> <kind>".
func a21WorkerMain() int {
	env := os.Getenv
	dur := func(k string) time.Duration { d, _ := time.ParseDuration(env(k)); return d }
	num := func(k string) int { n, _ := strconv.Atoi(env(k)); return n }
	me := env("A21_CONSUMER")
	ledger, err := os.OpenFile(env("A21_LEDGER"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: env("A21_ADDR"), MaxRetries: -1})
	defer rdb.Close()
	s := env("A21_STREAM")
	keys, _ := stream.KeysFor(s)
	record := func(event string, j *stream.Job, kind string) {
		fmt.Fprintf(ledger, "%s %s %s %s %d %d %s\n", event, j.ID, j.EntryID, me, j.Deliveries, j.Attempt, kind)
	}
	handler := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		var b a21Behaviour
		if err := j.Decode(&b); err != nil {
			return err
		}
		record("start", j, b.Kind)
		ms, ok := b.Sleep[me]
		if !ok {
			ms = b.Sleep["*"]
		}
		if ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		var out error
		switch b.Kind {
		case "retry":
			if j.Attempt == 0 {
				out = consumer.Retry(10*time.Millisecond, errors.New("attack21 retry"))
			}
		case "snooze":
			// The first entry the job ran from snoozes; later entries are done.
			first, err := rdb.SetArgs(context.Background(), keys.Stream+":a21snz:"+j.ID, j.EntryID, redis.SetArgs{Mode: "NX", Get: true}).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return consumer.Retryable(err) // unexpected: would show as an extra entry
			}
			if first == "" || first == j.EntryID {
				out = consumer.Snooze(10 * time.Millisecond)
			}
		case "dead":
			out = consumer.Dead(consumer.ReasonPermanent, errors.New("attack21 dead"))
		}
		record("end", j, b.Kind)
		return out
	})
	c := consumer.New(rdb, consumer.Config{
		Stream: s, Group: "g", Consumer: me,
		VisibilityTimeout: dur("A21_VT"), HeartbeatInterval: dur("A21_VT") / 4, SweepInterval: 100 * time.Millisecond,
		Block: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
		Concurrency: num("A21_CONC"), Prefetch: num("A21_PREFETCH"), MaxCrashes: 50,
		PromoteInterval: 20 * time.Millisecond, IdleConsumerTimeout: -1,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}).Handle(handler)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = c.Run(ctx)
	st, _ := json.Marshal(c.Stats())
	fmt.Fprintf(os.Stderr, "A21_STATS %s\n", st)
	if err != nil {
		fmt.Fprintf(os.Stderr, "A21_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

type a21Line struct {
	Event, JobID, EntryID, Consumer, Kind string
	Deliveries, Attempt                   int
}

func a21Ledger(t *testing.T, path string) []a21Line {
	t.Helper()
	var out []a21Line
	for _, line := range ledgerLines(t, path) {
		var l a21Line
		if _, err := fmt.Sscanf(line, "%s %s %s %s %d %d %s", &l.Event, &l.JobID, &l.EntryID, &l.Consumer, &l.Deliveries, &l.Attempt, &l.Kind); err != nil {
			continue // cut short by SIGKILL
		}
		out = append(out, l)
	}
	return out
}

type a21Env struct {
	t      *testing.T
	rdb    *redis.Client
	addr   string
	stream string
	keys   stream.Keys
	ledger string
}

func newA21Env(t *testing.T) *a21Env {
	srv := redistest.Start(t, redistest.Options{})
	s := redistest.Name(t)
	keys, _ := stream.KeysFor(s)
	return &a21Env{t: t, rdb: srv.Client(t), addr: srv.Addr(), stream: s, keys: keys, ledger: filepath.Join(t.TempDir(), "ledger")}
}

func (e *a21Env) worker(name string, conc, prefetch int, vt time.Duration) *worker {
	return startSubprocess(e.t, "attack21settle", "A21_ADDR="+e.addr, "A21_STREAM="+e.stream, "A21_CONSUMER="+name,
		"A21_LEDGER="+e.ledger, "A21_VT="+vt.String(), "A21_CONC="+strconv.Itoa(conc), "A21_PREFETCH="+strconv.Itoa(prefetch))
}

func (e *a21Env) enqueue(bs []a21Behaviour) []*stream.Job {
	e.t.Helper()
	p := stream.NewProducer(e.rdb, stream.ProducerConfig{Stream: e.stream})
	jobs := make([]*stream.Job, len(bs))
	for i, b := range bs {
		j, err := stream.NewJSONJob("t", b)
		if err != nil {
			e.t.Fatal(err)
		}
		jobs[i] = j
	}
	for i := 0; i < len(jobs); i += 500 {
		if _, err := p.EnqueueBatch(context.Background(), jobs[i:min(i+500, len(jobs))]); err != nil {
			e.t.Fatal(err)
		}
	}
	return jobs
}

// settledState reports whether the queue is at rest: no pending entry, no
// delayed job, and every job's final outcome recorded.
func (e *a21Env) atRest(jobs []*stream.Job, kinds map[string]string, wantDead int) (bool, string) {
	ctx := context.Background()
	p, err := e.rdb.XPending(ctx, e.stream, "g").Result()
	if err != nil {
		return false, err.Error()
	}
	z, _ := e.rdb.ZCard(ctx, e.keys.Delayed).Result()
	d, _ := e.rdb.XLen(ctx, e.keys.Dead).Result()
	l, _ := e.rdb.XLen(ctx, e.stream).Result()
	return p.Count == 0 && z == 0 && d >= int64(wantDead), fmt.Sprintf("pending %d delayed %d dead %d/%d xlen %d", p.Count, z, d, wantDead, l)
}

// checkExact checks every job was settled exactly once: ack and dead jobs
// ran from one entry, retry and snooze jobs from exactly two, each job's last
// entry ended, one dead letter per dead job and none for any other.
func (e *a21Env) checkExact(jobs []*stream.Job, kinds map[string]string) {
	t := e.t
	lines := a21Ledger(t, e.ledger)
	entries := map[string]map[string]bool{}
	ended := map[string]map[string]bool{}
	for _, l := range lines {
		if entries[l.JobID] == nil {
			entries[l.JobID], ended[l.JobID] = map[string]bool{}, map[string]bool{}
		}
		entries[l.JobID][l.EntryID] = true
		if l.Event == "end" {
			ended[l.JobID][l.EntryID] = true
		}
	}
	dead, err := e.rdb.XRange(context.Background(), e.keys.Dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	deadBy := map[string]int{}
	for _, m := range dead {
		id, _ := m.Values["job_id"].(string)
		deadBy[id]++
		if kinds[id] != "dead" {
			t.Errorf("dead letter for %s job %s: reason %v error %v", kinds[id], id, m.Values["dead_reason"], m.Values["dead_error"])
		}
	}
	bad := 0
	for _, j := range jobs {
		k := kinds[j.ID]
		want := 1
		if k == "retry" || k == "snooze" {
			want = 2
		}
		if len(entries[j.ID]) != want || len(ended[j.ID]) != want {
			bad++
			if bad <= 10 {
				t.Errorf("%s job %s ran from %d entries (%d ended), want %d: lost or doubled", k, j.ID, len(entries[j.ID]), len(ended[j.ID]), want)
			}
		}
		if k == "dead" && deadBy[j.ID] != 1 {
			bad++
			if bad <= 10 {
				t.Errorf("dead job %s has %d dead letters, want 1", j.ID, deadBy[j.ID])
			}
		}
	}
	if bad > 10 {
		t.Errorf("... %d jobs wrong in all", bad)
	}
}

var a21Kinds = []string{"ack", "retry", "snooze", "dead"}

// TestAttack21_KillsMidBatch: three workers run 1,600 short jobs of four
// outcomes (batches of acks, retries, snoozes and dead letters are always in
// flight) while workers are SIGKILLed at random moments, eight times, and
// restarted (same name or a new one). At the end every job was settled
// exactly once: the right number of entries per job, one dead letter per
// dead job, nothing pending or delayed, and the stream empty (retention).
//
// Catches: a batch partly applied (an ack without its retry entry: a lost
// job; a retry scheduled twice: a doubled job), a dead letter written twice,
// a settlement retried after a kill without an owner check, settled
// entries left behind or unsettled ones deleted.
func TestAttack21_KillsMidBatch(t *testing.T) {
	t.Parallel() // its own redis-server (or cluster) and subprocesses
	e := newA21Env(t)
	const n = 1600
	bs := make([]a21Behaviour, n)
	for i := range bs {
		bs[i] = a21Behaviour{Kind: a21Kinds[i%4], Sleep: map[string]int{"*": rand.IntN(8)}}
	}
	jobs := e.enqueue(bs)
	kinds := map[string]string{}
	for i, j := range jobs {
		kinds[j.ID] = bs[i].Kind
	}
	const vt = time.Second
	names := []string{"w0", "w1", "w2"}
	ws := make([]*worker, 3)
	for i, name := range names {
		ws[i] = e.worker(name, 8, 0, vt)
	}
	kills := 0
	for gen := 0; kills < 8; gen++ {
		// Fresh work before each kill, so that batches are in flight when it lands.
		more := e.enqueue(bs[:250])
		for i, j := range more {
			kinds[j.ID] = bs[i].Kind
		}
		jobs = append(jobs, more...)
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Millisecond)
		i := rand.IntN(3)
		// Kill it while it runs something (a start with no end yet), so
		// that its batches are in flight.
		func() {
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				open := map[string]int{}
				for _, l := range a21Ledger(t, e.ledger) {
					if l.Consumer == names[i] {
						if l.Event == "start" {
							open[l.EntryID]++
						} else {
							open[l.EntryID]--
						}
					}
				}
				for _, v := range open {
					if v > 0 {
						return
					}
				}
				time.Sleep(time.Millisecond)
			}
		}()
		ws[i].kill()
		kills++
		if rand.IntN(2) == 0 {
			names[i] = fmt.Sprintf("w%d-%d", i, gen)
		}
		ws[i] = e.worker(names[i], 8, 0, vt)
	}
	wantDead := 0
	for _, j := range jobs {
		if kinds[j.ID] == "dead" {
			wantDead++
		}
	}
	eventually(t, 180*time.Second, func() (bool, string) { return e.atRest(jobs, kinds, wantDead) })
	eventually(t, 30*time.Second, func() (bool, string) {
		l, _ := e.rdb.XLen(context.Background(), e.stream).Result()
		return l == 0, fmt.Sprintf("XLEN %d at rest, want 0 (settled entries deleted)", l)
	})
	for _, w := range ws {
		w.term()
	}
	for _, w := range ws {
		w.wait(60 * time.Second)
	}
	e.checkExact(jobs, kinds)
	// How many runs a kill cut short (a start with no end in that process):
	// the kills landed while work was in flight.
	started, endedRuns := map[string]int{}, map[string]int{}
	for _, l := range a21Ledger(t, e.ledger) {
		k := l.EntryID + " " + l.Consumer
		if l.Event == "start" {
			started[k]++
		} else {
			endedRuns[k]++
		}
	}
	cut := 0
	for k, n := range started {
		cut += n - endedRuns[k]
	}
	t.Logf("%d jobs, %d kills, %d runs cut short by a kill", len(jobs), kills, cut)
	if cut == 0 {
		t.Errorf("precondition: no kill landed while a job ran")
	}
}

// TestAttack21_StoppedWorkerMixed: worker A (Concurrency 4, Prefetch 4)
// runs four jobs and holds four queued, two of each outcome, when it is
// SIGSTOPped past the visibility timeout; worker B takes all eight over and
// runs them, slowly. A is resumed while B still runs them: A's four handlers
// return (ack, retry, snooze, dead) into one stale batch. A must settle none
// (no extra retry or snooze entry, no extra dead letter, B's own settlements
// never refused as stale) and start none of its queued jobs.
//
// Catches: an unscoped XACK (B's ack then refused: B's Stale > 0), a retry
// or dead-letter script without an owner check (extra entries, doubled dead
// letters), a queued job started after its lease ended.
func TestAttack21_StoppedWorkerMixed(t *testing.T) {
	t.Parallel() // its own redis-server (or cluster) and subprocesses
	redistest.Widen(t, "vt", time.Second, func(t *testing.T, vt time.Duration) time.Duration {
		e := newA21Env(t)
		bs := make([]a21Behaviour, 8)
		for i := range bs {
			bs[i] = a21Behaviour{Kind: a21Kinds[i%4], Sleep: map[string]int{"A": int(vt / time.Millisecond), "B": int(4 * vt / time.Millisecond)}}
		}
		a := e.worker("A", 4, 4, vt)
		jobs := e.enqueue(bs)
		kinds := map[string]string{}
		for i, j := range jobs {
			kinds[j.ID] = bs[i].Kind
		}
		eventually(t, 30*time.Second, func() (bool, string) {
			starts := 0
			for _, l := range a21Ledger(t, e.ledger) {
				if l.Event == "start" {
					starts++
				}
			}
			p, err := e.rdb.XPending(context.Background(), e.stream, "g").Result()
			if err != nil {
				return false, err.Error()
			}
			return starts == 4 && p.Count == 8, fmt.Sprintf("A started %d of 4, pending %d of 8", starts, p.Count)
		})
		a.stop()
		stoppedAt := time.Now()
		b := e.worker("B", 8, -1, vt)
		eventually(t, 30*time.Second, func() (bool, string) {
			n := 0
			for _, l := range a21Ledger(t, e.ledger) {
				if l.Event == "start" && l.Consumer == "B" {
					n++
				}
			}
			return n == 8, fmt.Sprintf("B started %d of 8", n)
		})
		a.cont()
		contAt := time.Now()
		// Wait for A's four stale handlers to return.
		eventually(t, 30*time.Second, func() (bool, string) {
			n := 0
			for _, l := range a21Ledger(t, e.ledger) {
				if l.Event == "end" && l.Consumer == "A" {
					n++
				}
			}
			return n >= 4, fmt.Sprintf("A ended %d of 4", n)
		})
		endedAt := time.Now()
		wantDead := 2
		eventually(t, 60*time.Second, func() (bool, string) { return e.atRest(jobs, kinds, wantDead) })
		a.term()
		b.term()
		a.wait(30 * time.Second)
		b.wait(30 * time.Second)
		// Precondition: B still ran the jobs when A's handlers returned
		// (B's runs last 4 vt from their start, which came before contAt).
		if endedAt.Sub(contAt) > 3*vt {
			t.Logf("A's handlers took %v to return after SIGCONT: B may have finished first", endedAt.Sub(contAt))
			return 2 * vt
		}
		t.Logf("stopped %v", contAt.Sub(stoppedAt))
		e.checkExact(jobs, kinds)
		// The eight original entries are those B took over (deliveries > 1).
		lines := a21Ledger(t, e.ledger)
		original := map[string]bool{}
		for _, l := range lines {
			if l.Consumer == "B" && l.Event == "start" && l.Deliveries > 1 {
				original[l.EntryID] = true
			}
		}
		aStarts := 0
		for _, l := range lines {
			if l.Consumer == "A" && l.Event == "start" && original[l.EntryID] {
				aStarts++
			}
		}
		if len(original) != 8 || aStarts != 4 {
			t.Errorf("B took over %d original entries (want 8); A started %d of them (want the 4 it ran before the stop): a queued job was started after its lease ended", len(original), aStarts)
		}
		sb, ok := a21Stats(b)
		sa, _ := a21Stats(a)
		t.Logf("A stats %+v", sa)
		t.Logf("B stats %+v", sb)
		if !ok {
			t.Errorf("B printed no stats")
		} else if sb.Stale != 0 {
			t.Errorf("B's settlements refused as stale %d times: A settled entries B owned", sb.Stale)
		}
		return 0
	})
}

func a21Stats(w *worker) (consumer.Stats, bool) {
	for _, line := range strings.Split(w.stderr.String(), "\n") {
		if s, ok := strings.CutPrefix(line, "A21_STATS "); ok {
			var st consumer.Stats
			if json.Unmarshal([]byte(s), &st) == nil {
				return st, true
			}
		}
	}
	return consumer.Stats{}, false
}
