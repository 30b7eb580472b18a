package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// Fault-matrix tests (docs: REDIS-NOTES §8) against real Redis and worker
// subprocesses: foreign and malformed entries (F9), entries trimmed while
// pending (F19) and graceful shutdown with jobs in flight (F25). The Redis
// outage (F14) and group-loss (F30) rows are in faults2_test.go.

// A non-Go producer (the real redis-cli binary) writes malformed entries
// between valid jobs: each one is dead-lettered once, with reason
// "malformed", an error naming the offending field and its raw fields kept
// byte for byte, without ever reaching the handler; the valid jobs all run
// once, and nothing stays pending.
func TestFault_malformedEntries(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")

	type malformed struct {
		name  string
		field string   // the field the dead_error must name
		args  []string // field/value pairs
		stdin []byte   // with redis-cli -x: the value of the last field
		goRaw bool     // written with go-redis Do, as raw bytes
	}
	cases := []malformed{
		{name: "no type field", field: "type", args: []string{"v", "1", "payload", `{"sleep_ms":1}`}},
		{name: "empty type", field: "type", args: []string{"v", "1", "type", "", "payload", "{}"}},
		{name: "attempt abc", field: "attempt", args: []string{"v", "1", "type", "test", "payload", "{}", "attempt", "abc"}},
		{name: "version 2", field: "v", args: []string{"v", "2", "type", "test", "payload", "{}"}},
		{name: "binary created_at from stdin", field: "created_at",
			args:  []string{"v", "1", "type", "test", "payload", "{}", "created_at"},
			stdin: []byte("\x00\xff\xfe12\x00\r\n")},
		{name: "duplicate field names", field: "attempt",
			args: []string{"type", "test", "attempt", "x", "payload", "{}", "attempt", "-1", "type", "other"}},
		{name: "binary name and values", field: "max_attempts", goRaw: true,
			args: []string{"type", "test", "v", "1", "payload", "\x00\xff\x80{", "\xff\x00name", "\x00", "max_attempts", "\xff\x001"}},
	}

	var valid []string
	written := make(map[string][]string) // entry ID -> the fields as written
	wantField := make(map[string]string) // entry ID -> the field to blame
	for _, c := range cases {
		valid = append(valid, s.enqueue(5, behaviour{SleepMS: 5})...)
		var id string
		switch {
		case c.goRaw:
			args := []any{"XADD", s.stream, "*"}
			for _, f := range c.args {
				args = append(args, []byte(f))
			}
			var err error
			if id, err = s.rdb.Do(t.Context(), args...).Text(); err != nil {
				t.Fatalf("%s: XADD: %v", c.name, err)
			}
		default:
			id = faultCLI(t, s.addr, c.stdin, append([]string{"XADD", s.stream, "*"}, c.args...)...)
		}
		fields := slices.Clone(c.args)
		if c.stdin != nil {
			fields = append(fields, string(c.stdin))
		}
		// Redis keeps what it was sent, byte for byte: the entry reads back
		// as written (this checks the writing, not Pelican).
		if got := faultRawEntry(t, s.rdb, s.stream, id); !slices.Equal(got, fields) {
			t.Fatalf("%s: entry %s reads back as %q; wrote %q", c.name, id, got, fields)
		}
		written[id], wantField[id] = fields, c.field
	}
	if len(valid) != 5*len(cases) {
		t.Fatalf("enqueued %d valid jobs, want %d", len(valid), 5*len(cases))
	}
	// Started once the entries are read back: it deletes what it settles.
	a := s.worker("a", workerOpts{})

	eventually(t, 20*time.Second, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		for _, id := range valid {
			if effects[id] == 0 {
				return false, fmt.Sprintf("valid job %s has no effect (%d of %d done)", id, len(effects), len(valid))
			}
		}
		if n := len(s.dead()); n < len(written) {
			return false, fmt.Sprintf("%d dead-lettered entries, want %d", n, len(written))
		}
		return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
	})

	ledger := readLedger(t, s.ledger)
	starts, effects := countEvents(ledger, "start"), countEvents(ledger, "effect")
	for _, id := range valid {
		if starts[id] != 1 || effects[id] != 1 {
			t.Errorf("valid job %s: %d starts, %d effects; want 1 and 1", id, starts[id], effects[id])
		}
	}
	if n := len(countEvents(ledger, "start")); n != len(valid) {
		t.Errorf("the handler started %d distinct jobs, want only the %d valid ones", n, len(valid))
	}

	dead := faultRawRange(t, s.rdb, s.keys.Dead)
	if len(dead) != len(written) {
		t.Errorf("%d dead-letter entries, want %d (one per malformed entry)", len(dead), len(written))
	}
	meta := []string{"dead_reason", "dead_error", "dead_at", "dead_attempts", "dead_consumer", "dead_entry_id", "dead_stream"}
	seen := make(map[string]bool)
	for _, d := range dead {
		m := faultPairs(d.fields)
		src := m["dead_entry_id"]
		raw, ok := written[src]
		if !ok {
			t.Errorf("dead-letter entry %s: dead_entry_id %q is not one of the malformed entries", d.id, src)
			continue
		}
		if seen[src] {
			t.Errorf("entry %s dead-lettered twice", src)
		}
		seen[src] = true
		if len(d.fields) < len(raw) || !slices.Equal(d.fields[:len(raw)], raw) {
			t.Errorf("dead-letter entry of %s starts with %q; want the raw fields %q byte for byte", src, d.fields[:min(len(raw), len(d.fields))], raw)
			continue
		}
		var names []string
		for i := len(raw); i < len(d.fields); i += 2 {
			names = append(names, d.fields[i])
		}
		if !slices.Equal(names, meta) {
			t.Errorf("dead-letter entry of %s: fields after the raw ones %q; want %q", src, names, meta)
		}
		if m["dead_reason"] != "malformed" {
			t.Errorf("entry %s: dead_reason %q, want malformed", src, m["dead_reason"])
		}
		if e := m["dead_error"]; !strings.Contains(e, fmt.Sprintf("field %q", wantField[src])) || !strings.Contains(e, src) {
			t.Errorf("entry %s: dead_error %q does not name field %q and the entry", src, e, wantField[src])
		}
		if m["dead_attempts"] != "1" || m["dead_consumer"] != "a" || m["dead_stream"] != s.stream {
			t.Errorf("entry %s: dead_attempts %q, dead_consumer %q, dead_stream %q; want 1, a, %s",
				src, m["dead_attempts"], m["dead_consumer"], m["dead_stream"], s.stream)
		}
	}

	a.term()
	if err := a.wait(10 * time.Second); err != nil {
		t.Fatalf("worker a exit: %v", err)
	}
	if st, ok := a.stats(); !ok || st.Acked != uint64(len(valid)) || st.DeadLettered != uint64(len(written)) || st.Retried != 0 {
		t.Errorf("worker a stats %+v; want Acked %d, DeadLettered %d, Retried 0", st, len(valid), len(written))
	}
}

