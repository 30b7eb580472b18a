package integration

// Outside tests of cancelling a running tracked job across worker processes
// (README "Finding and cancelling a job"), written from the docs only.

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/stream"
)

// enqueueTracked adds n tracked jobs with behaviour b and returns their IDs.
func (s *scenario) a14enqueueTracked(n int, b behaviour) []string {
	s.t.Helper()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream, Track: true})
	var ids []string
	for i := 0; i < n; i++ {
		j, err := stream.NewJSONJob("test", b)
		if err != nil {
			s.t.Fatal(err)
		}
		if _, err := p.Enqueue(context.Background(), j); err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	return ids
}

func (s *scenario) a14lookup(id string) control.JobInfo {
	s.t.Helper()
	info, err := control.Lookup(context.Background(), s.rdb, s.stream, id)
	if err != nil {
		s.t.Fatalf("Lookup: %v", err)
	}
	return info
}

func (s *scenario) a14waitState(id string, timeout time.Duration, states ...string) control.JobInfo {
	s.t.Helper()
	var info control.JobInfo
	eventually(s.t, timeout, func() (bool, string) {
		info = s.a14lookup(id)
		for _, st := range states {
			if info.State == st {
				return true, ""
			}
		}
		return false, fmt.Sprintf("job %s is %+v, want one of %v", id, info, states)
	})
	return info
}

func a14events(entries []ledgerEntry, event, id string) []ledgerEntry {
	var out []ledgerEntry
	for _, e := range entries {
		if e.Event == event && e.JobID == id {
			out = append(out, e)
		}
	}
	return out
}

// TestAttack14CancelProc_threeWorkers runs long jobs on three worker
// processes and cancels one on each: the handler that sees ErrCancelled is
// the one on the consumer Lookup named, only the cancelled jobs are hit, and
// each ends cancelled, run once.
func TestAttack14CancelProc_threeWorkers(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	var ws []*worker
	for _, n := range []string{"w1", "w2", "w3"} {
		ws = append(ws, s.worker(n, workerOpts{Visibility: 10 * time.Second, Concurrency: 2, Prefetch: -1}))
	}
	ids := s.a14enqueueTracked(6, behaviour{SleepMS: 120000})
	eventually(t, 60*time.Second, func() (bool, string) {
		n := len(countEvents(readLedger(t, s.ledger), "start"))
		return n == 6, fmt.Sprintf("%d of 6 started", n)
	})
	byConsumer := map[string][]string{}
	for _, id := range ids {
		c := s.a14lookup(id).Consumer
		byConsumer[c] = append(byConsumer[c], id)
	}
	cancelled := map[string]string{} // job ID -> its holder
	asked := map[string]time.Time{}
	for c, jobs := range byConsumer {
		id := jobs[0]
		was, err := control.Cancel(context.Background(), s.rdb, s.stream, id)
		if err != nil || was != stream.StateCancelling {
			t.Fatalf("Cancel = %q, %v", was, err)
		}
		cancelled[id], asked[id] = c, time.Now()
	}
	for id := range cancelled {
		s.a14waitState(id, 30*time.Second, stream.StateCancelled)
	}
	entries := readLedger(t, s.ledger)
	for _, id := range ids {
		oc := a14events(entries, "operator_cancel", id)
		holder, want := cancelled[id]
		switch {
		case want && (len(oc) != 1 || oc[0].Consumer != holder):
			t.Errorf("job %s held by %s: operator_cancel events %+v", id, holder, oc)
		case want:
			t.Logf("job %s cancelled on %s %v after Cancel", id, holder, oc[0].At.Sub(asked[id]))
		case len(oc) != 0:
			t.Errorf("job %s was not cancelled but its handler saw ErrCancelled: %+v", id, oc)
		}
		if n := len(a14events(entries, "start", id)); n != 1 {
			t.Errorf("job %s started %d times", id, n)
		}
	}
	for _, id := range ids {
		if _, ok := cancelled[id]; !ok {
			if st := s.a14lookup(id).State; st != control.StateRunning {
				t.Errorf("job %s not cancelled is %q, want running", id, st)
			}
		}
	}
	if len(s.dead()) != 0 {
		t.Errorf("dead letters: %v", s.dead())
	}
	for _, w := range ws {
		w.kill()
	}
}

