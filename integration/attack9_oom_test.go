package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// Redis full (README, Guarantees): under maxmemory with noeviction enqueues
// fail with OOM but settlements keep working, a redelivered job waits until
// memory frees, enqueueing works again once the backlog drains, and nothing
// is lost.
func TestAttack9_oom_drainWithCrashWhileFull(t *testing.T) {
	t.Parallel()
	a9OOMRun(t, false)
}

// The same, killing every worker at once while Redis is full: all of them
// restart with suspects of their own, which cannot be counted until memory
// frees.
func TestAttack9_oom_allWorkersCrashWhileFull(t *testing.T) {
	t.Parallel()
	a9OOMRun(t, true)
}

func a9OOMRun(t *testing.T, killAll bool) {
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "20mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	s := newScenario(t, rdb, srv.Addr())
	ctx := context.Background()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s.stream})
	pad := strings.Repeat("p", 1000)
	if err := rdb.XGroupCreateMkStream(ctx, s.stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}

	// Fill Redis until it refuses: every job whose XADD returned an ID is
	// in; a refused one is not.
	kinds := map[string]string{} // job ID -> ok, retry, permanent
	var accepted []string
	oom := false
	for i := 0; !oom; i++ {
		batch := make([]*stream.Job, 100)
		for k := range batch {
			n := i*100 + k
			b := map[string]any{"n": n, "pad": pad}
			switch n % 10 {
			case 7:
				b["fail"], b["fail_attempts"] = "retry", 1
			case 8:
				b["fail"] = "permanent"
			case 9:
				// Keeps jobs in flight for the kill, which comes within
				// the first few hundred jobs; sleepers after those would
				// only slow the drain (1,600 of them took 30 s of the
				// test's 36).
				if n < 2000 {
					b["sleep_ms"] = 300
				}
			}
			j, err := stream.NewJSONJob("a9", b)
			if err != nil {
				t.Fatal(err)
			}
			batch[k] = j
		}
		ids, err := p.EnqueueBatch(ctx, batch)
		if err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatalf("enqueue failed with %v, want OOM", err)
			}
			oom = true
		}
		for k, id := range ids {
			if id == "" {
				continue
			}
			n := i*100 + k
			kind := "ok"
			switch n % 10 {
			case 7:
				kind = "retry"
			case 8:
				kind = "permanent"
			}
			kinds[batch[k].ID] = kind
			accepted = append(accepted, batch[k].ID)
		}
		if i > 1000 {
			t.Fatal("Redis never refused an enqueue: maxmemory not in force?")
		}
	}
	t.Logf("%d jobs accepted before OOM", len(accepted))
	if len(accepted) < 5000 {
		t.Fatalf("only %d jobs accepted: the scenario needs a full Redis", len(accepted))
	}

	cfg := a9Config{Addr: srv.Addr(), Visibility: 2 * time.Second, Sweep: 200 * time.Millisecond, Concurrency: 8}
	w1 := s.a9Worker("w1", cfg)
	w2 := s.a9Worker("w2", cfg)
	// While Redis is still full, kill w1 with jobs in flight, and restart it
	// under the same name: its jobs are now suspects.
	eventually(t, time.Minute, func() (bool, string) {
		n := 0
		for _, e := range readLedger(t, s.ledger) {
			if e.Consumer == "w1" && e.Event == "effect" {
				n++
			}
		}
		return n >= 50, fmt.Sprintf("w1 has %d effects", n)
	})
	w1.kill()
	if killAll {
		w2.kill()
	}
	killedAt := len(readLedger(t, s.ledger))
	// The jobs in flight at the kill: entries still pending under a killed
	// consumer. Only those may run twice: a job finished and waiting for
	// its (batched) acknowledgement is in flight as much as a running one.
	inFlight := map[string]bool{}
	killed := []string{"w1"}
	if killAll {
		killed = append(killed, "w2")
	}
	for _, name := range killed {
		ps, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.stream, Group: "g", Start: "-", End: "+", Count: 100000, Consumer: name}).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			inFlight[p.ID] = true
		}
	}
	if probe := mustJob(t, map[string]any{"pad": pad}); true {
		if _, err := p.Enqueue(ctx, probe); err == nil {
			t.Logf("note: Redis accepted an enqueue right after the kill: memory already freed")
			kinds[probe.ID] = "ok"
			accepted = append(accepted, probe.ID)
		} else if !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("enqueue: %v", err)
		}
	}
	w1 = s.a9Worker("w1", cfg)
	if killAll {
		w2 = s.a9Worker("w2", cfg)
	}

	// Drain. The ledger (some 16k lines) is read as it grows, and the
	// dead-letter stream only once nothing is pending or delayed: the
	// poller must not take the CPU the workers drain with.
	effects := newLedgerCounter(t, s.ledger, "effect")
	eventually(t, 4*time.Minute, func() (bool, string) {
		q := s.a9State("g")
		eff := effects.counts()
		if q.Pending != 0 || q.Delayed != 0 {
			return false, fmt.Sprintf("%d of %d accepted jobs ran, %v", len(eff), len(accepted), q)
		}
		dead := s.a9DeadByJob()
		var open int
		for _, id := range accepted {
			if eff[id] == 0 && len(dead[id]) == 0 {
				open++
			}
		}
		return open == 0, fmt.Sprintf("%d jobs not settled, %v", open, q)
	})

	// Nothing lost, nothing doubled beyond the jobs in flight at the kill.
	led := readLedger(t, s.ledger)
	eff := countEvents(led, "effect")
	dead := s.a9DeadByJob()
	doubled := 0
	// heldAtKill: jobs whose effect was recorded before the kill at an
	// entry still pending under a killed consumer.
	heldAtKill := map[string]bool{}
	for _, e := range led[:killedAt] {
		if e.Event == "effect" && inFlight[e.EntryID] {
			heldAtKill[e.JobID] = true
		}
	}
	for _, id := range accepted {
		switch kinds[id] {
		case "ok", "retry":
			if len(dead[id]) != 0 {
				t.Errorf("%s job %s dead-lettered: %v", kinds[id], id, dead[id])
			}
			if eff[id] > 1 {
				doubled++
				if !heldAtKill[id] {
					t.Errorf("%s job %s ran %d times although it was not in flight on a killed worker", kinds[id], id, eff[id])
				}
			}
		case "permanent":
			if len(dead[id]) != 1 || dead[id][0] != "permanent" {
				t.Errorf("permanent job %s dead-lettered as %v, want once, permanent", id, dead[id])
			}
		}
	}
	for id, n := range eff {
		if n > 2 {
			t.Errorf("job %s ran %d times; a kill may repeat a job once", id, n)
		}
	}
	known := map[string]bool{}
	for _, id := range accepted {
		known[id] = true
	}
	for id := range eff {
		if !known[id] {
			t.Errorf("job %s ran although its enqueue was refused", id)
		}
	}
	for id := range dead {
		if !known[id] {
			t.Errorf("job %s dead-lettered although its enqueue was refused", id)
		}
	}
	t.Logf("ledger lines at kill %d, total %d; %d entries pending on the killed workers, %d of them with their effect done; %d jobs ran twice", killedAt, len(led), len(inFlight), len(heldAtKill), doubled)

	// Enqueueing works again, and the new jobs run.
	var fresh []string
	eventually(t, time.Minute, func() (bool, string) {
		j := mustJob(t, map[string]any{"n": -1})
		_, err := p.Enqueue(ctx, j)
		if err == nil {
			fresh = append(fresh, j.ID)
		}
		return err == nil, fmt.Sprintf("enqueue after the drain: %v (%v)", err, s.a9State("g"))
	})
	fresh = append(fresh, s.a9Enqueue(a9Repeat(200, a9Job{})...)...)
	eventually(t, time.Minute, func() (bool, string) {
		eff := effects.counts()
		var missing []string
		for _, id := range fresh {
			if eff[id] == 0 {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, fmt.Sprintf("fresh jobs without effect: %s", a9Short(missing))
	})
	eventually(t, 30*time.Second, func() (bool, string) {
		q := s.a9State("g")
		return q.Len == 0 && q.Pending == 0, fmt.Sprint(q)
	})
	_ = w2
}

// ledgerCounter counts one event per job ID in a ledger file, reading only
// what was appended since its last call (readLedger parses the whole file).
type ledgerCounter struct {
	t     testing.TB
	path  string
	event string
	off   int64
	n     map[string]int
}

func newLedgerCounter(t testing.TB, path, event string) *ledgerCounter {
	return &ledgerCounter{t: t, path: path, event: event, n: map[string]int{}}
}

// counts reads the complete lines appended since the last call and returns
// the counts so far (the map is the counter's own: read it, do not keep it).
func (c *ledgerCounter) counts() map[string]int {
	c.t.Helper()
	f, err := os.Open(c.path)
	if errors.Is(err, os.ErrNotExist) {
		return c.n
	}
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, c.off, 1<<40))
	if err != nil {
		c.t.Fatal(err)
	}
	// A line not yet ended with its newline is read next time; a line cut
	// short by SIGKILL does not parse and is skipped, as readLedger does.
	end := bytes.LastIndexByte(b, '\n') + 1
	c.off += int64(end)
	for _, line := range strings.Split(string(b[:end]), "\n") {
		ev, rest, _ := strings.Cut(line, " ")
		id, rest, _ := strings.Cut(rest, " ")
		if ev == c.event && len(strings.Fields(rest)) == 5 {
			c.n[id]++
		}
	}
	return c.n
}