// Entries trimmed or deleted while pending (F19). A worker's jobs are in
// flight when their entries disappear from the stream.
func TestFault_trimmedWhilePending(t *testing.T) {
	t.Parallel()

	// The worker holding the entries is frozen, its entries removed, and it
	// is killed; the next worker reports the removed ones as lost and
	// removes them from the PEL, runs those still in the stream, and goes on
	// with new jobs: nothing loops.
	for _, tc := range []struct {
		name   string
		next   string // the next worker's consumer name
		remove func(s *scenario, entries []string) []string
		when   string // the lost report's "when"
	}{
		{name: "XTRIM MAXLEN 0, new consumer sweeps", next: "b", when: "reclaiming",
			remove: func(s *scenario, entries []string) []string {
				if err := s.rdb.Do(context.Background(), "XTRIM", s.stream, "MAXLEN", "0").Err(); err != nil {
					s.t.Fatalf("XTRIM: %v", err)
				}
				return entries
			}},
		{name: "XDEL two, same consumer re-reads", next: "a", when: "re-reading own pending entries",
			remove: func(s *scenario, entries []string) []string {
				gone := entries[1:3]
				if n, err := s.rdb.XDel(context.Background(), s.stream, gone...).Result(); err != nil || n != 2 {
					s.t.Fatalf("XDEL %v: %d, %v", gone, n, err)
				}
				return gone
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScenario(t, nil, "")
			jobs := s.enqueue(5, behaviour{SleepMS: 1500})
			a := s.worker("a", workerOpts{Concurrency: 5})
			entries := faultAwaitStarts(t, s, jobs, "a")
			// Freeze a first, so that none of its handlers finishes and
			// none of its heartbeats touches the entries after they go.
			a.stop()
			gone := tc.remove(s, entries)
			a.kill()
			if n := s.pending("g"); n != 5 {
				t.Fatalf("pending after the removal = %d; want all 5 (Redis keeps removed entries in the PEL)", n)
			}

			b := s.worker(tc.next, workerOpts{})
			eventually(t, 10*time.Second, func() (bool, string) {
				log := b.stderr.String()
				for _, id := range gone {
					if !faultLostReported(log, id, tc.when) {
						return false, fmt.Sprintf("entry %s not reported lost while %s", id, tc.when)
					}
				}
				return true, ""
			})
			// Whatever is still in the stream runs again, and new jobs run.
			more := s.enqueue(5, behaviour{SleepMS: 10})
			var kept []string
			for i, e := range entries {
				if !slices.Contains(gone, e) {
					kept = append(kept, jobs[i])
				}
			}
			eventually(t, 15*time.Second, func() (bool, string) {
				effects := countEvents(readLedger(t, s.ledger), "effect")
				for _, id := range append(slices.Clone(kept), more...) {
					if effects[id] != 1 {
						return false, fmt.Sprintf("job %s: %d effects, want 1", id, effects[id])
					}
				}
				return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
			})
			effects := countEvents(readLedger(t, s.ledger), "effect")
			for i, e := range entries {
				if slices.Contains(gone, e) && effects[jobs[i]] != 0 {
					t.Errorf("removed job %s has %d effects, want 0", jobs[i], effects[jobs[i]])
				}
			}
			b.term()
			if err := b.wait(10 * time.Second); err != nil {
				t.Fatalf("worker %s exit: %v", tc.next, err)
			}
			st, _ := b.stats()
			if st.Lost != uint64(len(gone)) || st.Acked != uint64(len(kept)+len(more)) || st.DeadLettered != 0 {
				t.Errorf("worker %s stats %+v; want Lost %d, Acked %d, nothing dead", tc.next, st, len(gone), len(kept)+len(more))
			}
		})
	}

	// The same worker finishes its handlers after the trim. The sweep runs
	// only at start (SweepInterval 10 s), so only the ack and the heartbeat
	// meet the trimmed entries.
	for _, tc := range []struct {
		name string
		o    workerOpts
	}{
		// Without a heartbeat the handlers' acks meet the dangling PEL
		// entries: XACK of a deleted-but-pending entry returns 1 on Redis
		// 7.0, so each job is acknowledged as usual.
		{name: "heartbeat off", o: workerOpts{Concurrency: 5, Sweep: 10 * time.Second, Visibility: 5 * time.Second, Heartbeat: -1}},
		// With one, a heartbeat's XCLAIM meets them first and Redis 7.0
		// drops them from the PEL: the handlers must still finish (nobody
		// else can run those jobs) and the entries be reported lost, not
		// cancelled as "lease lost to another consumer".
		{name: "heartbeat on", o: workerOpts{Concurrency: 5, Sweep: 10 * time.Second}},
	} {
		t.Run("same worker finishes, "+tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScenario(t, nil, "")
			jobs := s.enqueue(5, behaviour{SleepMS: 800})
			a := s.worker("a", tc.o)
			entries := faultAwaitStarts(t, s, jobs, "a")
			if err := s.rdb.Do(t.Context(), "XTRIM", s.stream, "MAXLEN", "0").Err(); err != nil {
				t.Fatalf("XTRIM: %v", err)
			}
			eventually(t, 10*time.Second, func() (bool, string) {
				ledger := readLedger(t, s.ledger)
				if c := countEvents(ledger, "cancelled"); len(c) > 0 {
					return true, "" // fail below, at once
				}
				effects := countEvents(ledger, "effect")
				for _, id := range jobs {
					if effects[id] == 0 {
						return false, fmt.Sprintf("job %s has no effect", id)
					}
				}
				return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
			})
			ledger := readLedger(t, s.ledger)
			if c := countEvents(ledger, "cancelled"); len(c) > 0 {
				t.Fatalf("handlers of trimmed entries were cancelled: %v\nworker log:\n%s", c, tail(a.stderr.String(), 3000))
			}
			more := s.enqueue(3, behaviour{SleepMS: 10})
			eventually(t, 10*time.Second, func() (bool, string) {
				effects := countEvents(readLedger(t, s.ledger), "effect")
				for _, id := range more {
					if effects[id] == 0 {
						return false, fmt.Sprintf("job %s enqueued after the trim has no effect", id)
					}
				}
				return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
			})
			effects := countEvents(readLedger(t, s.ledger), "effect")
			for _, id := range append(slices.Clone(jobs), more...) {
				if effects[id] != 1 {
					t.Errorf("job %s: %d effects, want 1", id, effects[id])
				}
			}
			a.term()
			if err := a.wait(10 * time.Second); err != nil {
				t.Fatalf("worker a exit: %v", err)
			}
			st, _ := a.stats()
			t.Logf("worker a stats after the trim: %+v", st)
			// Every trimmed job is accounted for once: acknowledged, or
			// reported lost (then its late ack is refused as stale).
			if st.Acked+st.Lost != 8 || st.LeaseLost != 0 || st.Stale != st.Lost || st.DeadLettered+st.Retried != 0 {
				t.Errorf("stats %+v; want Acked+Lost = 8, LeaseLost 0, Stale = Lost, nothing retried or dead", st)
			}
			if tc.o.Heartbeat < 0 && st.Acked != 8 {
				t.Errorf("without a heartbeat Acked = %d, want 8: XACK of a deleted-but-pending entry should succeed", st.Acked)
			}
			reported := 0
			for _, e := range entries {
				if faultLostReported(a.stderr.String(), e, "") {
					reported++
				}
			}
			if uint64(reported) != st.Lost {
				t.Errorf("%d trimmed entries named in lost reports; want Stats().Lost = %d", reported, st.Lost)
			}
		})
	}
}

