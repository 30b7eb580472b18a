package integration

import (
	"fmt"
	"testing"
	"time"
)

// Prefetch: a consumer holds fresh entries read but not started (up to
// Config.Prefetch beyond its Concurrency). They are pending under it, so they
// must behave like running jobs where it matters: another consumer takes them
// over when the holder stalls past their lease (and the holder then does not
// start them), shutdown gives them back without running them, and a poison job
// among them is still isolated.

// prefetchWaitHeld waits until consumer name holds n pending entries of
// group "g" and job id has started there (so the others are queued).
func prefetchWaitHeld(t *testing.T, s *scenario, id, name string, n int) {
	t.Helper()
	crashWaitStart(t, s, id, 1)
	eventually(t, 10*time.Second, func() (bool, string) {
		held := 0
		for _, p := range crashPEL(s) {
			if p.Consumer == name {
				held++
			}
		}
		return held == n, fmt.Sprintf("%s holds %d pending entries, want %d", name, held, n)
	})
}

// prefetchRunOnce checks that each of ids started exactly once, on consumer
// by, with the given delivery count, and had one effect there.
func prefetchRunOnce(t *testing.T, led []ledgerEntry, ids []string, by string, deliveries int) {
	t.Helper()
	for _, id := range ids {
		want := fmt.Sprintf("%s/%d", by, deliveries)
		crashWant(t, crashEvents(led, "start", id), "starts of queued job "+id, want)
		crashWant(t, crashEvents(led, "effect", id), "effects of queued job "+id, want)
	}
}

// A consumer stopped (SIGSTOP) past the lease of the jobs it holds queued:
// another consumer takes them over and runs them, and the stalled one, once
// resumed, does not start them. (Red check: with runQueued starting a queued
// job whatever its lease, a starts the queued jobs after it resumes: two
// starts each.)
func TestPrefetch_stalledPastLeaseTakenOver(t *testing.T) {
	t.Parallel()
	const visibility = 2 * time.Second
	s := crashScenario(t)
	a := s.worker("a", workerOpts{Visibility: visibility, Concurrency: 1, Prefetch: 4})
	// The running job's own timer must not run out during the stop.
	blocker := s.enqueue(1, behaviour{SleepMS: int(3 * visibility / time.Millisecond)})[0]
	queued := s.enqueue(3, behaviour{})
	prefetchWaitHeld(t, s, blocker, "a", 4)

	b := s.worker("b", workerOpts{Visibility: visibility, Concurrency: 4})
	crashWaitConsumers(t, s, "b")
	a.stop()
	stoppedAt := time.Now()
	// The length of the stop is the fault being injected: past the lease.
	<-time.After(time.Until(stoppedAt.Add(visibility + visibility/2)))
	// b has swept by now (sweep 100ms) unless it stalled too: wait for it.
	eventually(t, 30*time.Second, func() (bool, string) {
		for _, p := range crashPEL(s) {
			if p.Consumer == "a" {
				return false, fmt.Sprintf("a still holds %s", p.ID)
			}
		}
		return true, ""
	})
	a.cont()
	eventually(t, 30*time.Second, func() (bool, string) { return crashSettled(s, append([]string{blocker}, queued...)) })
	stA, stB := crashStop(t, a), crashStop(t, b)
	led := readLedger(t, s.ledger)
	prefetchRunOnce(t, led, queued, "b", 2)
	if st := crashOwn(led, "a"); len(st) != 2 || st[0].JobID != blocker || st[1].Event != "cancelled" {
		t.Errorf("a's ledger %v: want only the blocker started and cancelled", st)
	}
	if stA.LeaseLost < 4 || stA.Acked != 0 || stA.Stale != 0 {
		t.Errorf("a's stats %+v: want 4 leases lost (the running job and 3 queued), nothing acked or stale", stA)
	}
	if stB.Acked != 4 {
		t.Errorf("b's stats %+v: want 4 acked", stB)
	}
}

