package integration

// Attack 23 (poison isolation with a large prefetched batch), worker
// subprocesses on the shared Redis, written from README.md and the consumer
// godoc only.

import (
	"fmt"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
)

// TestAttack23PoisonInLargeBatch: worker a (Concurrency 4, default
// Prefetch, MaxCrashes 3) runs 2,000 jobs that do nothing, so that its room
// grows, then a burst of 80 jobs of 30 ms with a poison job (SIGKILLs its
// worker before its effect) tenth among them: at each crash a holds many
// of them queued, and every job held comes back a suspect. a is restarted
// under the same name each time it dies, until everything settles. The
// README: the poison is dead-lettered "crashed" after MaxCrashes counted
// runs, "a job that crashes its worker takes no other job to the
// dead-letter stream with it", and a job merely in flight beside it "gets at
// most one count ... then runs alone and settles". Counted: every innocent
// job has its effect, is never dead-lettered, started at most once more
// than there were crashes, and had its effect twice only if it was pending
// at a crash (at-least-once: killed after the effect, before the ack);
// the poison's later runs are alone; nothing is pending or left in the
// stream.
func TestAttack23PoisonInLargeBatch(t *testing.T) {
	t.Parallel()
	const maxCrashes = 3
	s := crashScenario(t)
	opts := workerOpts{Visibility: 2 * time.Second, Concurrency: 4, MaxCrashes: maxCrashes}
	warm := s.enqueue(2000, behaviour{})
	var burst []string
	burst = append(burst, s.enqueue(9, behaviour{SleepMS: 30})...)
	poison := s.enqueue(1, behaviour{SleepMS: 30, Crash: "before"})[0]
	burst = append(burst, s.enqueue(70, behaviour{SleepMS: 30})...)
	innocents := append(append([]string{}, warm...), burst...)

	a := s.worker("a", opts)
	crashes := 0
	var heldAtCrash []int
	pendingAtCrash := map[string]bool{} // entry IDs pending under a after a kill
	eventually(t, 4*time.Minute, func() (bool, string) {
		if a.killed() {
			crashes++
			n := 0
			for _, p := range crashPEL(s) {
				if p.Consumer == "a" {
					n++
					pendingAtCrash[p.ID] = true
				}
			}
			heldAtCrash = append(heldAtCrash, n)
			a = s.worker("a", opts)
		}
		ok, msg := crashSettled(s, innocents)
		if !ok {
			return false, msg
		}
		dead := s.a9DeadByJob()
		return len(dead[poison]) > 0 && s.pending("g") == 0,
			fmt.Sprintf("poison dead-lettered %v, pending %d, crashes %d", dead[poison], s.pending("g"), crashes)
	})
	stA := crashStop(t, a)
	led := readLedger(t, s.ledger)
	starts, effects := countEvents(led, "start"), countEvents(led, "effect")
	dead := s.a9DeadByJob()
	t.Logf("%d crashes, a held %v entries at each (PEL just after the kill); poison started %d times; last a %+v", crashes, heldAtCrash, starts[poison], stA)

	if got := dead[poison]; len(got) != 1 || got[0] != consumer.ReasonCrashed {
		t.Errorf("poison dead-lettered as %v, want once, crashed", got)
	}
	if starts[poison] > maxCrashes+1 {
		t.Errorf("poison started %d times, want at most MaxCrashes+1 = %d", starts[poison], maxCrashes+1)
	}
	if n := len(s.dead()); n != 1 {
		t.Errorf("%d dead letters, want 1 (the poison)", n)
	}
	entryOf := map[string]string{} // job ID -> its (first) entry ID
	for _, e := range led {
		if e.Event == "start" && entryOf[e.JobID] == "" {
			entryOf[e.JobID] = e.EntryID
		}
	}
	doubled := 0
	for _, id := range innocents {
		if len(dead[id]) != 0 {
			t.Errorf("innocent job %s dead-lettered %v (started %d times)", id, dead[id], starts[id])
		}
		if effects[id] == 0 {
			t.Errorf("innocent job %s has no effect", id)
		}
		if effects[id] > 1 {
			doubled++
			// At-least-once allows it only for a job whose worker died
			// after the effect and before the ack: pending at a crash.
			if !pendingAtCrash[entryOf[id]] {
				t.Errorf("innocent job %s had %d effects but was pending at no crash: silently doubled", id, effects[id])
			}
		}
		if starts[id] > crashes+1 {
			t.Errorf("innocent job %s started %d times with %d crashes", id, starts[id], crashes)
		}
	}
	t.Logf("%d innocent jobs had their effect more than once (each pending at a crash)", doubled)
	// The poison's runs after its first counted one (its third start on) are
	// alone on the consumer: no other job starts in the 30 ms it runs
	// before it kills its worker (a restarted worker cannot start anything
	// before that kill).
	var poisonStarts []ledgerEntry
	for _, e := range led {
		if e.Event == "start" && e.JobID == poison {
			poisonStarts = append(poisonStarts, e)
		}
	}
	for k, ps := range poisonStarts {
		if k < 2 {
			continue
		}
		for _, e := range led {
			if e.Event == "start" && e.JobID != poison && e.At.After(ps.At) && e.At.Before(ps.At.Add(30*time.Millisecond)) {
				t.Errorf("job %s started %v after the poison's run %d (deliveries %d), which must run alone", e.JobID, e.At.Sub(ps.At), k+1, ps.Deliveries)
			}
		}
	}
	if crashes < 2 {
		t.Errorf("precondition: the poison crashed its worker %d times; a counted run needs a redelivery", crashes)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		l, _ := s.rdb.XLen(t.Context(), s.stream).Result()
		return l == 0, fmt.Sprintf("XLEN %d, want 0 (settled entries deleted)", l)
	})
}