// TestAttack14CancelProc_stoppedPastLease SIGSTOPs the runner of a tracked
// job, cancels the job while the runner is frozen, and lets another worker
// take it over past the lease: the docs promise the rescuer settles it
// cancelled without running it; the frozen runner, resumed, must not finish
// it (no effect, no done).
func TestAttack14CancelProc_stoppedPastLease(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	a := s.worker("wa", workerOpts{Visibility: 2 * time.Second, Heartbeat: 400 * time.Millisecond, Concurrency: 2})
	ids := s.a14enqueueTracked(1, behaviour{SleepMS: 8000})
	id := ids[0]
	eventually(t, 60*time.Second, func() (bool, string) {
		n := len(a14events(readLedger(t, s.ledger), "start", id))
		return n == 1, fmt.Sprintf("%d starts", n)
	})
	a.stop()
	was, err := control.Cancel(context.Background(), s.rdb, s.stream, id)
	if err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel = %q, %v", was, err)
	}
	b := s.worker("wb", workerOpts{Visibility: 2 * time.Second, Heartbeat: 400 * time.Millisecond, Concurrency: 2})
	s.a14waitState(id, 60*time.Second, stream.StateCancelled, stream.StateDone, stream.StateDead)
	a.cont()
	// The resumed runner's handler sleeps at most 8 s; wait past it.
	eventually(t, 60*time.Second, func() (bool, string) {
		e := readLedger(t, s.ledger)
		n := len(a14events(e, "cancelled", id)) + len(a14events(e, "operator_cancel", id)) + len(a14events(e, "effect", id))
		return n >= 1, "the resumed runner's handler has not returned"
	})
	b.term()
	a.term()
	_ = b.wait(30 * time.Second)
	_ = a.wait(30 * time.Second)
	entries := readLedger(t, s.ledger)
	for _, e := range entries {
		t.Logf("ledger: %s %s on %s deliveries %d", e.Event, e.JobID, e.Consumer, e.Deliveries)
	}
	if st := s.a14lookup(id).State; st != stream.StateCancelled {
		t.Errorf("final state %q, want cancelled", st)
	}
	if n := len(a14events(entries, "start", id)); n != 1 {
		t.Errorf("job started %d times, want once (before the cancel)", n)
	}
	if n := len(a14events(entries, "effect", id)); n != 0 {
		t.Errorf("a cancelled job's effect ran %d times", n)
	}
	if s.pending("g") != 0 || len(s.dead()) != 0 {
		t.Errorf("pending %d, dead %d", s.pending("g"), len(s.dead()))
	}
	sb, _ := b.stats()
	t.Logf("rescuer stats %+v", sb)
}

// TestAttack14CancelProc_killedThenCancelled SIGKILLs the runner first and
// cancels the job while its entry is pending under the dead consumer: the
// worker that reclaims it settles it cancelled without running it.
func TestAttack14CancelProc_killedThenCancelled(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	a := s.worker("wa", workerOpts{Visibility: 2 * time.Second, Heartbeat: 400 * time.Millisecond})
	ids := s.a14enqueueTracked(3, behaviour{SleepMS: 60000})
	eventually(t, 60*time.Second, func() (bool, string) {
		n := len(countEvents(readLedger(t, s.ledger), "start"))
		return n == 3, fmt.Sprintf("%d starts", n)
	})
	a.kill()
	for _, id := range ids[:2] {
		if was, err := control.Cancel(context.Background(), s.rdb, s.stream, id); err != nil || was != stream.StateCancelling {
			t.Fatalf("Cancel = %q, %v", was, err)
		}
	}
	b := s.worker("wb", workerOpts{Visibility: 2 * time.Second, Heartbeat: 400 * time.Millisecond})
	for _, id := range ids[:2] {
		s.a14waitState(id, 60*time.Second, stream.StateCancelled, stream.StateDone, stream.StateDead)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		n := len(a14events(readLedger(t, s.ledger), "start", ids[2]))
		return n == 2, fmt.Sprintf("the uncancelled job started %d times, want 2 (rescued)", n)
	})
	entries := readLedger(t, s.ledger)
	for _, id := range ids[:2] {
		if st := s.a14lookup(id).State; st != stream.StateCancelled {
			t.Errorf("job %s is %q, want cancelled", id, st)
		}
		for _, e := range a14events(entries, "start", id) {
			if e.Consumer == "wb" {
				t.Errorf("the rescuer ran cancelled job %s", id)
			}
		}
	}
	b.kill()
}