// Shutdown gives queued jobs back at once, without running them, while it
// still waits for the running one, so another consumer runs them during the
// drain. (Red check: with giveBackQueued doing nothing, they stay with a until
// its drain deadline, and b does not run them in time.)
func TestPrefetch_shutdownGivesQueuedBack(t *testing.T) {
	t.Parallel()
	s := crashScenario(t)
	const drain = 30 * time.Second
	// A lease long enough that a stall of a loaded machine does not lose
	// it: the queued jobs reach b by being given back, not reclaimed.
	const visibility = 5 * time.Second
	a := s.worker("a", workerOpts{Visibility: visibility, Concurrency: 1, Prefetch: 4, Shutdown: drain})
	blocker := s.enqueue(1, behaviour{SleepMS: int(2 * drain / time.Millisecond)})[0]
	queued := s.enqueue(3, behaviour{})
	prefetchWaitHeld(t, s, blocker, "a", 4)
	b := s.worker("b", workerOpts{Visibility: visibility, Concurrency: 4})
	crashWaitConsumers(t, s, "b")
	a.term()
	// Within a's drain (the blocker keeps a draining until its deadline).
	eventually(t, drain/2, func() (bool, string) {
		eff := countEvents(readLedger(t, s.ledger), "effect")
		for _, id := range queued {
			if eff[id] == 0 {
				return false, fmt.Sprintf("queued job %s has not run elsewhere; pending %+v", id, crashPEL(s))
			}
		}
		return true, ""
	})
	if a9Exited(a) {
		t.Fatalf("a exited before its drain deadline: the queued jobs were not given back at once")
	}
	led := readLedger(t, s.ledger)
	// Given back, not delivered twice: b's delivery is the first counted.
	prefetchRunOnce(t, led, queued, "b", 1)
	if st := crashOwn(led, "a"); len(st) != 1 || st[0].JobID != blocker {
		t.Errorf("a's ledger %v: want only the blocker started", st)
	}
	a.kill()
	_ = crashStop(t, b)
}

// A poison job read in the same batch as innocent jobs, which are held queued beside
// it (poison first, then a dozen innocents queued behind the two running): it
// is dead-lettered as crashed after MaxCrashes counted runs, and no innocent
// job is. (Red check: with redelivered jobs queued for the workers like fresh
// ones instead of going to the suspect runner, the poison crashes its worker
// forever and is never dead-lettered.)
func TestPrefetch_poisonInBatchIsolated(t *testing.T) {
	t.Parallel()
	var innocents []a9Job
	for i := range 12 {
		innocents = append(innocents, a9Job{SleepMS: 50 + (i%3)*50, N: 2000 + i})
	}
	a9PoisonRunWith(t, []string{"w1"}, false, 0, a9Config{MaxCrashes: 3, Concurrency: 2, Prefetch: 16},
		[]a9Job{{Crash: "before", SleepMS: 20, N: 1}}, innocents, nil)
}

// Queued jobs keep their lease while they wait behind a job running longer
// than the visibility timeout: the heartbeat extends them, so another
// consumer does not take them over, and they run once, where they were read.
// (Red check: with the heartbeat extending started jobs only, b reclaims the
// queued jobs and a's worker then skips them: they run on b, delivered twice.)
func TestPrefetch_queuedLeaseKept(t *testing.T) {
	t.Parallel()
	const visibility = time.Second
	s := crashScenario(t)
	a := s.worker("a", workerOpts{Visibility: visibility, Concurrency: 1, Prefetch: 4})
	blocker := s.enqueue(1, behaviour{SleepMS: int(3 * visibility / time.Millisecond)})[0]
	queued := s.enqueue(3, behaviour{})
	prefetchWaitHeld(t, s, blocker, "a", 4)
	b := s.worker("b", workerOpts{Visibility: visibility, Concurrency: 4})
	crashWaitConsumers(t, s, "b")
	eventually(t, 30*time.Second, func() (bool, string) { return crashSettled(s, append([]string{blocker}, queued...)) })
	stA, stB := crashStop(t, a), crashStop(t, b)
	led := readLedger(t, s.ledger)
	if stalled, ok := a.longestStall(); ok && stalled >= visibility/2 {
		t.Skipf("a stalled %v, long enough to lose its leases; the scenario needs it running", stalled)
	}
	prefetchRunOnce(t, led, append([]string{blocker}, queued...), "a", 1)
	if stA.Acked != 4 || stA.LeaseLost != 0 || stB.Acked != 0 {
		t.Errorf("stats a %+v, b %+v: want a to ack all 4 without losing a lease, b nothing", stA, stB)
	}
}
