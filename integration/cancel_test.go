package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/stream"
)

// enqueueTracked adds tracked jobs with behaviour b and returns their IDs.
func (s *scenario) enqueueTracked(n int, b behaviour) []string {
	s.t.Helper()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream, Track: true})
	ids := make([]string, n)
	for i := range ids {
		j, err := stream.NewJSONJob("test", b)
		if err != nil {
			s.t.Fatal(err)
		}
		if _, err := p.Enqueue(context.Background(), j); err != nil {
			s.t.Fatal(err)
		}
		ids[i] = j.ID
	}
	s.t.Cleanup(func() {
		for _, id := range ids {
			s.rdb.Del(context.Background(), stream.JobKey(s.keys, id))
		}
	})
	return ids
}

// lookupState returns the job's state as control.Lookup says it.
func (s *scenario) lookupState(id string) string {
	info, err := control.Lookup(context.Background(), s.rdb, s.stream, id)
	if err != nil {
		return "error: " + err.Error()
	}
	return info.State
}

// Two consumer processes; a long tracked job is cancelled while it runs:
// its handler's context is cancelled with cause consumer.ErrCancelled
// (ledger: operator_cancel), Lookup says cancelled, it never starts again,
// and the other jobs run once each, unaffected.
func TestCancel_runningTwoProcesses(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	for _, n := range []string{"w1", "w2"} {
		s.worker(n, workerOpts{Concurrency: 2})
	}
	long := s.enqueueTracked(1, behaviour{SleepMS: 120_000})[0]
	short := s.enqueueTracked(20, behaviour{SleepMS: 20})
	eventually(t, 60*time.Second, func() (bool, string) {
		n := countEvents(readLedger(t, s.ledger), "start")[long]
		return n == 1, fmt.Sprintf("long job started %d times", n)
	})
	asked := time.Now()
	if was, err := control.Cancel(context.Background(), s.rdb, s.stream, long); err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel(running) = %q, %v; want cancelling", was, err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		st := s.lookupState(long)
		return st == stream.StateCancelled, st
	})
	t.Logf("cancelled %v after Cancel returned", time.Since(asked).Round(time.Millisecond))
	for _, id := range short {
		eventually(t, 60*time.Second, func() (bool, string) {
			st := s.lookupState(id)
			return st == stream.StateDone, st
		})
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		n := s.pending("g")
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	// Past a visibility timeout and sweeps: nothing runs it again.
	time.Sleep(2 * time.Second)
	led := readLedger(t, s.ledger)
	for _, e := range led {
		if e.JobID == long && e.Event == "start" && e.At.After(asked) {
			t.Errorf("long job started again at %v, after Cancel returned (%v)", e.At, asked)
		}
	}
	switch c, lost := countEvents(led, "operator_cancel")[long], countEvents(led, "cancelled")[long]; {
	case lost > 0:
		// A loaded machine: its lease was lost first (another cause), so
		// the ErrCancelled cause cannot be checked this run.
		t.Logf("long job's lease was lost %d times (slow machine); not checking the ErrCancelled cause", lost)
	case c != 1:
		t.Errorf("long job: %d handler cancels with cause ErrCancelled; want 1", c)
	}
	effects := countEvents(led, "effect")
	for _, id := range short {
		if effects[id] != 1 {
			t.Errorf("short job %s: %d effects; want 1", id, effects[id])
		}
	}
	if st := s.lookupState(long); st != stream.StateCancelled {
		t.Errorf("long job finally %s; want cancelled", st)
	}
}

// A job whose handler ignores its context is cancelled, then its worker is
// SIGKILLed before it settles: the consumer that reclaims it settles it
// cancelled without running it.
func TestCancel_runnerKilled(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	w1 := s.worker("w1", workerOpts{Concurrency: 1})
	id := s.enqueueTracked(1, behaviour{SleepMS: 120_000, IgnoreCtx: true})[0]
	eventually(t, 60*time.Second, func() (bool, string) {
		n := countEvents(readLedger(t, s.ledger), "start")[id]
		return n == 1, fmt.Sprintf("started %d times", n)
	})
	if was, err := control.Cancel(context.Background(), s.rdb, s.stream, id); err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel(running) = %q, %v; want cancelling", was, err)
	}
	w1.kill()
	if st := s.lookupState(id); st != stream.StateCancelling {
		t.Fatalf("after the kill: %s; want cancelling (the handler ignored its context)", st)
	}
	s.worker("w2", workerOpts{Concurrency: 1})
	eventually(t, 60*time.Second, func() (bool, string) {
		st := s.lookupState(id)
		return st == stream.StateCancelled, st
	})
	eventually(t, 30*time.Second, func() (bool, string) {
		n := s.pending("g")
		return n == 0, fmt.Sprintf("%d pending", n)
	})
	if n := countEvents(readLedger(t, s.ledger), "start")[id]; n != 1 {
		t.Errorf("job started %d times; want once (by w1; w2 settles it without running it)", n)
	}
}
