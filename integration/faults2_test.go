package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// Redis unavailable mid-run (F14), on a private redis-server with
// appendfsync always so that a SIGKILL loses nothing acknowledged: frozen
// with SIGSTOP (a black hole: connections hang), or killed and restarted
// (refused connections, then an empty script cache). Two workers ride it
// out: every job ends with at least one effect, nothing is left pending or
// dead-lettered, processing resumes within seconds of Redis coming back,
// and the workers never exit.
func TestFault_redisOutage(t *testing.T) {
	t.Parallel()
	const outage = 5 * time.Second
	for _, tc := range []struct {
		name  string
		fault func(srv *redistest.Server)
	}{
		{"SIGSTOP", func(srv *redistest.Server) {
			srv.Stop()
			time.Sleep(outage) // the outage itself, not a wait for something
			srv.Cont()
		}},
		// Longer than go-redis waits for the reply to a blocked XREADGROUP
		// (Block + 10 s), so that the read itself fails with a timeout.
		{"SIGSTOP past the blocked read's timeout", func(srv *redistest.Server) {
			srv.Stop()
			time.Sleep(11 * time.Second) // the outage itself
			srv.Cont()
		}},
		{"SIGKILL and restart", func(srv *redistest.Server) {
			srv.Kill9()
			time.Sleep(outage) // the outage itself
			srv.Restart()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Jobs of 5 ms: on a quiet machine all 300 may be done before the
			// fault, which then hits no work; the run is repeated with slower
			// jobs.
			redistest.Widen(t, "sleep", 5*time.Millisecond, func(t *testing.T, sleep time.Duration) (wider time.Duration) {
				srv := redistest.Start(t, redistest.Options{AOF: "always"})
				s := newScenario(t, srv.Client(t), srv.Addr())
				const n = 300
				jobs := s.enqueue(n, behaviour{SleepMS: int(sleep.Milliseconds())})
				workers := []*worker{
					s.worker("a", workerOpts{Concurrency: 2}),
					s.worker("b", workerOpts{Concurrency: 2}),
				}
				distinct := func(event string) map[string]int { return countEvents(readLedger(t, s.ledger), event) }
				eventually(t, 20*time.Second, func() (bool, string) {
					d := len(distinct("effect"))
					return d >= 100, fmt.Sprintf("%d jobs done before the fault, want 100", d)
				})

				downAt := time.Now()
				tc.fault(srv)
				upAt := time.Now()
				ledger := readLedger(t, s.ledger)
				startedBefore := countEvents(ledger, "start")
				doneBefore := len(countEvents(ledger, "effect"))
				t.Logf("Redis down %v; %d of %d jobs had started, %d were done", upAt.Sub(downAt).Round(time.Millisecond), len(startedBefore), n, doneBefore)
				if len(startedBefore) >= n {
					t.Logf("all %d jobs had started before Redis came back: the fault hit no work; running again with slower jobs", n)
					return 2 * sleep
				}

				// Resumed: a job that had not started when Redis came back is
				// done.
				eventually(t, 15*time.Second, func() (bool, string) {
					for id := range distinct("effect") {
						if startedBefore[id] == 0 {
							return true, ""
						}
					}
					return false, "no new job done since Redis came back"
				})
				t.Logf("processing resumed %v after Redis came back", time.Since(upAt).Round(time.Millisecond))

				eventually(t, 30*time.Second, func() (bool, string) {
					effects := distinct("effect")
					for _, id := range jobs {
						if effects[id] == 0 {
							return false, fmt.Sprintf("job %s has no effect (%d of %d done)", id, len(effects), n)
						}
					}
					return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
				})
				t.Logf("all %d jobs done %v after Redis came back", n, time.Since(upAt).Round(time.Millisecond))
				if d := s.dead(); len(d) != 0 {
					t.Errorf("%d dead-lettered entries; want none: %v", len(d), d[0])
				}
				dups := 0
				for _, c := range distinct("effect") {
					dups += c - 1
				}
				t.Logf("%d repeated effects (jobs run again after a lost ack or reclaim)", dups)
				for _, w := range workers {
					select {
					case <-w.done:
						t.Fatalf("worker %s exited: %v", w.name, w.err)
					default:
					}
					w.term()
					if err := w.wait(10 * time.Second); err != nil {
						t.Errorf("worker %s exit: %v", w.name, err)
					}
					st, _ := w.stats()
					t.Logf("worker %s stats %+v", w.name, st)
					// Backoff, not a hot loop: about 8 failed reads in 5 s.
					if st.ReadErrors > 40 {
						t.Errorf("worker %s: %d read errors; want the read loop to back off", w.name, st.ReadErrors)
					}
				}
				return 0
			})
		})
	}
}

