package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// A worker SIGKILLed in the middle of a handler: the job completes on
// another consumer within the visibility timeout plus a sweep interval
// (counted from the victim's last heartbeat and from the moment the other
// consumer is ready, both measured), and nothing is lost or left pending.
func TestCrash_midHandler(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	const n = 50
	ids := s.enqueue(n, behaviour{SleepMS: 20})
	victim := s.enqueue(1, behaviour{SleepMS: 100, Crash: "before", CrashOn: "a"})[0]
	o := workerOpts{Visibility: 600 * time.Millisecond, Sweep: 100 * time.Millisecond}
	a := s.worker("a", o)
	eventually(t, time.Minute, func() (bool, string) { return a.killed(), "worker a did not crash at its crash point" })
	// The victim can be reclaimed a visibility timeout after a's last
	// heartbeat of it (now - its idle).
	asked := time.Now()
	p, err := s.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: s.stream, Group: "g", Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		t.Fatal(err)
	}
	claimable := asked.Add(o.Visibility)
	for _, e := range p {
		if at := asked.Add(o.Visibility - e.Idle); e.Consumer == "a" && at.Before(claimable) {
			claimable = at
		}
	}
	b := s.worker("b", o)
	// A job enqueued now starts when b has started reading (its sweeps
	// start with its reads): the time b is ready, by its ledger.
	probe := s.enqueue(1, behaviour{})[0]
	ids = append(ids, probe)
	eventually(t, time.Minute, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		if effects[victim] == 0 {
			p, _ := s.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: s.stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
			return false, fmt.Sprintf("victim job never completed; ledger %d lines; pending %+v", len(readLedger(t, s.ledger)), p)
		}
		for _, id := range ids {
			if effects[id] == 0 {
				return false, fmt.Sprintf("job %s never completed", id)
			}
		}
		return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
	})
	effects := countEvents(readLedger(t, s.ledger), "effect")
	if effects[victim] != 1 {
		t.Errorf("victim effects = %d, want 1 (it crashed before its effect)", effects[victim])
	}
	b.term()
	if err := b.wait(time.Minute); err != nil {
		t.Fatalf("worker b exit: %v", err)
	}
	// b takes the victim at its first sweep once it is claimable and b is
	// ready: within a sweep interval, 500 ms and b's longest stall.
	var victimAt, readyAt time.Time
	for _, e := range readLedger(t, s.ledger) {
		switch {
		case e.Event != "start" || e.Consumer != "b":
		case e.JobID == victim:
			victimAt = e.At
		case e.JobID == probe:
			readyAt = e.At
		}
	}
	stall, _ := b.longestStall()
	from := claimable
	if readyAt.After(from) {
		from = readyAt
	}
	t.Logf("victim claimable %v after a's crash was seen, b ready %v after it, the victim restarted on b %v after both; b's longest stall %v",
		claimable.Sub(asked), readyAt.Sub(asked), victimAt.Sub(from), stall)
	if late := victimAt.Sub(from); late > o.Sweep+500*time.Millisecond+stall {
		t.Errorf("the victim restarted on b %v after it was claimable and b ready; want within the %v sweep interval + 500 ms + b's longest stall %v",
			late, o.Sweep, stall)
	}
	if st, ok := b.stats(); !ok || st.Reclaimed == 0 {
		t.Errorf("worker b stats %+v: want Reclaimed > 0", st)
	}
}