// Graceful shutdown with 8 jobs in flight (F25): SIGTERM with a drain
// deadline of 1 s. Finished jobs are acknowledged; the cancelled ones are
// given back for the next sweep at once; the one that ignores its context
// is abandoned, named in Run's error, and taken over after the visibility
// timeout. Run returns within the deadline plus the abandon grace and a
// second, counted by the worker from its SIGTERM, net of its stalls.
//
// The timings the scenario relies on are measured, not assumed: when the
// worker noticed SIGTERM and returned, its stalls (see watchStalls), the
// jobs' starts (its ledger) and Redis idle times. A run in which the machine
// broke a precondition (a long job could have ended before the worker
// exited, a short one stalled past the deadline, worker b came after the
// abandoned job's visibility timeout) checked nothing and is repeated with
// every duration doubled.
func TestFault_gracefulShutdown(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "unit", time.Second, faultShutdown)
}

// faultShutdown runs TestFault_gracefulShutdown with drain deadline u, jobs
// of 0.3u and 3u and a visibility timeout of 3u; it returns a wider u if
// the run could not check.
func faultShutdown(t *testing.T, u time.Duration) (wider time.Duration) {
	const abandonGrace = 500 * time.Millisecond // consumer's, after the deadline
	s := newScenario(t, nil, "")
	visibility := 3 * u
	ms := func(d time.Duration) int { return int(d.Milliseconds()) }
	short := s.enqueue(4, behaviour{SleepMS: ms(3 * u / 10)})
	long := s.enqueue(3, behaviour{SleepMS: ms(3 * u)})
	stubborn := s.enqueue(1, behaviour{SleepMS: ms(3 * u), IgnoreCtx: true})[0]
	all := slices.Concat(short, long, []string{stubborn})
	a := s.worker("a", workerOpts{Concurrency: 8, Shutdown: u, Visibility: visibility})
	entries := faultAwaitStarts(t, s, all, "a")
	entryOf := make(map[string]string)
	for i, id := range all {
		entryOf[id] = entries[i]
	}

	termAt := time.Now()
	a.term()
	// Jobs enqueued after SIGTERM must not start on a: it stops reading.
	late := s.enqueue(5, behaviour{SleepMS: 10})
	err := a.wait(time.Minute)
	term, ended, stalled, ok := a.shutdown()
	longest, _ := a.longestStall()
	if !ok {
		t.Fatalf("worker a printed no shutdown times")
	}
	ledger := readLedger(t, s.ledger)
	startOnA := make(map[string]time.Time)
	for _, e := range ledger {
		if e.Event == "start" && e.Consumer == "a" {
			startOnA[e.JobID] = e.At
		}
	}
	t.Logf("worker a noticed SIGTERM %v after it was sent and returned %v later (stalled %v of it, longest stall %v)",
		term.Sub(termAt).Round(time.Millisecond), ended.Sub(term), stalled, longest)
	for _, id := range append(slices.Clone(long), stubborn) {
		if left := startOnA[id].Add(3 * u).Sub(ended); left <= 0 {
			t.Logf("the run checked nothing: job %s would have ended its %v %v before worker a exited", id, 3*u, -left)
			return 2 * u
		}
	}
	for _, id := range late {
		if at, ok := startOnA[id]; ok && at.Before(term) {
			t.Logf("the run checked nothing: job %s, enqueued after SIGTERM, started on a %v before a noticed it", id, term.Sub(at))
			return 2 * u
		}
	}
	effects, cancelled := countEvents(ledger, "effect"), countEvents(ledger, "cancelled")
	for _, id := range short {
		if effects[id] != 1 && longest >= u/2 {
			t.Logf("the run checked nothing: short job %s did not end before the deadline; worker a stalled %v", id, longest)
			return 2 * u
		}
	}

	if bound := u + abandonGrace + time.Second + stalled; ended.Sub(term) > bound {
		t.Errorf("worker a's Run returned %v after SIGTERM; want <= %v deadline + %v grace + 1 s + %v stalled",
			ended.Sub(term), u, abandonGrace, stalled)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("worker a exit: %v; want exit code 3 (Run returned an error)", err)
	}
	runErr := faultLine(a.stderr.String(), "PW_RUN_ERROR")
	if !strings.Contains(runErr, stubborn) || !strings.Contains(runErr, entryOf[stubborn]) {
		t.Errorf("Run error %q does not name the abandoned job %s (entry %s)", runErr, stubborn, entryOf[stubborn])
	}
	for _, id := range append(slices.Clone(short), long...) {
		if strings.Contains(runErr, id) {
			t.Errorf("Run error %q names job %s, which returned", runErr, id)
		}
	}
	if st, ok := a.stats(); !ok || st.Acked != 4 {
		t.Errorf("worker a stats %+v; want Acked 4 (the short jobs)", st)
	}

	for _, id := range short {
		if effects[id] != 1 {
			t.Errorf("short job %s: %d effects before the exit, want 1", id, effects[id])
		}
	}
	for _, id := range long {
		if effects[id] != 0 || cancelled[id] != 1 {
			t.Errorf("long job %s: %d effects, %d cancellations; want 0 and 1", id, effects[id], cancelled[id])
		}
	}
	for _, e := range ledger {
		if e.Event == "cancelled" && e.At.Sub(term) > u+500*time.Millisecond+stalled {
			t.Errorf("job %s cancelled %v after SIGTERM; want <= the %v deadline + 500 ms + %v stalled", e.JobID, e.At.Sub(term), u, stalled)
		}
	}
	if effects[stubborn] != 0 || cancelled[stubborn] != 0 {
		t.Errorf("job ignoring its context: %d effects, %d cancellations; want none", effects[stubborn], cancelled[stubborn])
	}
	for _, id := range late {
		if _, ok := startOnA[id]; ok {
			t.Errorf("job %s enqueued after SIGTERM started on worker a after it noticed SIGTERM", id)
		}
	}

	pel := faultPEL(t, s)
	readAt := time.Now()
	// Jobs enqueued after SIGTERM may have been read into a's queue
	// (Config.Prefetch) before it stopped reading: they never started, and
	// are given back, delivery count as it was.
	unfinished := make(map[string]bool)
	for _, id := range append(slices.Clone(long), stubborn) {
		unfinished[entryOf[id]] = true
	}
	for id, p := range pel {
		if unfinished[id] {
			continue
		}
		if p.Consumer != "a" || p.RetryCount != 0 || p.Idle < visibility {
			t.Errorf("entry %s pending as %+v; want it given back (a late job read into a's queue, never started)", id, p)
		}
		delete(pel, id)
	}
	if len(pel) != 4 {
		t.Fatalf("PEL after the exit: %+v; want the 4 unfinished jobs", pel)
	}
	for _, id := range append(slices.Clone(long), stubborn) {
		p, ok := pel[entryOf[id]]
		switch {
		case !ok:
			t.Errorf("unfinished job %s (entry %s) is not pending", id, entryOf[id])
		case p.Consumer != "a" || id == stubborn && p.RetryCount != 1 || id != stubborn && p.RetryCount != 0:
			t.Errorf("entry %s pending as %+v; want consumer a, delivery count 1 (abandoned) or 0 (given back: the next claim makes it 1 again)", entryOf[id], p)
		case id != stubborn && p.Idle < visibility:
			t.Errorf("cancelled entry %s idle %v; want >= the visibility timeout (given back)", entryOf[id], p.Idle)
		case id == stubborn && p.Idle >= visibility:
			// Heartbeated every visibility/4 until the exit, it can be
			// this idle only if the PEL was read late or a stalled.
			if readAt.Sub(ended)+visibility/4+longest >= visibility {
				t.Logf("the run checked nothing: the PEL was read %v after a exited, a's longest stall %v", readAt.Sub(ended), longest)
				return 2 * u
			}
			t.Errorf("abandoned entry %s idle %v; want less than the visibility timeout (it was heartbeated until the exit)", entryOf[id], p.Idle)
		}
	}

	// A new consumer takes the given-back jobs at its first sweep, and the
	// abandoned one only once a visibility timeout has passed since a's
	// last heartbeat: no earlier than claimable, by this process's clock.
	asked := time.Now()
	sp, err := s.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: s.stream, Group: "g",
		Start: entryOf[stubborn], End: entryOf[stubborn], Count: 1}).Result()
	if err != nil || len(sp) != 1 {
		t.Fatalf("XPENDING of the abandoned entry: %v, %v", sp, err)
	}
	claimable := asked.Add(visibility - sp[0].Idle - time.Millisecond)
	startB := time.Now()
	s.worker("b", workerOpts{Visibility: visibility})
	startedOnB := func() map[string]ledgerEntry {
		m := make(map[string]ledgerEntry)
		for _, e := range readLedger(t, s.ledger) {
			if e.Event == "start" && e.Consumer == "b" {
				m[e.JobID] = e
			}
		}
		return m
	}
	eventually(t, visibility+time.Minute, func() (bool, string) {
		m := startedOnB()
		for _, id := range long {
			if _, ok := m[id]; !ok {
				return false, fmt.Sprintf("given-back job %s not started on b", id)
			}
		}
		return true, ""
	})
	m := startedOnB()
	var lastLong time.Time
	for _, id := range long {
		if m[id].At.After(lastLong) {
			lastLong = m[id].At
		}
		if m[id].Deliveries != 1 {
			t.Errorf("given-back job %s has delivery count %d on b, want 1 (a give-back is not a delivery)", id, m[id].Deliveries)
		}
	}
	t.Logf("given-back jobs restarted on b %v after b started, %v before the abandoned one could be claimed",
		lastLong.Sub(startB).Round(time.Millisecond), claimable.Sub(lastLong).Round(time.Millisecond))
	eventually(t, visibility+time.Minute, func() (bool, string) {
		_, ok := startedOnB()[stubborn]
		return ok, "abandoned job not taken over"
	})
	sb := startedOnB()[stubborn]
	t.Logf("abandoned job restarted on b %v after a exited", sb.At.Sub(ended))
	if sb.Deliveries != 2 {
		t.Errorf("abandoned job delivered %d times on b, want 2", sb.Deliveries)
	}
	// The ledger's times are whole milliseconds.
	if sb.At.Before(claimable.Truncate(time.Millisecond)) {
		t.Errorf("abandoned job started on b %v before its visibility timeout since a's last heartbeat", claimable.Sub(sb.At))
	}

	eventually(t, time.Minute, func() (bool, string) {
		effects := countEvents(readLedger(t, s.ledger), "effect")
		for _, id := range append(slices.Clone(all), late...) {
			if effects[id] != 1 {
				return false, fmt.Sprintf("job %s: %d effects, want 1", id, effects[id])
			}
		}
		return s.pending("g") == 0, fmt.Sprintf("pending = %d", s.pending("g"))
	})
	if d := s.dead(); len(d) != 0 {
		t.Errorf("dead-letter stream: %v; want empty", d)
	}
	if !lastLong.Before(claimable.Truncate(time.Millisecond)) {
		t.Logf("the run checked nothing of the given-back jobs' restart: b took them %v after the abandoned job could be claimed",
			lastLong.Sub(claimable))
		return 2 * u
	}
	return 0
}