// The consumer group, or the whole stream, deleted under a worker blocked
// in XREADGROUP (F30): the worker recreates the group (MKSTREAM, from the
// first entry), says so in its log, processes the jobs enqueued afterwards
// and keeps running without an error loop.
func TestFault_groupDeleted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cmd  []any
		// rerun: the jobs done before whose entries are still in the
		// stream (settled entries are deleted, but not always at once)
		// run again, since the group is recreated from the first entry
		// (REDIS-NOTES §1.10: duplicates are absorbed by idempotency).
		rerun bool
	}{
		{"XGROUP DESTROY", []any{"XGROUP", "DESTROY", "", "g"}, true},
		{"DEL stream", []any{"DEL", ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A server of its own, so that CLIENT LIST shows only this
			// worker's connections.
			srv := redistest.Start(t, redistest.Options{})
			s := newScenario(t, srv.Client(t), srv.Addr())
			// Sweeps are rare, so the worker spends its idle time blocked.
			w := s.worker("a", workerOpts{Sweep: 2 * time.Second, Block: 300 * time.Millisecond})
			before := s.enqueue(10, behaviour{SleepMS: 5})
			eventually(t, 10*time.Second, func() (bool, string) {
				effects := countEvents(readLedger(t, s.ledger), "effect")
				p := faultPending(s)
				return len(effects) == len(before) && p == 0, fmt.Sprintf("%d of %d jobs done, pending %d", len(effects), len(before), p)
			})

			eventually(t, 10*time.Second, func() (bool, string) {
				list, err := s.rdb.ClientList(t.Context()).Result()
				if err != nil {
					return false, err.Error()
				}
				for _, line := range strings.Split(list, "\n") {
					if strings.Contains(line, "cmd=xreadgroup") && strings.Contains(line, "flags=b") {
						return true, ""
					}
				}
				return false, "the worker is not blocked in XREADGROUP:\n" + list
			})
			kept := map[string]bool{}
			for _, m := range s.rdb.XRange(t.Context(), s.stream, "-", "+").Val() {
				if j, err := stream.Decode(m.ID, m.Values); err == nil {
					kept[j.ID] = true
				}
			}
			cmd := append([]any(nil), tc.cmd...)
			for i, a := range cmd {
				if a == "" {
					cmd[i] = s.stream
				}
			}
			if err := s.rdb.Do(t.Context(), cmd...).Err(); err != nil {
				t.Fatalf("%v: %v", cmd, err)
			}
			deletedAt := time.Now()

			after := s.enqueue(10, behaviour{SleepMS: 5})
			eventually(t, 10*time.Second, func() (bool, string) {
				effects := countEvents(readLedger(t, s.ledger), "effect")
				for _, id := range after {
					if effects[id] == 0 {
						return false, fmt.Sprintf("job %s enqueued after the %s has no effect", id, tc.name)
					}
				}
				p := faultPending(s)
				return p == 0, fmt.Sprintf("pending = %d", p)
			})
			t.Logf("jobs enqueued after the %s done %v later", tc.name, time.Since(deletedAt).Round(time.Millisecond))
			if !strings.Contains(w.stderr.String(), "consumer group was missing and has been recreated") {
				t.Errorf("no log line about the recreated group")
			}
			for _, line := range strings.Split(w.stderr.String(), "\n") {
				if _, e, ok := strings.Cut(line, "reading from Redis failed"); ok {
					t.Logf("after the %s, the blocked read failed:%s", tc.name, e)
				}
			}
			effects := countEvents(readLedger(t, s.ledger), "effect")
			for _, id := range after {
				if effects[id] != 1 {
					t.Errorf("job %s enqueued after the %s: %d effects, want 1", id, tc.name, effects[id])
				}
			}
			t.Logf("%d of the %d settled jobs were still in the stream", len(kept), len(before))
			for _, id := range before {
				want := 1
				if tc.rerun && kept[id] {
					want = 2
				}
				if effects[id] != want {
					t.Errorf("job %s done before the %s (entry kept: %v): %d effects, want %d", id, tc.name, kept[id], effects[id], want)
				}
			}
			select {
			case <-w.done:
				t.Fatalf("worker exited: %v", w.err)
			default:
			}
			w.term()
			if err := w.wait(10 * time.Second); err != nil {
				t.Fatalf("worker exit: %v", err)
			}
			st, _ := w.stats()
			t.Logf("worker stats %+v", st)
			if st.ReadErrors > 5 {
				t.Errorf("%d read errors; want a few at most (no error loop)", st.ReadErrors)
			}
		})
	}
}

// faultPending returns the group's pending count, or -1 while the group
// does not exist (before a worker creates it, or after it was deleted).
func faultPending(s *scenario) int64 {
	p, err := s.rdb.XPending(context.Background(), s.stream, "g").Result()
	if err != nil {
		return -1
	}
	return p.Count
}