// F1: a worker SIGKILLed after the handler's side effect and before the ack.
// The job is delivered again, to another consumer, with delivery count 2, so
// its effect shows twice in the ledger: at-least-once, made visible. Every
// other job has exactly one effect and nothing stays pending.
func TestCrash_afterEffect(t *testing.T) {
	t.Parallel()
	s := crashScenario(t)
	// The victim is read first and sleeps long enough for a to run and
	// acknowledge the 20 jobs read with it before it crashes.
	victim := s.enqueue(1, behaviour{SleepMS: 1000, Crash: "after", CrashOn: "a"})[0]
	ids := s.enqueue(20, behaviour{SleepMS: 10})
	a := s.worker("a", workerOpts{})
	eventually(t, 10*time.Second, func() (bool, string) { return a.killed(), "worker a did not crash at its crash point" })
	if p := crashPEL(s); len(p) != 1 || p[0].Consumer != "a" || p[0].RetryCount != 1 {
		t.Fatalf("a died with pending entries %+v; want only the victim's, delivered once (the other jobs acked first)", p)
	}
	ids = append(ids, s.enqueue(10, behaviour{SleepMS: 10})...)
	b := s.worker("b", workerOpts{})
	all := append([]string{victim}, ids...)
	eventually(t, 10*time.Second, func() (bool, string) {
		if n := countEvents(readLedger(t, s.ledger), "effect")[victim]; n < 2 {
			return false, fmt.Sprintf("victim has %d effects, want 2; pending %+v", n, crashPEL(s))
		}
		return crashSettled(s, all)
	})
	led := readLedger(t, s.ledger)
	crashWant(t, crashEvents(led, "start", victim), "victim starts", "a/1", "b/2")
	crashWant(t, crashEvents(led, "effect", victim), "victim effects", "a/1", "b/2")
	effects := countEvents(led, "effect")
	for _, id := range ids {
		if effects[id] != 1 {
			t.Errorf("job %s has %d effects, want 1", id, effects[id])
		}
	}
	if d := s.dead(); len(d) != 0 {
		t.Errorf("dead-letter stream has %d entries, want 0: %v", len(d), d)
	}
	// b reclaims the victim alone, unless b itself stalled past its lease
	// (a loaded machine: its heartbeat timed out) and so reclaimed its own
	// jobs again; the ledger checks above still hold then.
	st := crashStop(t, b)
	if st.Acked != uint64(len(all)-20) || st.Reclaimed == 0 {
		t.Errorf("worker b stats %+v: want Acked %d, Reclaimed > 0", st, len(all)-20)
	}
	if st.LeaseLost == 0 && (st.Reclaimed != 1 || st.Stale != 0) {
		t.Errorf("worker b stats %+v: no lease lost, want Reclaimed 1, Stale 0", st)
	} else if st.LeaseLost != 0 {
		t.Logf("worker b lost %d leases (it stalled): %+v", st.LeaseLost, st)
	}
}