// faultCLI runs the real redis-cli against addr and returns the entry ID it
// prints. With stdin set, redis-cli -x reads the last argument from it, raw.
func faultCLI(t *testing.T, addr string, stdin []byte, args ...string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"-h", host, "-p", port}
	if stdin != nil {
		argv = append(argv, "-x")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "redis-cli", append(argv, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	id := strings.TrimSuffix(string(out), "\n")
	if err != nil || !regexp.MustCompile(`^\d+-\d+$`).MatchString(id) {
		t.Fatalf("redis-cli %q: %v: %q %s", args, err, out, stderr.String())
	}
	return id
}

// faultEntry is a stream entry with its fields in order, as raw strings.
type faultEntry struct {
	id     string
	fields []string
}

// faultRawRange returns every entry of key, fields in order.
func faultRawRange(t *testing.T, rdb *redis.Client, key string) []faultEntry {
	t.Helper()
	return faultXRange(t, rdb, key, "-", "+")
}

// faultRawEntry returns the fields of entry id, in order.
func faultRawEntry(t *testing.T, rdb *redis.Client, key, id string) []string {
	t.Helper()
	e := faultXRange(t, rdb, key, id, id)
	if len(e) != 1 {
		t.Fatalf("XRANGE %s %s: %d entries", key, id, len(e))
	}
	return e[0].fields
}

func faultXRange(t *testing.T, rdb *redis.Client, key, from, to string) []faultEntry {
	t.Helper()
	res, err := rdb.Do(t.Context(), "XRANGE", key, from, to).Slice()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", key, err)
	}
	var out []faultEntry
	for _, x := range res {
		e, ok := x.([]any)
		if !ok || len(e) != 2 {
			t.Fatalf("XRANGE %s: unexpected entry %#v", key, x)
		}
		id, _ := e[0].(string)
		flat, _ := e[1].([]any)
		fe := faultEntry{id: id}
		for _, f := range flat {
			s, ok := f.(string)
			if !ok {
				t.Fatalf("XRANGE %s: field %#v is not a string", key, f)
			}
			fe.fields = append(fe.fields, s)
		}
		out = append(out, fe)
	}
	return out
}