func mustJob(t testing.TB, v any) *stream.Job {
	t.Helper()
	j, err := stream.NewJSONJob("a9", v)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// Redis full of other data (a filler key nobody frees): the queue's own
// settlements still work, retries included (each moves a job out of the
// stream into the delayed set and back), dead letters are written, every
// job ends once, and enqueueing works again once the filler is gone.
func TestAttack9_oom_fullOfOtherData(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "8mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	s := newScenario(t, rdb, srv.Addr())
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, s.stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	var jobs []a9Job
	for i := 0; i < 300; i++ {
		switch i % 3 {
		case 0:
			jobs = append(jobs, a9Job{N: i})
		case 1:
			jobs = append(jobs, a9Job{Fail: "retry", FailAttempts: 3, N: i})
		case 2:
			jobs = append(jobs, a9Job{Fail: "permanent", N: i})
		}
	}
	ids := s.a9Enqueue(jobs...)
	pad := strings.Repeat("f", 200)
	for i := 0; ; i++ {
		if err := rdb.Set(ctx, fmt.Sprintf("filler:%d", i), pad, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			break
		}
	}
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s.stream}).Enqueue(ctx, mustJob(t, map[string]any{})); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("enqueue on a full Redis: %v, want OOM", err)
	}
	c := s.a9Run("c1", consumer.Config{Concurrency: 4})
	eventually(t, 2*time.Minute, func() (bool, string) {
		eff := countEvents(readLedger(t, s.ledger), "effect")
		q := s.a9State("g")
		return len(eff) == 200 && q.Dead == 100 && q.Pending == 0 && q.Delayed == 0,
			fmt.Sprintf("%d jobs done, %v", len(eff), q)
	})
	led := readLedger(t, s.ledger)
	a9CheckOnce(t, led, append(append([]string{}, ids[0:0]...), func() []string {
		var out []string
		for i, id := range ids {
			if i%3 != 2 {
				out = append(out, id)
			}
		}
		return out
	}()...))
	fails := countEvents(led, "fail")
	for i, id := range ids {
		if i%3 == 1 && fails[id] != 3 {
			t.Errorf("retried job %s failed %d times, want 3", id, fails[id])
		}
	}
	dead := s.a9DeadByJob()
	for i, id := range ids {
		if i%3 == 2 && (len(dead[id]) != 1 || dead[id][0] != "permanent") {
			t.Errorf("permanent job %s dead-lettered as %v", id, dead[id])
		}
	}
	redistest.DeleteKeys(rdb, "filler:*")
	fresh := s.a9Enqueue(a9Repeat(20, a9Job{})...)
	eventually(t, time.Minute, func() (bool, string) {
		missing := a9Missing(readLedger(t, s.ledger), "effect", fresh)
		return len(missing) == 0, "fresh jobs without effect: " + a9Short(missing)
	})
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
}
