package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/stream"
)

// enqueueType adds n jobs of type typ with behaviour b and returns their
// job IDs.
func (s *scenario) enqueueType(typ string, n int, b behaviour) []string {
	s.t.Helper()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	ids := make([]string, n)
	jobs := make([]*stream.Job, n)
	for i := range jobs {
		j, err := stream.NewJSONJob(typ, b)
		if err != nil {
			s.t.Fatal(err)
		}
		jobs[i] = j
	}
	if _, err := p.EnqueueBatch(context.Background(), jobs); err != nil {
		s.t.Fatal(err)
	}
	for i, j := range jobs {
		ids[i] = j.ID
	}
	return ids
}

// pendingEntries returns the group's pending entries (at most 1,000).
func (s *scenario) pendingEntries(group string) []redis.XPendingExt {
	s.t.Helper()
	p, err := s.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: s.stream, Group: group, Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		s.t.Fatalf("XPENDING: %v", err)
	}
	return p
}

// quietWindow is how long a test watches for starts that must not happen
// while a queue is paused: longer than the visibility timeout below, so
// that held jobs whose leases the heartbeat did not extend would be
// reclaimed (and start, or show a delivery count of 2) within it.
const quietWindow = 4 * time.Second

// pauseWorkers are the workers of the pause tests: a visibility timeout
// shorter than the quiet window, so that the heartbeat must hold every held
// job's lease.
var pauseWorkers = workerOpts{Visibility: 2 * time.Second, Sweep: 100 * time.Millisecond, Concurrency: 4}

// checkHeld checks that every pending entry was delivered once (held jobs
// were not reclaimed nor re-read: no suspects made by the pause).
func checkHeld(t *testing.T, s *scenario) {
	t.Helper()
	for _, e := range s.pendingEntries("g") {
		if e.RetryCount != 1 {
			t.Errorf("pending entry %s held by %s was delivered %d times while paused, want 1", e.ID, e.Consumer, e.RetryCount)
		}
	}
}

// checkDoneOnce waits until every job of ids has had one effect and none is
// pending, then checks that none ran twice, no attempt was counted and
// nothing was dead-lettered.
func checkDoneOnce(t *testing.T, s *scenario, ids []string) {
	t.Helper()
	eventually(t, time.Minute, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		for _, id := range ids {
			if effects[id] == 0 {
				return false, fmt.Sprintf("job %s never ran", id)
			}
		}
		return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
	})
	effects := countEvents(readLedger(t, s.ledger), "effect")
	for _, id := range ids {
		if effects[id] != 1 {
			t.Errorf("job %s ran %d times, want 1", id, effects[id])
		}
	}
	for _, e := range readLedger(t, s.ledger) {
		if e.Event == "start" && (e.Attempt != 0 || e.Deliveries != 1) {
			t.Errorf("job %s started with attempt %d, delivered %d times; want 0 and 1 (a pause counts nothing)", e.JobID, e.Attempt, e.Deliveries)
		}
	}
	if d := s.dead(); len(d) > 0 {
		t.Errorf("%d dead letters, want none", len(d))
	}
}