// F5: a handler longer than the visibility timeout, with two workers
// running. With the heartbeat the job is never taken over: one start,
// delivery count 1 throughout, and its idle time stays under the visibility
// timeout. Without it, each run is cancelled when its lease ends, before the
// next starts.
func TestCrash_longHandler(t *testing.T) {
	t.Parallel()
	const visibility = 400 * time.Millisecond
	long := behaviour{SleepMS: 2000}

	t.Run("heartbeat", func(t *testing.T) {
		t.Parallel()
		s := crashScenario(t)
		o := workerOpts{Visibility: visibility} // Heartbeat: visibility/4
		ws := map[string]*worker{"a": s.worker("a", o), "b": s.worker("b", o)}
		crashWaitConsumers(t, s, "a", "b")
		id := s.enqueue(1, long)[0]
		runner := crashWaitStart(t, s, id, 1)
		polls := 0
		eventually(t, 10*time.Second, func() (bool, string) {
			if countEvents(readLedger(t, s.ledger), "effect")[id] > 0 {
				return true, ""
			}
			polls++
			for _, p := range crashPEL(s) {
				if p.Consumer != runner || p.RetryCount != 1 || p.Idle >= visibility {
					t.Fatalf("while %s runs the job: pending entry %+v; want owner %s, delivery count 1, idle < %v",
						runner, p, runner, visibility)
				}
			}
			return false, "the job did not finish"
		})
		if polls < 10 {
			t.Errorf("only %d polls of XPENDING while the job ran", polls)
		}
		eventually(t, 5*time.Second, func() (bool, string) { return crashSettled(s, []string{id}) })
		led := readLedger(t, s.ledger)
		crashWant(t, crashEvents(led, "start", id), "starts", runner+"/1")
		crashWant(t, crashEvents(led, "effect", id), "effects", runner+"/1")
		for name, w := range ws {
			st := crashStop(t, w)
			if st.Reclaimed != 0 || st.Stale != 0 || st.LeaseLost != 0 {
				t.Errorf("worker %s stats %+v: want no reclaim, stale ack or lost lease", name, st)
			}
			if name == runner && st.Acked != 1 {
				t.Errorf("worker %s stats %+v: want Acked 1", name, st)
			}
		}
	})

	// Without a heartbeat every lease ends VisibilityTimeout after the
	// delivery: the handler still running then is cancelled (a tenth
	// before), before the other worker takes the job over, and the job is
	// not settled. It runs again on each reclaim, each run counted as a
	// crash (its lease was lost), until MaxCrashes, then it is
	// dead-lettered as crashed: a job must fit in its lease.
	t.Run("noHeartbeat", func(t *testing.T) {
		t.Parallel()
		const (
			visibility = 2 * time.Second // a tenth of it is the margin between two runs
			maxCrashes = 2
			runs       = maxCrashes + 1 // the first run is not counted: it was not a suspect
		)
		s := crashScenario(t)
		o := workerOpts{Visibility: visibility, Heartbeat: -1, MaxCrashes: maxCrashes}
		ws := map[string]*worker{"a": s.worker("a", o), "b": s.worker("b", o)}
		crashWaitConsumers(t, s, "a", "b")
		id := s.enqueue(1, behaviour{SleepMS: int(2 * visibility / time.Millisecond)})[0]
		eventually(t, 30*time.Second, func() (bool, string) { return crashSettled(s, []string{id}) })
		led := readLedger(t, s.ledger)
		starts, cancels := crashEvents(led, "start", id), crashEvents(led, "cancelled", id)
		if len(starts) != runs || len(cancels) != runs || len(crashEvents(led, "effect", id)) != 0 {
			t.Fatalf("ledger %v; want %d runs, each cancelled, no effect", led, runs)
		}
		for i, st := range starts {
			c := cancels[i]
			if st.Deliveries != i+1 || c.Deliveries != i+1 || c.Consumer != st.Consumer {
				t.Errorf("run %d: started %s/%d, cancelled %s/%d; want one worker, delivery %d", i+1,
					st.Consumer, st.Deliveries, c.Consumer, c.Deliveries, i+1)
			}
			if i+1 < len(starts) && !c.At.Before(starts[i+1].At) {
				t.Errorf("run %d (%s) saw its cancellation %v after run %d (%s) started", i+1, c.Consumer,
					c.At.Sub(starts[i+1].At), i+2, starts[i+1].Consumer)
			}
		}
		d := s.dead()
		if len(d) != 1 || d[0].Values["dead_reason"] != consumer.ReasonCrashed {
			t.Errorf("dead-letter stream %v; want the job, reason %s", d, consumer.ReasonCrashed)
		}
		var lost uint64
		for name, w := range ws {
			st := crashStop(t, w)
			if st.Acked+st.Stale+st.Retried != 0 {
				t.Errorf("worker %s stats %+v: want nothing acknowledged, stale or retried", name, st)
			}
			lost += st.LeaseLost
		}
		if lost != runs {
			t.Errorf("leases lost: %d, want %d", lost, runs)
		}
	})
}

