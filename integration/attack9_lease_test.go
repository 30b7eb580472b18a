package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/redis/go-redis/v9"
)

// The lease (README, Visibility timeout): a worker that cannot extend a lease
// (cut off from Redis, stalled) cancels the handler a tenth of
// VisibilityTimeout before the lease ends, so it has stopped before another
// consumer can take the job over; such a job is not settled by it.

// a9Events returns the ledger entries of job id with event, by consumer.
func a9Events(entries []ledgerEntry, id, event string) map[string][]ledgerEntry {
	out := map[string][]ledgerEntry{}
	for _, e := range entries {
		if e.JobID == id && e.Event == event {
			out[e.Consumer] = append(out[e.Consumer], e)
		}
	}
	return out
}

func a9Proxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// A worker cut off from Redis by a partition (blackhole) cancels every
// running handler before the worker that takes the jobs over starts them;
// after the partition heals it settles none of them, and each job has one
// effect.
func TestAttack9_lease_blackholeStopsBeforeTakeover(t *testing.T) {
	t.Parallel()
	// Without a heartbeat (not cut off) w1 competes with w2 for the jobs
	// whose leases end, and runs counted as crashes run one at a time: "all
	// taken over by w2" does not follow; TestCrash_longHandler/noHeartbeat
	// covers that mode.
	for _, mode := range []string{"blackhole", "refuse"} {
		t.Run(mode, func(t *testing.T) { a9LeaseCutOff(t, mode) })
	}
}

// a9LeaseCutOff: w1 runs six jobs and is cut off from Redis (blackhole:
// a partition; refuse: connections reset) or runs them with its heartbeat
// disabled; w2 takes them over after the visibility timeout.
func a9LeaseCutOff(t *testing.T, mode string) {
	s := newA9Scenario(t)
	proxy := a9Proxy(t, s.addr)
	release := filepath.Join(t.TempDir(), "release")
	ids := s.a9Enqueue(a9Repeat(6, a9Job{WaitFile: release})...)
	const vis = 4 * time.Second
	cfg1 := a9Config{Addr: proxy.Addr(), Visibility: vis}
	if mode == "noHeartbeat" {
		cfg1.Heartbeat = -1
	}
	w1 := s.a9Worker("w1", cfg1)
	eventually(t, time.Minute, func() (bool, string) {
		missing := a9Missing(readLedger(t, s.ledger), "start", ids)
		return len(missing) == 0, "not started on w1: " + a9Short(missing)
	})
	switch mode {
	case "blackhole":
		proxy.Blackhole()
	case "refuse":
		proxy.Refuse()
	}
	w2 := s.a9Worker("w2", a9Config{Visibility: vis})
	eventually(t, time.Minute, func() (bool, string) {
		led := readLedger(t, s.ledger)
		n := 0
		for _, id := range ids {
			if len(a9Events(led, id, "start")["w2"]) > 0 {
				n++
			}
		}
		return n == len(ids), fmt.Sprintf("%d of %d jobs taken over by w2", n, len(ids))
	})
	led := readLedger(t, s.ledger)
	for _, id := range ids {
		taken := a9Events(led, id, "start")["w2"][0].At
		cancels := a9Events(led, id, "cancel_lease")["w1"]
		if len(cancels) != 1 {
			t.Errorf("job %s: w1 recorded %d lease cancellations before w2 started it, want 1 (ledger: %v)", id, len(cancels), a9Events(led, id, "cancelled"))
			continue
		}
		if !cancels[0].At.Before(taken) {
			t.Errorf("job %s: w1's handler was cancelled at %v, after w2 started the job at %v", id, cancels[0].At.Format(time.StampMicro), taken.Format(time.StampMicro))
		}
	}
	proxy.Pass()
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		missing := a9Missing(readLedger(t, s.ledger), "effect", ids)
		return len(missing) == 0 && s.a9Idle("g"), "no effect: " + a9Short(missing)
	})
	w1.term()
	w2.term()
	w1.wait(30 * time.Second)
	w2.wait(30 * time.Second)
	led = readLedger(t, s.ledger)
	for _, id := range ids {
		eff := a9Events(led, id, "effect")
		if len(eff["w1"]) != 0 || len(eff["w2"]) != 1 {
			t.Errorf("job %s: effects w1=%d w2=%d, want 0 and 1", id, len(eff["w1"]), len(eff["w2"]))
		}
	}
	if st, ok := w1.stats(); !ok || st.LeaseLost < uint64(len(ids)) || st.Acked != 0 {
		t.Errorf("w1 stats %+v (printed %v): want LeaseLost >= %d and nothing acknowledged", st, ok, len(ids))
	}
}

