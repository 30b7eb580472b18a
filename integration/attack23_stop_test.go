package integration

// Attack 23 (prefetch across processes): a worker subprocess with the
// default Prefetch holds a large batch of queued jobs (its room grown on
// short jobs, then a burst of long ones) when it is SIGSTOPped past the
// visibility timeout. Written from README.md and the consumer godoc only.

import (
	"fmt"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// TestAttack23StoppedLargeBatch: worker a (Concurrency 4, default
// Prefetch) runs 2,000 jobs that do nothing, then 150 that sleep long on a
// only; it holds many of them queued behind its 4 blocked workers. It is
// SIGSTOPped until another worker b has taken over every entry it held and
// read the rest of the burst, then resumed. The README: a queued job "is not started once its lease has ended
// (the process stalled; another consumer may have it by then)". So a starts
// no long job beyond the 4 it ran before the stop, b runs each long job once
// (deliveries 2 for those a held, 1 for the others), every short job has run once, nothing is dead-lettered or
// pending, and b's settlements are never refused as stale.
func TestAttack23StoppedLargeBatch(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "vt", 2*time.Second, func(t *testing.T, vt time.Duration) time.Duration {
		const conc = 4
		s := crashScenario(t)
		a := s.worker("a", workerOpts{Visibility: vt, Concurrency: conc})
		short := s.enqueue(2000, behaviour{})
		long := s.enqueue(150, behaviour{SleepMS: int(10 * vt / time.Millisecond), SleepOn: "a"})
		isLong := map[string]bool{}
		for _, id := range long {
			isLong[id] = true
		}
		longStartsOnA := func() int {
			n := 0
			for _, e := range readLedger(t, s.ledger) {
				if e.Event == "start" && e.Consumer == "a" && isLong[e.JobID] {
					n++
				}
			}
			return n
		}
		eventually(t, 60*time.Second, func() (bool, string) {
			n := longStartsOnA()
			return n == conc, fmt.Sprintf("a started %d long jobs, want %d (its workers all busy)", n, conc)
		})
		heldBy := func(name string) int {
			n := 0
			for _, p := range crashPEL(s) {
				if p.Consumer == name {
					n++
				}
			}
			return n
		}
		a.stop()
		heldAtStop := map[string]bool{} // entry IDs
		for _, p := range crashPEL(s) {
			if p.Consumer == "a" {
				heldAtStop[p.ID] = true
			}
		}
		held := len(heldAtStop)
		stoppedAt := time.Now()
		before := longStartsOnA()
		b := s.worker("b", workerOpts{Visibility: vt, Concurrency: 200, Prefetch: -1})
		// Resume a only once b holds all a held and has read the rest of
		// the burst: an entry still unread when a wakes may be read fresh
		// by a (its lease new), a start the README allows; on a slow
		// machine b can lag behind the burst that long.
		eventually(t, 60*time.Second, func() (bool, string) {
			n := heldBy("a")
			gs, err := s.rdb.XInfoGroups(t.Context(), s.stream).Result()
			if err != nil || len(gs) != 1 {
				return false, fmt.Sprintf("XINFO GROUPS: %v %v", gs, err)
			}
			return n == 0 && gs[0].Lag == 0, fmt.Sprintf("a still holds %d entries; %d never read", n, gs[0].Lag)
		})
		a.cont()
		contAt := time.Now()
		eventually(t, 60*time.Second, func() (bool, string) { return crashSettled(s, append(append([]string{}, short...), long...)) })
		// Let a's cancelled handlers and any (wrongly) started queued job
		// reach the ledger: a's workers are free once its 4 runs ended.
		eventually(t, 30*time.Second, func() (bool, string) {
			ended := 0
			for _, e := range readLedger(t, s.ledger) {
				if e.Consumer == "a" && isLong[e.JobID] && (e.Event == "cancelled" || e.Event == "effect") {
					ended++
				}
			}
			return ended >= before, fmt.Sprintf("%d of a's %d long runs ended", ended, before)
		})
		stA, stB := crashStop(t, a), crashStop(t, b)
		if stalled, ok := b.longestStall(); ok && stalled >= vt/2 {
			t.Logf("b stalled %v", stalled)
		}
		t.Logf("a held %d entries at the stop (%d long jobs running), stopped %v; a %+v; b %+v", held, before, contAt.Sub(stoppedAt), stA, stB)
		led := readLedger(t, s.ledger)
		if n := longStartsOnA(); n != before {
			t.Errorf("a started %d long jobs, %d after its resume: a queued job was started after its lease ended", n, n-before)
		}
		starts, effects := countEvents(led, "start"), countEvents(led, "effect")
		for _, id := range short {
			if starts[id] != 1 || effects[id] != 1 {
				t.Errorf("short job %s started %d times, effects %d: want 1 and 1", id, starts[id], effects[id])
			}
		}
		for _, id := range long {
			onB := 0
			for _, e := range crashEvents(led, "effect", id) {
				if e.Consumer == "b" {
					onB++
					if nStarts := len(crashEvents(led, "start", id)); heldAtStop[e.EntryID] && e.Deliveries != 2 || !heldAtStop[e.EntryID] && e.Deliveries != 1 {
						t.Errorf("long job %s (held by a at the stop: %v) ran on b with deliveries %d (%d starts)", id, heldAtStop[e.EntryID], e.Deliveries, nStarts)
					}
				}
			}
			if onB != 1 || effects[id] != 1 {
				t.Errorf("long job %s: %d effects, %d on b; want exactly one, on b", id, effects[id], onB)
			}
		}
		if d := s.dead(); len(d) != 0 {
			t.Errorf("%d dead letters, want none", len(d))
		}
		if stB.Stale != 0 || stA.Acked > uint64(len(short)) {
			t.Errorf("b's settlements refused as stale %d times; a acked %d", stB.Stale, stA.Acked)
		}
		if held <= 2*conc {
			t.Logf("precondition: a held only %d entries at the stop (its room did not grow); the check was of a small batch", held)
		}
		return 0
	})
}