// F4/F6: a worker frozen (SIGSTOP) past the visibility timeout in the middle
// of a job; another worker takes the job over. Once thawed, the stale worker
// can neither take the job back with its heartbeat nor acknowledge it: it
// cancels its handler with ErrLeaseLost, or, if its handler finished first,
// its ack is refused; the new owner completes the job. Thawed while its
// handler still has work to do, the stale worker mostly takes the first way;
// thawed after its handler's sleep has run out, mostly the second.
func TestCrash_staleWorker(t *testing.T) {
	t.Parallel()
	const (
		heartbeat = 150 * time.Millisecond
		sleep     = 1500 * time.Millisecond
	)
	for _, tc := range []struct {
		name string
		// frozen is the least time a stays frozen after its job started.
		frozen time.Duration
	}{{"thawedMidHandler", 0}, {"thawedAfterHandler", sleep + 100*time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := crashScenario(t)
			o := workerOpts{Visibility: 600 * time.Millisecond, Heartbeat: heartbeat}
			a := s.worker("a", o)
			id := s.enqueue(1, behaviour{SleepMS: int(sleep / time.Millisecond)})[0]
			crashWaitStart(t, s, id, 1)
			started := time.Now()
			a.stop()
			b := s.worker("b", o)
			if got := crashWaitStart(t, s, id, 2); got != "b" {
				t.Fatalf("the job was taken over by %s, want b", got)
			}
			// The length of the freeze is the fault being injected.
			<-time.After(time.Until(started.Add(tc.frozen)))
			a.cont()
			thawed := time.Now()
			// Until a has acted on the job (cancelled it or finished it) and
			// at least four of its heartbeats have passed, the job stays b's.
			eventually(t, 10*time.Second, func() (bool, string) {
				p := crashPEL(s)
				for _, e := range p {
					if e.Consumer != "b" {
						t.Fatalf("after a was thawed: pending %+v; want the job to stay b's", p)
					}
				}
				led := readLedger(t, s.ledger)
				if len(p) == 0 && len(crashOwn(crashEvents(led, "effect", id), "b")) == 0 {
					t.Fatalf("the job left the pending list before b finished it; ledger %v", led)
				}
				acted := len(crashEvents(led, "cancelled", id))+len(crashOwn(crashEvents(led, "effect", id), "a")) > 0
				return acted && time.Since(thawed) > 4*heartbeat, "a did not cancel or finish the job"
			})
			eventually(t, 10*time.Second, func() (bool, string) {
				if len(crashOwn(crashEvents(readLedger(t, s.ledger), "effect", id), "b")) == 0 {
					return false, "b did not finish the job"
				}
				return crashSettled(s, []string{id})
			})
			led := readLedger(t, s.ledger)
			crashWant(t, crashEvents(led, "start", id), "starts", "a/1", "b/2")
			if n := len(crashOwn(crashEvents(led, "effect", id), "b")); n != 1 {
				t.Errorf("b has %d effects, want 1", n)
			}
			aCancelled := len(crashEvents(led, "cancelled", id)) == 1
			aEffects := len(crashOwn(crashEvents(led, "effect", id), "a"))
			if aCancelled == (aEffects == 1) {
				t.Errorf("a cancelled the job: %v, and has %d effects; want either a cancellation or one effect; ledger %v",
					aCancelled, aEffects, led)
			}
			sa := crashStop(t, a)
			if sa.Acked != 0 || sa.LeaseLost+sa.Stale == 0 || (aCancelled && sa.LeaseLost == 0) {
				t.Errorf("worker a stats %+v: want Acked 0 and its lease lost (cancelled: %v) or its ack refused", sa, aCancelled)
			}
			t.Logf("stale worker a: cancelled %v, stats %+v", aCancelled, sa)
			if sb := crashStop(t, b); sb.Acked != 1 || sb.Reclaimed != 1 || sb.Stale != 0 || sb.LeaseLost != 0 {
				t.Errorf("worker b stats %+v: want Acked 1, Reclaimed 1, no stale ack or lost lease", sb)
			}
			if d := s.dead(); len(d) != 0 {
				t.Errorf("dead-letter stream has %d entries, want 0: %v", len(d), d)
			}
		})
	}
}