// Two consumer processes busy with a backlog of long jobs, each holding
// jobs queued behind its running ones: a pause of the queue stops every new
// start within about a second (measured and logged; a queued job would
// start only when a running one ends, 2.5 s later), running jobs finish,
// nothing starts while the pause lasts (longer than the visibility
// timeout), held jobs are not redelivered, and after Resume every job runs
// once.
func TestControl_pauseResume(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	watch, report := watchStalls(s.rdb)
	defer report()
	ids := s.enqueue(16, behaviour{SleepMS: 2500})
	o := pauseWorkers
	o.Concurrency = 2 // and 2 queued
	s.worker("a", o)
	s.worker("b", o)
	eventually(t, time.Minute, func() (bool, string) {
		n := len(countEvents(readLedger(t, s.ledger), "start"))
		return n >= 4, fmt.Sprintf("%d jobs started before the pause, want 4", n)
	})
	sent := time.Now()
	if err := control.Pause(t.Context(), s.rdb, s.stream, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	// Watch for starts (a window: an absence is what is checked).
	for deadline := sent.Add(quietWindow); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	var last time.Time
	started := countEvents(readLedger(t, s.ledger), "start")
	for _, e := range readLedger(t, s.ledger) {
		if e.Event == "start" && e.At.After(last) {
			last = e.At
		}
	}
	lag := max(last.Sub(sent), 0)
	t.Logf("pause to the last new start: %v (%d of %d jobs started)", lag.Round(time.Millisecond), len(started), len(ids))
	if bound := 1500*time.Millisecond + watch.Longest(); lag > bound {
		t.Errorf("a job started %v after the pause, want within about %v (1.5 s plus the longest stall)", lag, bound)
	}
	if n := len(countEvents(readLedger(t, s.ledger), "effect")); n < len(started) {
		t.Errorf("%d jobs finished of the %d started: running jobs must finish while paused", n, len(started))
	}
	checkHeld(t, s)
	st, err := control.State(t.Context(), s.rdb, s.stream)
	if err != nil || !st.Queue {
		t.Fatalf("State = %+v, %v; want the queue paused", st, err)
	}
	if err := control.Resume(t.Context(), s.rdb, s.stream, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	checkDoneOnce(t, s, ids)
	if err := control.Resume(t.Context(), s.rdb, s.stream, control.ResumeOptions{}); err != control.ErrNotPaused {
		t.Errorf("second Resume = %v, want ErrNotPaused", err)
	}
}

// A timed pause ends by itself, by the Redis clock, with no message: jobs
// enqueued during it (after a window for the pause to reach the consumers,
// which takes "about a second" at most) start only after its end, then all
// run once.
func TestControl_timedPause(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	watch, report := watchStalls(s.rdb)
	defer report()
	s.worker("a", pauseWorkers)
	s.worker("b", pauseWorkers)
	probe := s.enqueue(1, behaviour{})
	checkDoneOnce(t, s, probe) // both consumers are up (or one drained it)
	now, err := s.rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	const reach = 1500 * time.Millisecond
	until := now.Add(reach + quietWindow)
	if err := control.Pause(t.Context(), s.rdb, s.stream, control.PauseOptions{Until: until}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(reach); time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if stalled := watch.Longest(); stalled > reach/2 {
		t.Skipf("the machine stalled %v during the pause's %v to reach the consumers: the scenario's precondition broke", stalled, reach)
	}
	ids := append(probe, s.enqueue(100, behaviour{SleepMS: 10})...)
	checkDoneOnce(t, s, ids)
	// Redis runs on this machine: its clock is the ledger's.
	for _, e := range readLedger(t, s.ledger) {
		if e.Event == "start" && e.JobID != probe[0] && e.At.Before(until) {
			t.Errorf("job %s started at %s, before the pause's end %s", e.JobID, e.At.Format(time.StampMilli), until.Format(time.StampMilli))
		}
	}
	if st, err := control.State(t.Context(), s.rdb, s.stream); err != nil || st.Any() {
		t.Errorf("State after the end = %+v, %v; want nothing paused", st, err)
	}
}

// A paused type neither runs nor churns, while the other types run; after
// Resume its jobs run once. Fewer held jobs than the consumers' room, so
// that they do not stop reading (the documented limit).
func TestControl_pauseType(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	if err := control.Pause(t.Context(), s.rdb, s.stream, control.PauseOptions{Type: "slow"}); err != nil {
		t.Fatal(err)
	}
	s.worker("a", pauseWorkers)
	s.worker("b", pauseWorkers)
	var slow, fast []string
	for range 3 {
		slow = append(slow, s.enqueueType("slow", 2, behaviour{})...)
		fast = append(fast, s.enqueueType("test", 100, behaviour{SleepMS: 5})...)
	}
	eventually(t, time.Minute, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		for _, id := range fast {
			if effects[id] == 0 {
				return false, fmt.Sprintf("job %s of an unpaused type never ran", id)
			}
		}
		return true, ""
	})
	// Held past the visibility timeout: still not started, not redelivered.
	time.Sleep(quietWindow)
	starts := countEvents(readLedger(t, s.ledger), "start")
	for _, id := range slow {
		if starts[id] != 0 {
			t.Errorf("job %s of the paused type started", id)
		}
	}
	checkHeld(t, s)
	if err := control.Resume(t.Context(), s.rdb, s.stream, control.ResumeOptions{Type: "slow"}); err != nil {
		t.Fatal(err)
	}
	checkDoneOnce(t, s, append(slow, fast...))
}

// Held jobs survive their consumers: while the queue is paused, worker a
// shuts down (its parked jobs are given back at once, within its drain
// bound), worker b takes as many as it has slots over by its sweep and
// holds them, is
// SIGKILLed, and a worker restarted under b's name re-reads them and holds
// them too. Nothing starts while paused; after Resume every job runs once,
// and nothing is lost or dead-lettered. A run in which a or b happened to
// hold nothing (reads come in batches) is tried again, up to three times.
func TestControl_pauseShutdownAndCrash(t *testing.T) {
	t.Parallel()
	for try := 1; ; try++ {
		if pauseShutdownAndCrash(t) {
			return
		}
		if try == 3 {
			t.Fatal("in 3 tries, a or b never held a job when the scenario needed it")
		}
	}
}

// pauseShutdownAndCrash runs the scenario of TestControl_pauseShutdownAndCrash
// on a stream of its own; false when its precondition broke.
func pauseShutdownAndCrash(t *testing.T) bool {
	s := newScenario(t, nil, "")
	watch, report := watchStalls(s.rdb)
	defer report()
	ids := s.enqueue(30, behaviour{SleepMS: 300})
	o := pauseWorkers
	o.Concurrency, o.Prefetch = 2, 4
	a := s.worker("a", o)
	b := s.worker("b", o)
	eventually(t, time.Minute, func() (bool, string) {
		n := len(countEvents(readLedger(t, s.ledger), "start"))
		return n >= 4, fmt.Sprintf("%d jobs started, want 4", n)
	})
	if err := control.Pause(t.Context(), s.rdb, s.stream, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	started := countEvents(readLedger(t, s.ledger), "start")
	// The jobs running at the pause finish.
	eventually(t, time.Minute, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		for id := range started {
			if effects[id] == 0 {
				return false, fmt.Sprintf("job %s started before the pause never finished", id)
			}
		}
		return true, ""
	})
	// From here on nothing may start: every consumer has seen the pause
	// (a window for it to reach them), and what follows (a's give-back,
	// b's sweep, b's restart) happens after.
	for time.Now().Before(pausedAt.Add(1500 * time.Millisecond)) {
		time.Sleep(50 * time.Millisecond)
	}
	quietFrom := time.Now()
	var aHeld int
	for _, e := range s.pendingEntries("g") {
		if e.Consumer == "a" {
			aHeld++
		}
	}
	a.term()
	if err := a.wait(time.Minute); err != nil {
		t.Fatalf("worker a exit: %v", err)
	}
	if term, ended, stalled, ok := a.shutdown(); !ok || ended.Sub(term) > time.Second+stalled {
		t.Errorf("worker a took %v to shut down holding %d paused jobs (stalled %v), want within about 1 s: they are given back, not drained",
			ended.Sub(term), aHeld, stalled)
	}
	// b's sweep takes a's given-back jobs and holds them, each with a
	// worker slot: as many as b has slots (the bound); the rest wait,
	// pending for a, until the resume.
	eventually(t, time.Minute, func() (bool, string) {
		left := 0
		for _, e := range s.pendingEntries("g") {
			if e.Consumer == "a" {
				left++
			}
		}
		want := aHeld - min(aHeld, o.Concurrency)
		return left <= want, fmt.Sprintf("%d entries still pending for a, want at most %d", left, want)
	})
	var bHeld int
	for _, e := range s.pendingEntries("g") {
		if e.Consumer == "b" {
			bHeld++
		}
	}
	if aHeld == 0 || bHeld == 0 {
		t.Logf("a held %d jobs at its shutdown, b %d at its kill: the scenario needs both to hold some; trying again", aHeld, bHeld)
		return false
	}
	b.kill()
	s.worker("b", o) // re-reads b's pending entries: held
	for deadline := time.Now().Add(quietWindow); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	for _, e := range readLedger(t, s.ledger) {
		if e.Event == "start" && e.At.After(quietFrom.Add(watch.Longest())) {
			t.Errorf("job %s started on %s at %s while the queue was paused", e.JobID, e.Consumer, e.At.Format(time.StampMilli))
		}
	}
	if err := control.Resume(t.Context(), s.rdb, s.stream, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		for _, id := range ids {
			if effects[id] == 0 {
				return false, fmt.Sprintf("job %s never ran", id)
			}
		}
		return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
	})
	effects := countEvents(readLedger(t, s.ledger), "effect")
	for _, id := range ids {
		if effects[id] != 1 {
			t.Errorf("job %s ran %d times, want 1 (none was running when b was killed)", id, effects[id])
		}
	}
	if d := s.dead(); len(d) > 0 {
		t.Errorf("%d dead letters, want none", len(d))
	}
	return true
}

// clusterControl runs package control's scripts on name's master, and a
// consumer on the cluster client that a pause holds and a resume (a
// PUBLISH from a script, heard over the consumer's one subscription)
// releases. Called by TestCluster for each of its queues.
func clusterControl(t *testing.T, cc *redis.ClusterClient, name string) {
	t.Helper()
	ctx := t.Context()
	clusterMust(t, "Pause", control.Pause(ctx, cc, name, control.PauseOptions{}))
	clusterMust(t, "Pause type", control.Pause(ctx, cc, name, control.PauseOptions{Type: "x", Until: time.Now().Add(time.Hour)}))
	st, err := control.State(ctx, cc, name)
	clusterMust(t, "State", err)
	if !st.Queue || len(st.Types) != 1 {
		t.Fatalf("State = %+v, want the queue and type x paused", st)
	}
	ran := make(chan string, 10)
	c := consumer.New(cc, consumer.Config{Stream: name, Group: "control", Consumer: "c", Block: 200 * time.Millisecond, StartID: "$"}).
		Handle(consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
			ran <- j.ID
			return nil
		}))
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(rctx) }()
	<-c.Reading()
	p := stream.NewProducer(cc, stream.ProducerConfig{Stream: name})
	j, _ := stream.NewJSONJob("t", 1)
	_, err = p.Enqueue(ctx, j)
	clusterMust(t, "Enqueue", err)
	select {
	case id := <-ran:
		t.Fatalf("job %s ran while the queue was paused", id)
	case <-time.After(time.Second):
	}
	clusterMust(t, "Resume", control.Resume(ctx, cc, name, control.ResumeOptions{All: true}))
	select {
	case id := <-ran:
		if id != j.ID {
			t.Errorf("ran job %s, want %s", id, j.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not run within 30 s of Resume")
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
}
