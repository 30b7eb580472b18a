package integration

import (
	"fmt"

	"github.com/redis/go-redis/v9"
	"testing"
	"time"
)

// A worker SIGKILLed in the middle of a handler: the job completes on
// another consumer within the visibility timeout plus a sweep interval, and
// nothing is lost or left pending.
func TestCrash_midHandler(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	const n = 50
	ids := s.enqueue(n, behaviour{SleepMS: 20})
	victim := s.enqueue(1, behaviour{SleepMS: 100, Crash: "before", CrashOn: "a"})[0]
	a := s.worker("a", workerOpts{})
	eventually(t, 10*time.Second, func() (bool, string) { return a.killed(), "worker a did not crash at its crash point" })
	crashedAt := time.Now()
	b := s.worker("b", workerOpts{})
	var doneAt time.Time
	eventually(t, 10*time.Second, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		if effects[victim] == 0 {
			p, _ := s.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: s.stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
			return false, fmt.Sprintf("victim job never completed; ledger %d lines; pending %+v", len(readLedger(t, s.ledger)), p)
		}
		if doneAt.IsZero() {
			doneAt = time.Now()
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
	// Visibility 600 ms + sweep 100 ms, plus b's start-up and slack.
	if took := doneAt.Sub(crashedAt); took > 3*time.Second {
		t.Errorf("recovery took %v", took)
	}
	b.term()
	if err := b.wait(5 * time.Second); err != nil {
		t.Fatalf("worker b exit: %v", err)
	}
	if st, ok := b.stats(); !ok || st.Reclaimed == 0 {
		t.Errorf("worker b stats %+v: want Reclaimed > 0", st)
	}
}