// F10, poison isolation: a job that kills every worker that runs it, read
// in one batch with 20 innocent jobs that are running beside it when it
// kills the first worker. A fresh worker is started each time the last one
// dies, under the same name (it re-reads its own pending entries) or a new
// one (it reclaims after the visibility timeout). The poison job is
// dead-lettered as crashed after MaxCrashes runs it can be blamed for (3
// restarts); every innocent job completes and none is dead-lettered,
// though each was delivered again after every crash it was in flight for.
func TestCrash_poisonLoop(t *testing.T) {
	t.Parallel()
	const maxCrashes = 2
	for _, tc := range []struct {
		name     string
		sameName bool
	}{{"sameName", true}, {"newNames", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := crashScenario(t)
			// The innocent jobs outlast the poison's run, so all of them are
			// running when it kills the first worker.
			innocent := behaviour{SleepMS: 300}
			ids := s.enqueue(10, innocent)
			poison := s.enqueue(1, behaviour{SleepMS: 50, Crash: "before"})[0]
			ids = append(ids, s.enqueue(10, innocent)...)
			o := workerOpts{MaxCrashes: maxCrashes, Concurrency: 32}
			var started []string
			var w *worker
			next := func() {
				name := "w"
				if !tc.sameName {
					name = fmt.Sprintf("w%d", len(started)+1)
				}
				started = append(started, name)
				w = s.worker(name, o)
			}
			next()
			eventually(t, 60*time.Second, func() (bool, string) {
				select {
				case <-w.done:
					if !w.killed() {
						t.Fatalf("worker %s exited without crashing: %v", w.name, w.err)
					}
					if len(started) > maxCrashes+1 {
						t.Fatalf("%d workers crashed; the poison job should have been dead-lettered after %d crashes it was blamed for",
							len(started), maxCrashes+1)
					}
					next()
				default:
				}
				return crashSettled(s, append([]string{poison}, ids...))
			})
			led := readLedger(t, s.ledger)
			// The precondition: the first crash happened with innocent jobs
			// running (started on their first delivery, without an effect
			// then).
			var first []ledgerEntry
			for _, e := range led {
				if e.Deliveries == 1 {
					first = append(first, e)
				}
			}
			var inFlight int
			for _, id := range ids {
				if len(crashEvents(first, "start", id)) == 1 && len(crashEvents(first, "effect", id)) == 0 {
					inFlight++
				}
			}
			if inFlight == 0 {
				t.Fatalf("no innocent job was running when the poison job crashed the first worker; the scenario tests nothing: %v", led)
			}
			t.Logf("%d innocent jobs were in flight at the first crash; workers: %v", inFlight, started)
			if len(started) != maxCrashes+2 {
				t.Errorf("workers started: %v; want %d crashed and one left", started, maxCrashes+1)
			}
			if n := len(crashEvents(led, "start", poison)); n != maxCrashes+1 {
				t.Errorf("the poison job ran %d times, want %d (once fresh, then MaxCrashes times as a suspect)", n, maxCrashes+1)
			}
			if n := len(crashEvents(led, "effect", poison)); n != 0 {
				t.Errorf("the poison job has %d effects, want 0", n)
			}
			effects := countEvents(led, "effect")
			for _, id := range ids {
				if effects[id] == 0 {
					t.Errorf("innocent job %s has no effect", id)
				}
			}
			dead := s.dead()
			if len(dead) != 1 {
				t.Fatalf("dead-letter stream has %d entries, want the poison job only: %v", len(dead), dead)
			}
			f := dead[0].Values
			want := fmt.Sprintf("worker stopped (crashed, was killed, or stalled past the visibility timeout) while running it, %d times", maxCrashes)
			if f[stream.FieldJobID] != poison || f["dead_reason"] != consumer.ReasonCrashed ||
				!strings.Contains(fmt.Sprint(f["dead_error"]), want) {
				t.Errorf("dead-letter entry %v; want job_id %s, dead_reason %s, dead_error containing %q",
					f, poison, consumer.ReasonCrashed, want)
			}
			if st := crashStop(t, w); st.DeadLettered != 1 {
				t.Errorf("last worker stats %+v: want DeadLettered 1", st)
			}
		})
	}
}

// F21: a worker restarted under the same consumer name re-runs its own
// pending jobs at once (XREADGROUP from 0), not after the visibility timeout.
func TestCrash_restartSameName(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "sleep", 2*time.Second, crashRestartSameName)
}