// A stalled worker (SIGSTOP past the lease) cannot act while frozen; once it
// resumes, its handlers see their lease lost and never make their effect,
// and each job runs once on the worker that took it over.
func TestAttack9_lease_stalledWorkerCancelsOnResume(t *testing.T) {
	t.Parallel()
	s := newA9Scenario(t)
	release := filepath.Join(t.TempDir(), "release")
	ids := s.a9Enqueue(a9Repeat(6, a9Job{WaitFile: release})...)
	const vis = 2 * time.Second
	w1 := s.a9Worker("w1", a9Config{Visibility: vis})
	eventually(t, time.Minute, func() (bool, string) {
		missing := a9Missing(readLedger(t, s.ledger), "start", ids)
		return len(missing) == 0, "not started on w1: " + a9Short(missing)
	})
	w1.stop()
	w2 := s.a9Worker("w2", a9Config{Visibility: vis})
	eventually(t, time.Minute, func() (bool, string) {
		led := readLedger(t, s.ledger)
		n := 0
		for _, id := range ids {
			if len(a9Events(led, id, "start")["w2"]) > 0 {
				n++
			}
		}
		return n == len(ids), fmt.Sprintf("%d of %d jobs taken over by w2", n, len(ids))
	})
	w1.cont()
	eventually(t, time.Minute, func() (bool, string) {
		led := readLedger(t, s.ledger)
		n := 0
		for _, id := range ids {
			if len(a9Events(led, id, "cancel_lease")["w1"]) > 0 {
				n++
			}
		}
		return n == len(ids), fmt.Sprintf("%d of %d handlers on w1 cancelled for lease loss", n, len(ids))
	})
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		missing := a9Missing(readLedger(t, s.ledger), "effect", ids)
		return len(missing) == 0 && s.a9Idle("g"), "no effect: " + a9Short(missing)
	})
	w1.term()
	w2.term()
	w1.wait(30 * time.Second)
	w2.wait(30 * time.Second)
	led := readLedger(t, s.ledger)
	for _, id := range ids {
		eff := a9Events(led, id, "effect")
		if len(eff["w1"]) != 0 || len(eff["w2"]) != 1 {
			t.Errorf("job %s: effects w1=%d w2=%d, want 0 and 1", id, len(eff["w1"]), len(eff["w2"]))
		}
	}
}

// A read reply held back by the network past the lease: the entry was
// delivered to w1 (it owns it in the group), but w1 gets the reply only
// after w2 has taken the job over and finished it. w1 must not start it.
func TestAttack9_lease_heldBackReplyNotStarted(t *testing.T) {
	t.Parallel()
	s := newA9Scenario(t)
	ctx := context.Background()
	proxy := a9Proxy(t, s.addr)
	const vis = 2 * time.Second
	cfg1 := a9Config{Addr: proxy.Addr(), Visibility: vis, Block: 900 * time.Millisecond}
	w1 := s.a9Worker("w1", cfg1)
	// Wait until w1 has created the group and is reading.
	warm := s.a9Enqueue(a9Job{N: -1})
	eventually(t, time.Minute, func() (bool, string) {
		return len(a9Missing(readLedger(t, s.ledger), "effect", warm)) == 0, "w1 not running"
	})
	var id string
	for try := 0; ; try++ {
		if try == 20 {
			t.Fatal("could not catch w1 blocked in a read at Redis")
		}
		time.Sleep(300 * time.Millisecond) // w1 is (most likely) blocked in XREADGROUP at Redis
		proxy.Blackhole()
		id = s.a9Enqueue(a9Job{N: try})[0]
		owner := ""
		for deadline := time.Now().Add(2 * time.Second); owner == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			p, err := s.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(p) == 1 {
				owner = p[0].Consumer
			}
		}
		if owner == "w1" {
			break
		}
		// w1's read was not at Redis: let it run the job and try again.
		proxy.Pass()
		eventually(t, time.Minute, func() (bool, string) {
			return countEvents(readLedger(t, s.ledger), "effect")[id] == 1 && s.a9Idle("g"), "w1 has not run job " + id
		})
	}
	// The reply is held: start w2, which takes the job over after the lease
	// and finishes it.
	w2 := s.a9Worker("w2", a9Config{Visibility: vis})
	eventually(t, time.Minute, func() (bool, string) {
		return len(a9Events(readLedger(t, s.ledger), id, "effect")["w2"]) == 1 && s.a9Idle("g"), "w2 has not finished the job"
	})
	w2.term()
	w2.wait(30 * time.Second)
	proxy.Pass()
	// w1 handles the late reply, then reads on: a marker job it runs shows
	// that it is past the late reply.
	marker := s.a9Enqueue(a9Job{N: -2})
	eventually(t, time.Minute, func() (bool, string) {
		return len(a9Events(readLedger(t, s.ledger), marker[0], "effect")["w1"]) == 1, "w1 has not run the marker"
	})
	w1.term()
	w1.wait(30 * time.Second)
	led := readLedger(t, s.ledger)
	if n := len(a9Events(led, id, "start")["w1"]); n != 0 {
		t.Errorf("w1 started the job %d times from a reply held back past its lease", n)
	}
	if n := countEvents(led, "effect")[id]; n != 1 {
		t.Errorf("job has %d effects, want 1", n)
	}
	if st, ok := w1.stats(); !ok || st.LeaseLost < 1 {
		t.Errorf("w1 stats %+v: want LeaseLost >= 1 (a job delivered after its lease ended)", st)
	}
}