// faultPairs turns alternating names and values into a map.
func faultPairs(flat []string) map[string]string {
	m := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		m[flat[i]] = flat[i+1]
	}
	return m
}

// faultAwaitStarts waits until every job in jobs has started on consumer and
// returns their entry IDs, in the order of jobs.
func faultAwaitStarts(t *testing.T, s *scenario, jobs []string, consumer string) []string {
	t.Helper()
	entryOf := make(map[string]string)
	eventually(t, time.Minute, func() (bool, string) {
		for _, e := range readLedger(t, s.ledger) {
			if e.Event == "start" && e.Consumer == consumer {
				entryOf[e.JobID] = e.EntryID
			}
		}
		for _, id := range jobs {
			if entryOf[id] == "" {
				return false, fmt.Sprintf("job %s not started on %s", id, consumer)
			}
		}
		return true, ""
	})
	out := make([]string, len(jobs))
	for i, id := range jobs {
		out[i] = entryOf[id]
	}
	return out
}

// faultPEL returns the group's pending entries by entry ID.
func faultPEL(t *testing.T, s *scenario) map[string]redis.XPendingExt {
	t.Helper()
	p, err := s.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: s.stream, Group: "g", Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	m := make(map[string]redis.XPendingExt, len(p))
	for _, e := range p {
		m[e.ID] = e
	}
	return m
}

// faultLostReported reports whether log has a "pending job was deleted or
// trimmed" record naming entry id (and, unless when is empty, saying when).
func faultLostReported(log, id, when string) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "pending job was deleted or trimmed") && strings.Contains(line, "entry_id="+id) &&
			(when == "" || strings.Contains(line, when)) {
			return true
		}
	}
	return false
}

// faultLine returns the first line of log that starts with prefix.
func faultLine(log, prefix string) string {
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}