// crashRestartSameName runs TestCrash_restartSameName with jobs that sleep
// for sleep. The worker must be killed while every job runs: a job that
// ended first (seen beside busy loops, with the worker stalled 5.8 s)
// leaves nothing to re-run, and the run asks for longer jobs instead.
func crashRestartSameName(t *testing.T, sleep time.Duration) time.Duration {
	s := crashScenario(t)
	const n = 10
	o := workerOpts{Visibility: 20 * time.Second, Concurrency: n}
	ids := s.enqueue(n, behaviour{SleepMS: int(sleep.Milliseconds())})
	a := s.worker("a", o)
	eventually(t, 30*time.Second, func() (bool, string) {
		led := readLedger(t, s.ledger)
		starts, effects := len(countEvents(led, "start")), len(countEvents(led, "effect"))
		return starts == n || effects > 0, fmt.Sprintf("%d of %d jobs started", starts, n)
	})
	a.kill()
	if effects := countEvents(readLedger(t, s.ledger), "effect"); len(effects) > 0 {
		t.Logf("%d of %d jobs of %v ended before the worker was killed: nothing to re-run; longer jobs next", len(effects), n, sleep)
		return 2 * sleep
	}
	// A reclaim after the visibility timeout could come no earlier than a
	// visibility timeout after an entry's last heartbeat (now - its idle).
	asked := time.Now()
	p := crashPEL(s)
	if len(p) != n {
		t.Fatalf("after the kill: %d pending entries, want %d: %+v", len(p), n, p)
	}
	timeout := asked.Add(o.Visibility)
	for _, e := range p {
		if at := asked.Add(o.Visibility - e.Idle); at.Before(timeout) {
			timeout = at
		}
	}
	restarted := time.Now()
	a2 := s.worker("a", o)
	eventually(t, o.Visibility+time.Minute, func() (bool, string) { return crashSettled(s, ids) })
	led := readLedger(t, s.ledger)
	// The restarted worker re-runs its own pending jobs at once: before
	// any of them could have been reclaimed after the visibility timeout.
	for _, e := range led {
		if e.Event == "start" && e.Deliveries == 2 && !e.At.Before(timeout.Truncate(time.Millisecond)) {
			t.Errorf("job %s restarted %v after the restart, no earlier than a reclaim after the visibility timeout could (%v after it)",
				e.JobID, e.At.Sub(restarted), timeout.Sub(restarted))
		}
	}
	t.Logf("the restarted worker finished its own pending jobs in %v", time.Since(restarted))
	for _, id := range ids {
		crashWant(t, crashEvents(led, "start", id), "starts of "+id, "a/1", "a/2")
		crashWant(t, crashEvents(led, "effect", id), "effects of "+id, "a/2")
	}
	if st := crashStop(t, a2); st.Acked != n || st.Reclaimed != 0 {
		t.Errorf("restarted worker stats %+v: want Acked %d, Reclaimed 0", st, n)
	}
	if d := s.dead(); len(d) != 0 {
		t.Errorf("dead-letter stream has %d entries, want 0: %v", len(d), d)
	}
	return 0
}

// crashScenario returns a scenario on the shared Redis whose group "g"
// exists from the start (as the workers would create it: from ID 0), so
// that XPENDING works before the first worker is up.
func crashScenario(t *testing.T) *scenario {
	t.Helper()
	s := newScenario(t, nil, "")
	if err := s.rdb.XGroupCreateMkStream(t.Context(), s.stream, "g", "0").Err(); err != nil {
		t.Fatalf("XGROUP CREATE: %v", err)
	}
	return s
}