// TestAttack14CancelProc_cli cancels with the pelican command: a waiting job
// (exit 0), a running one ("cancelling", exit 0, as the command's help says;
// the README's table says running exits 1), a finished one (exit 1), an
// unknown one (exit 4); pelican job follows.
func TestAttack14CancelProc_cli(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	cli := pelicanCLI(t)
	run := func(args ...string) (string, int) {
		cmd := exec.Command(cli, append([]string{"--redis", "redis://" + s.addr + "/0"}, args...)...)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	waiting := s.a14enqueueTracked(1, behaviour{})[0]
	if out, code := run("cancel", s.stream, waiting); code != 0 {
		t.Fatalf("cancel waiting: exit %d: %s", code, out)
	}
	if out, _ := run("job", s.stream, waiting); !strings.Contains(out, "cancelled") {
		t.Errorf("job after cancel of a waiting job: %s", out)
	}
	w := s.worker("w1", workerOpts{Visibility: 10 * time.Second})
	running := s.a14enqueueTracked(1, behaviour{SleepMS: 60000})[0]
	eventually(t, 60*time.Second, func() (bool, string) {
		return len(a14events(readLedger(t, s.ledger), "start", running)) == 1, "not started"
	})
	out, code := run("cancel", s.stream, running)
	t.Logf("pelican cancel of a running job: exit %d: %s", code, strings.TrimSpace(out))
	if code != 0 || !strings.Contains(out, "cancelling") {
		t.Errorf("cancel running: exit %d, output %q; want cancelling, exit 0", code, out)
	}
	s.a14waitState(running, 30*time.Second, stream.StateCancelled)
	if out, _ := run("job", s.stream, running); !strings.Contains(out, "cancelled") {
		t.Errorf("job after the cancel: %s", out)
	}
	if out, code := run("cancel", s.stream, running); code != 1 {
		t.Errorf("cancel of a cancelled job: exit %d (%s), want 1", code, out)
	}
	if out, code := run("cancel", s.stream, "no-such-job"); code != 4 {
		t.Errorf("cancel of an unknown job: exit %d (%s), want 4", code, out)
	}
	if out, code := run("job", s.stream, "no-such-job"); code != 4 {
		t.Errorf("job of an unknown job: exit %d (%s), want 4", code, out)
	}
	if n := len(a14events(readLedger(t, s.ledger), "operator_cancel", running)); n != 1 {
		t.Errorf("operator_cancel events %d, want 1", n)
	}
	w.kill()
}

// TestAttack14CancelProc_cancelDuringSIGTERMDrain cancels a running job
// after its worker got SIGTERM (draining, drain deadline 4 s): the docs
// promise the holder cancels the handler with ErrCancelled and the job ends
// cancelled; a job given back must not run again on the next worker.
func TestAttack14CancelProc_cancelDuringSIGTERMDrain(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	a := s.worker("wa", workerOpts{Visibility: 10 * time.Second, Shutdown: 4 * time.Second})
	id := s.a14enqueueTracked(1, behaviour{SleepMS: 6000})[0]
	eventually(t, 60*time.Second, func() (bool, string) {
		return len(a14events(readLedger(t, s.ledger), "start", id)) == 1, "not started"
	})
	a.term()
	// The job is on its way out of a draining worker; cancel it now.
	was, err := control.Cancel(context.Background(), s.rdb, s.stream, id)
	if err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel = %q, %v", was, err)
	}
	_ = a.wait(60 * time.Second)
	b := s.worker("wb", workerOpts{Visibility: 10 * time.Second})
	s.a14waitState(id, 60*time.Second, stream.StateCancelled, stream.StateDone, stream.StateDead)
	eventually(t, 30*time.Second, poll.True("pending 0", func() bool { return s.pending("g") == 0 }))
	b.term()
	_ = b.wait(30 * time.Second)
	entries := readLedger(t, s.ledger)
	for _, e := range entries {
		t.Logf("ledger: %s on %s deliveries %d", e.Event, e.Consumer, e.Deliveries)
	}
	if st := s.a14lookup(id).State; st != stream.StateCancelled {
		t.Errorf("final state %q, want cancelled", st)
	}
	for _, e := range a14events(entries, "start", id) {
		if e.Consumer == "wb" {
			t.Errorf("the next worker ran the cancelled job")
		}
	}
}
