package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/faultproxy"
)

// heartbeatFailed is the start of the log message of a failed heartbeat.
const heartbeatFailed = "heartbeat failed"

// A worker cut off from Redis by a network partition (a blackhole: its
// connections stall, nothing is reset) while it runs jobs longer than the
// visibility timeout. Another worker, which still reaches Redis, takes the
// jobs over once their leases end. The cut-off worker must have stopped its
// handlers by then: each of its handlers sees its context cancelled before
// the other worker starts the same job, it logs its failed heartbeats, and
// every job has exactly one effect, by the other worker. The comparison is
// between the two workers' ledger times, not with an expected duration;
// should the cut-off worker lose a lease before the partition (a machine too
// loaded to renew it in time), the scenario is run again with a longer
// visibility timeout.
func TestLease_partitionedWorker(t *testing.T) {
	t.Parallel()
	for _, visibility := range []time.Duration{3 * time.Second, 6 * time.Second} {
		var broken string
		t.Run(fmt.Sprintf("visibility=%v", visibility), func(t *testing.T) {
			broken = leasePartition(t, visibility)
		})
		if broken == "" {
			return
		}
		t.Logf("visibility %v: %s; trying a longer one", visibility, broken)
	}
	t.Fatal("the scenario's preconditions broke at every visibility timeout tried")
}

// leasePartition runs the partition scenario with a visibility timeout, and
// returns why its preconditions broke ("" if they held and it was checked).
func leasePartition(t *testing.T, visibility time.Duration) (broken string) {
	const n = 5
	partition := max(10*time.Second, 3*visibility) // longer than a lease, and than a handler's run after it
	s := crashScenario(t)
	proxy, err := faultproxy.Start(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	o := workerOpts{Visibility: visibility, Concurrency: 2 * n, Addr: proxy.Addr(), Stream: s.stream, Consumer: "a", Ledger: s.ledger}
	a := startWorker(t, o)
	// Each job runs on a for longer than the partition: a handler that went
	// on would finish in it, or after it. On b, which takes them over, it
	// runs at once: how long b works checks nothing.
	long := behaviour{SleepMS: int((visibility + partition) / time.Millisecond), SleepOn: "a"}
	ids := s.enqueue(n, long)
	eventually(t, 10*time.Second, func() (bool, string) {
		starts := countEvents(readLedger(t, s.ledger), "start")
		return len(starts) == n, fmt.Sprintf("a started %d of %d jobs", len(starts), n)
	})
	started := time.Now()
	// Until a's handlers have run past one lease, kept by its heartbeats.
	<-time.After(time.Until(started.Add(visibility + visibility/2)))
	if led := readLedger(t, s.ledger); len(countEvents(led, "cancelled")) > 0 {
		return fmt.Sprintf("a lost leases before the partition: %v", led)
	}
	for _, p := range crashPEL(s) {
		if p.Consumer != "a" || p.RetryCount != 1 || p.Idle >= visibility {
			return fmt.Sprintf("before the partition, pending entry %+v is not a's, delivered once and renewed", p)
		}
	}

	proxy.Blackhole()
	cutAt := time.Now()
	o.Addr, o.Consumer = s.addr, "b"
	b := startWorker(t, o)
	// The length of the partition is the fault being injected.
	<-time.After(time.Until(cutAt.Add(partition)))
	proxy.Pass()
	t.Logf("a was cut off from Redis for %v", time.Since(cutAt).Round(time.Millisecond))

	eventually(t, 2*(visibility+partition), func() (bool, string) { return crashSettled(s, ids) })
	led := readLedger(t, s.ledger)
	for _, id := range ids {
		crashWant(t, crashEvents(led, "start", id), "starts of "+id, "a/1", "b/2")
		crashWant(t, crashEvents(led, "cancelled", id), "cancellations of "+id, "a/1")
		crashWant(t, crashEvents(led, "effect", id), "effects of "+id, "b/2")
		starts, cancels := crashEvents(led, "start", id), crashEvents(led, "cancelled", id)
		if len(starts) != 2 || len(cancels) != 1 {
			continue // reported above
		}
		ranOn := cancels[0].At.Sub(starts[1].At)
		if ranOn >= 0 {
			t.Errorf("job %s: a's handler saw its lease end %v after b started the job", id, ranOn)
		} else {
			t.Logf("job %s: a's handler stopped %v before b started it (%v into the partition)", id, -ranOn,
				cancels[0].At.Sub(cutAt).Round(time.Millisecond))
		}
	}
	if d := s.dead(); len(d) != 0 {
		t.Errorf("dead-letter stream has %d entries, want 0: %v", len(d), d)
	}
	if !strings.Contains(a.stderr.String(), heartbeatFailed) {
		t.Errorf("a did not log %q while it was cut off", heartbeatFailed)
	}
	if st := crashStop(t, a); st.LeaseLost != n || st.Acked+st.Stale+st.Retried != 0 {
		t.Errorf("worker a stats %+v: want LeaseLost %d and no settlement", st, n)
	}
	if st := crashStop(t, b); st.Acked != n || st.Reclaimed != n || st.LeaseLost+st.Stale != 0 {
		t.Errorf("worker b stats %+v: want Acked %d, Reclaimed %d, nothing lost or stale", st, n, n)
	}
	return ""
}

// A worker stopped (SIGSTOP) past its jobs' leases, with no other worker to
// take them over, and then resumed: nobody has reclaimed the job, so a
// heartbeat sent now would succeed, but the lease has ended and the handler
// must be cancelled at once, not renewed. The job is then reclaimed and run
// again.
func TestLease_resumedPastLease(t *testing.T) {
	t.Parallel()
	const visibility = 2 * time.Second
	s := crashScenario(t)
	a := s.worker("a", workerOpts{Visibility: visibility})
	// The handler's own timer must not run out during the stop.
	id := s.enqueue(1, behaviour{SleepMS: int(4 * visibility / time.Millisecond)})[0]
	crashWaitStart(t, s, id, 1)
	a.stop()
	stoppedAt := time.Now()
	if led := readLedger(t, s.ledger); len(crashEvents(led, "cancelled", id)) > 0 {
		t.Fatalf("a's handler was cancelled before a was stopped: %v", led)
	}
	// The length of the stop is the fault being injected: past the lease.
	<-time.After(time.Until(stoppedAt.Add(visibility + visibility/2)))
	a.cont()
	resumedAt := time.Now()
	eventually(t, 30*time.Second, func() (bool, string) { return crashSettled(s, []string{id}) })
	led := readLedger(t, s.ledger)
	crashWant(t, crashEvents(led, "cancelled", id), "cancellations", "a/1")
	if c := crashEvents(led, "cancelled", id); len(c) == 1 {
		t.Logf("a's handler saw its cancellation %v after a was resumed", c[0].At.Sub(resumedAt).Round(time.Millisecond))
	}
	// a's own sweep may reclaim the entry while the cancelled handler is
	// still returning (that delivery starts nothing), so the second run's
	// delivery count is 2 or more.
	starts, effects := crashEvents(led, "start", id), crashEvents(led, "effect", id)
	if len(starts) != 2 || starts[0].Deliveries != 1 || len(effects) != 1 ||
		effects[0].Consumer != "a" || effects[0].Deliveries != starts[1].Deliveries {
		t.Errorf("starts %v, effects %v; want the first run (a/1) cancelled and one more run, with the only effect", starts, effects)
	}
	if st := crashStop(t, a); st.LeaseLost == 0 || st.Acked != 1 || st.Stale != 0 {
		t.Errorf("worker a stats %+v: want its lease lost, Acked 1, nothing stale", st)
	}
}