// crashPEL returns the group "g"'s pending entries (at most 1000).
func crashPEL(s *scenario) []redis.XPendingExt {
	s.t.Helper()
	p, err := s.rdb.XPendingExt(s.t.Context(), &redis.XPendingExtArgs{
		Stream: s.stream, Group: "g", Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		s.t.Fatalf("XPENDING: %v", err)
	}
	return p
}

// crashSettled reports whether every job in ids has ended, with an effect
// in the ledger or in the dead-letter stream, and nothing is pending; its
// message names what is missing. For eventually.
func crashSettled(s *scenario, ids []string) (bool, string) {
	s.t.Helper()
	effects := countEvents(readLedger(s.t, s.ledger), "effect")
	dead := make(map[string]bool)
	for _, m := range s.dead() {
		dead[fmt.Sprint(m.Values[stream.FieldJobID])] = true
	}
	var open []string
	for _, id := range ids {
		if effects[id] == 0 && !dead[id] {
			open = append(open, id)
		}
	}
	if len(open) > 0 {
		return false, fmt.Sprintf("%d of %d jobs have neither an effect nor a dead-letter entry (%v); pending %+v",
			len(open), len(ids), open, crashPEL(s))
	}
	if p := crashPEL(s); len(p) > 0 {
		return false, fmt.Sprintf("every job ended, but %d entries are still pending: %+v", len(p), p)
	}
	return true, ""
}

// crashEvents returns the ledger entries of job id with event, in order.
func crashEvents(led []ledgerEntry, event, id string) []ledgerEntry {
	var out []ledgerEntry
	for _, e := range led {
		if e.Event == event && e.JobID == id {
			out = append(out, e)
		}
	}
	return out
}

// crashOwn returns the entries written by consumer name.
func crashOwn(led []ledgerEntry, name string) []ledgerEntry {
	return slices.DeleteFunc(slices.Clone(led), func(e ledgerEntry) bool { return e.Consumer != name })
}

// crashWant checks that led is, in order, the entries "consumer/deliveries"
// in want.
func crashWant(t *testing.T, led []ledgerEntry, what string, want ...string) {
	t.Helper()
	got := make([]string, len(led))
	for i, e := range led {
		got[i] = fmt.Sprintf("%s/%d", e.Consumer, e.Deliveries)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s (consumer/deliveries): %v, want %v", what, got, want)
	}
}

// crashWaitStart waits until job id has started with the given delivery
// count, and returns the consumer that started it.
func crashWaitStart(t *testing.T, s *scenario, id string, deliveries int) string {
	t.Helper()
	var by string
	eventually(t, 10*time.Second, func() (bool, string) {
		for _, e := range crashEvents(readLedger(t, s.ledger), "start", id) {
			if e.Deliveries == deliveries {
				by = e.Consumer
				return true, ""
			}
		}
		return false, fmt.Sprintf("job %s did not start with delivery count %d; pending %+v", id, deliveries, crashPEL(s))
	})
	return by
}

// crashWaitConsumers waits until every named consumer has joined group "g"
// (a consumer joins with its first read).
func crashWaitConsumers(t *testing.T, s *scenario, names ...string) {
	t.Helper()
	eventually(t, 10*time.Second, func() (bool, string) {
		cs, err := s.rdb.XInfoConsumers(t.Context(), s.stream, "g").Result()
		if err != nil {
			return false, fmt.Sprintf("XINFO CONSUMERS: %v", err)
		}
		for _, name := range names {
			if !slices.ContainsFunc(cs, func(c redis.XInfoConsumer) bool { return c.Name == name }) {
				return false, fmt.Sprintf("consumer %s has not joined: %+v", name, cs)
			}
		}
		return true, ""
	})
}

// crashStop stops w gracefully (SIGTERM), waits for it to exit cleanly and
// returns the stats it printed.
func crashStop(t *testing.T, w *worker) consumer.Stats {
	t.Helper()
	w.term()
	return crashExited(t, w)
}

// crashExited waits for w, already told to stop, to exit cleanly, and
// returns the stats it printed. (A second SIGTERM could reach the worker
// after it stopped handling the signal, and kill it.)
func crashExited(t *testing.T, w *worker) consumer.Stats {
	t.Helper()
	if err := w.wait(10 * time.Second); err != nil {
		t.Errorf("worker %s exit: %v\n%s", w.name, err, tail(w.stderr.String(), 2000))
	}
	st, ok := w.stats()
	if !ok {
		t.Errorf("worker %s printed no stats", w.name)
	}
	return st
}
