package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// F24 (REDIS-NOTES.md §8): a rate-limited replay of 10,000 dead jobs,
// SIGKILLed halfway and resumed; every job is replayed exactly once and a
// concurrent replay is refused.

func init() { subprocessModes["dlq-replay"] = dlqReplayMain }

// dlqReplayMain replays the whole dead-letter stream of PW_STREAM on the
// Redis at PW_ADDR at PW_RATE jobs/s with lease TTL PW_LEASE_TTL, printing
// progress and the result.
func dlqReplayMain() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("PW_ADDR")})
	defer rdb.Close()
	rate, err := strconv.ParseFloat(os.Getenv("PW_RATE"), 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad PW_RATE:", err)
		return 2
	}
	ttl, err := time.ParseDuration(os.Getenv("PW_LEASE_TTL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad PW_LEASE_TTL:", err)
		return 2
	}
	d, err := dlq.New(rdb, os.Getenv("PW_STREAM"), dlq.Config{LeaseTTL: ttl})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	res, err := d.Replay(context.Background(), dlq.Filter{}, dlq.ReplayOptions{
		Rate:     rate,
		Progress: func(p dlq.ReplayProgress) { fmt.Fprintf(os.Stderr, "PW_DLQ_PROGRESS %+v\n", p) },
	})
	fmt.Fprintf(os.Stderr, "PW_DLQ_RESULT %+v %v\n", res, err)
	if err != nil {
		return 3
	}
	return 0
}

// The pace of each replay is measured from the replayed entries' IDs (Redis
// times): never above the rate (plus the pacer's 100 ms catch-up burst). The
// resumed replay, in this process, also keeps up with the rate unless the
// machine could not: its time is bounded by the schedule plus the time its
// Redis calls took and the stalls measured meanwhile. A run in which the
// killed replayer's lease had already expired when the test looked (a busy
// machine) is repeated with a longer lease.
func TestDLQ_ReplayKillResume(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "lease", time.Second, dlqReplayKillResume)
}

// dlqPace returns how many entries of msgs (in ID order) were added and
// over what span, by their IDs' times.
func dlqPace(msgs []redis.XMessage) (n int, span time.Duration) {
	if len(msgs) == 0 {
		return 0, 0
	}
	first, _ := stream.EntryTime(msgs[0].ID)
	last, _ := stream.EntryTime(msgs[len(msgs)-1].ID)
	return len(msgs), last.Sub(first)
}

func dlqReplayKillResume(t *testing.T, leaseTTL time.Duration) (wider time.Duration) {
	const (
		jobs       = 10_000
		rate       = 1000.0
		pacerBurst = 100 * time.Millisecond // dlq's catch-up after a stall
	)
	s := newScenario(t, nil, "")
	ctx := t.Context()
	d, err := dlq.New(s.rdb, s.stream, dlq.Config{LeaseTTL: leaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	lease, cursor := d.Keys()
	t.Cleanup(func() { s.rdb.Del(context.Background(), lease, cursor) })

	// 10,000 dead jobs, written as consumer/dead.lua writes them.
	deadIDs := make(map[string]string, jobs) // dead-letter entry ID -> job_id
	for i := 0; i < jobs; i += 1000 {
		cmds, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j := i; j < i+1000; j++ {
				p.XAdd(ctx, &redis.XAddArgs{Stream: s.keys.Dead, Values: []any{
					"v", "1", "type", "test", "payload", `{}`, "job_id", fmt.Sprintf("job-%05d", j),
					"idempotency_key", fmt.Sprintf("ik-%05d", j), "attempt", "4", "max_attempts", "5",
					"dead_reason", "exhausted", "dead_error", "told to fail", "dead_at", strconv.FormatInt(time.Now().UnixMilli(), 10),
					"dead_attempts", "5", "dead_consumer", "w1", "dead_entry_id", fmt.Sprintf("1700000000000-%d", j),
					"dead_stream", s.stream,
				}})
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for k, c := range cmds {
			deadIDs[c.(*redis.StringCmd).Val()] = fmt.Sprintf("job-%05d", i+k)
		}
	}
	xlen := func(key string) int {
		n, err := s.rdb.XLen(ctx, key).Result()
		if err != nil {
			t.Fatalf("XLEN %s: %v", key, err)
		}
		return int(n)
	}
	// checkPace checks that msgs, one replay's entries, came no faster than
	// the rate, and returns their rate.
	checkPace := func(name string, msgs []redis.XMessage) float64 {
		n, span := dlqPace(msgs)
		if most := rate*(span+pacerBurst).Seconds() + 2; float64(n) > most {
			t.Errorf("%s replay added %d entries within %v (Redis clock), want at most %.0f at %.0f/s", name, n, span, most, rate)
		}
		return float64(n-1) / max(span.Seconds(), 0.001)
	}

	// The first replayer, in a subprocess, is SIGKILLed at about 5,000.
	w := startSubprocess(t, "dlq-replay", "PW_ADDR="+s.addr, "PW_STREAM="+s.stream,
		"PW_RATE="+strconv.FormatFloat(rate, 'f', -1, 64), "PW_LEASE_TTL="+leaseTTL.String())
	probed := false
	deadline := time.Now().Add(5 * time.Minute)
	for {
		n := xlen(s.stream)
		if n >= 2500 && !probed {
			// A concurrent replay is refused while the first runs.
			if _, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
				t.Fatalf("a replay concurrent with the running one: %v, want ErrReplayActive", err)
			}
			probed = true
		}
		if n >= jobs/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replayer moved %d jobs in 5 minutes", n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	w.kill()
	killedAt := time.Now()
	nKill := xlen(s.stream)
	if got := nKill + xlen(s.keys.Dead); got != jobs {
		t.Fatalf("after the kill: %d in the source + %d dead = %d, want %d", nKill, xlen(s.keys.Dead), got, jobs)
	}
	firstMsgs, err := s.rdb.XRange(ctx, s.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	firstRate := checkPace("first", firstMsgs)
	t.Logf("replayer SIGKILLed after %d jobs, replayed at %.0f jobs/s (Redis clock)", nKill, firstRate)

	// Its lease outlives it by up to LeaseTTL: a new replay is refused until
	// it expires. (Renewed every LeaseTTL/3, it has at least 2/3 of it
	// left at the kill, unless the replayer stalled.)
	pttl, err := s.rdb.PTTL(ctx, lease).Result()
	if err != nil {
		t.Fatal(err)
	}
	if pttl < leaseTTL/3 {
		if since := time.Since(killedAt); pttl <= 0 && since < leaseTTL/3 {
			t.Fatalf("lease TTL %v %v after the kill; want the dead replayer's lease still held", pttl, since)
		}
		t.Logf("the run checked nothing of the lease: %v left %v after the kill", pttl, time.Since(killedAt))
		return 2 * leaseTTL
	}
	if _, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
		t.Fatalf("a replay while the killed replayer's lease lives: %v, want ErrReplayActive", err)
	}
	eventually(t, leaseTTL+time.Minute, func() (bool, string) {
		n, err := s.rdb.Exists(ctx, lease).Result()
		return err == nil && n == 0, fmt.Sprintf("lease %s still held (%v)", lease, err)
	})
	t.Logf("lease expired %v after the kill (LeaseTTL %v)", time.Since(killedAt).Round(time.Millisecond), leaseTTL)

	// Resume in this process, to the end, timing its Redis calls and
	// watching for stalls.
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	var work redistest.CallTimer
	rdb.AddHook(&work)
	stalls := redistest.WatchStalls(s.rdb, 2*redistest.StallInterval)
	defer stalls.Stop()
	d2, err := dlq.New(rdb, s.stream, dlq.Config{LeaseTTL: leaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	res, err := d2.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{Rate: rate})
	stalled := stalls.Within(began, time.Now())
	if errors.Is(err, dlq.ErrLeaseLost) && stalls.Longest() >= leaseTTL/3 {
		// A renewal is due every LeaseTTL/3 and the lease is lost only
		// when none succeeded for LeaseTTL: a stall of this process or
		// of Redis that long is the machine, not the replay.
		t.Logf("the resumed replay lost its lease (%v) with a %v stall (LeaseTTL %v): retrying with a longer lease", err, stalls.Longest().Round(time.Millisecond), leaseTTL)
		return 2 * leaseTTL
	}
	if err != nil {
		t.Fatalf("resumed replay: %v (longest stall %v, %v stalled in all)", err, stalls.Longest().Round(time.Millisecond), stalled.Round(time.Millisecond))
	}
	resumedMsgs, err := s.rdb.XRange(ctx, s.stream, "("+firstMsgs[len(firstMsgs)-1].ID, "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	resumeRate := checkPace("resumed", resumedMsgs)
	t.Logf("resumed replay: %+v: %.0f jobs/s (Redis clock); %v in Redis calls, %v stalled",
		res, resumeRate, work.Total().Round(time.Millisecond), stalled.Round(time.Millisecond))
	if !res.Resumed || res.Replayed != jobs-nKill || res.Missing != 0 || res.Examined != res.Replayed {
		t.Errorf("resumed replay %+v, want the %d jobs left, resumed from the cursor without rescanning", res, jobs-nKill)
	}
	// The pacer waits only while ahead of its schedule, so the replay takes
	// at most the schedule, the work (twice: a catch-up burst that runs out
	// restarts the schedule) and the stalls, with 20% for the rest.
	schedule := time.Duration(float64(res.Replayed) / rate * float64(time.Second))
	if most := schedule*12/10 + 2*work.Total() + 2*stalled; res.Elapsed > most {
		t.Errorf("resumed replay of %d jobs at %.0f/s took %v; want at most %v: the schedule %v + 20%%, twice the %v in Redis calls and the %v stalled",
			res.Replayed, rate, res.Elapsed, most, schedule, work.Total(), stalled)
	}

	// Every job exactly once, attempts reset, dead_* gone, nothing left.
	msgs, err := s.rdb.XRange(ctx, s.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]int, jobs)
	from := make(map[string]bool, jobs)
	for _, m := range msgs {
		j, err := stream.Decode(m.ID, m.Values)
		if err != nil {
			t.Fatalf("replayed entry %s does not decode: %v", m.ID, err)
		}
		seen[j.ID]++
		src, _ := m.Values[dlq.FieldReplayedFrom].(string)
		if deadIDs[src] != j.ID || from[src] {
			t.Errorf("entry %s (job %s): replayed_from %q names job %q", m.ID, j.ID, src, deadIDs[src])
		}
		from[src] = true
		if j.Attempt != 0 || j.IdempotencyKey != "ik-"+strings.TrimPrefix(j.ID, "job-") {
			t.Errorf("job %s: attempt %d, idempotency key %q", j.ID, j.Attempt, j.IdempotencyKey)
		}
		for name := range m.Values {
			if strings.HasPrefix(name, "dead_") {
				t.Errorf("job %s kept field %s", j.ID, name)
			}
		}
	}
	for i := range jobs {
		if id := fmt.Sprintf("job-%05d", i); seen[id] != 1 {
			t.Errorf("job %s replayed %d times", id, seen[id])
		}
	}
	if len(msgs) != jobs || len(seen) != jobs {
		t.Errorf("%d entries, %d distinct jobs in the source; want %d", len(msgs), len(seen), jobs)
	}
	if n := xlen(s.keys.Dead); n != 0 {
		t.Errorf("%d entries left in the dead-letter stream", n)
	}
	if n, _ := s.rdb.Exists(ctx, lease, cursor).Result(); n != 0 {
		t.Errorf("the finished replay left its lease or cursor")
	}
	return 0
}

// clusterDLQ runs every script of package dlq (move, cursor, renew, release)
// on the cluster cc, for a queue of its own in the slot of stream name (so
// on the same master, without touching that queue's keys). TestCluster's
// check requires every embedded script to run on every master: it can call
// clusterDLQ for each of its queues.
func clusterDLQ(t *testing.T, cc *redis.ClusterClient, name string) {
	t.Helper()
	ctx := t.Context()
	source, err := stream.DerivedKey(name, "dlqtest")
	if err != nil {
		t.Fatal(err)
	}
	if keyslot.Of(source) != keyslot.Of(name) {
		t.Fatalf("%q is in slot %d, %q in slot %d", source, keyslot.Of(source), name, keyslot.Of(name))
	}
	d, err := dlq.New(cc, source, dlq.Config{LeaseTTL: 60 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lease, cursor := d.Keys()
	t.Cleanup(func() {
		for _, k := range []string{source, d.Stream(), lease, cursor} {
			cc.Del(context.Background(), k)
		}
	})
	for i := range 10 {
		typ := "keep"
		if i%2 == 0 {
			typ = "replay"
		}
		if err := cc.XAdd(ctx, &redis.XAddArgs{Stream: d.Stream(), Values: []any{
			"type", typ, "job_id", fmt.Sprintf("dlq-%d", i), "dead_reason", "exhausted", "dead_error", "e",
		}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// 5 moves at 100/s take 40 ms: the lease is renewed every 20 ms. A
	// replay that lost its lease while this process or the cluster stalled
	// for a renewal interval or more (a busy machine) resumes with a lease
	// four times as long and the same number of renewals.
	stalls := redistest.WatchStalls(cc, 2*redistest.StallInterval)
	defer stalls.Stop()
	replayed := 0
	for ttl, rate := 60*time.Millisecond, 100.0; ; ttl, rate = 4*ttl, rate/4 {
		d, err := dlq.New(cc, source, dlq.Config{LeaseTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		res, err := d.Replay(ctx, dlq.Filter{Types: []string{"replay"}}, dlq.ReplayOptions{Rate: rate})
		replayed += res.Replayed
		if err == nil {
			break
		}
		if stalled := stalls.Within(began, time.Now()); !errors.Is(err, dlq.ErrLeaseLost) || stalled < ttl/3 || ttl > 5*time.Second {
			t.Fatalf("dlq replay on the cluster with a %v lease: %+v, %v (%v stalled)", ttl, res, err, stalled)
		}
		t.Logf("dlq replay on the cluster lost its %v lease after %d moves, %v stalled: again with a longer one", ttl, res.Replayed, stalls.Within(began, time.Now()))
		eventually(t, time.Minute, func() (bool, string) {
			n, err := cc.Exists(ctx, lease).Result()
			return err == nil && n == 0, "the lost lease is still there"
		})
	}
	if replayed != 5 {
		t.Fatalf("dlq replay on the cluster replayed %d jobs, want 5", replayed)
	}
	if n, err := d.Purge(ctx, dlq.Filter{}, dlq.PurgeOptions{}); err != nil || n != 5 {
		t.Fatalf("dlq purge on the cluster: %d, %v", n, err)
	}
}

// TestDLQ_Cluster runs the dlq scripts on a 3-master cluster, for queues
// with and without a hash tag, on every master (CROSSSLOT would fail them).
func TestDLQ_Cluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client(t)
	for _, name := range []string{"orders", "payments", "{billing}:invoices"} {
		t.Run(name, func(t *testing.T) { clusterDLQ(t, cc, name) })
	}
}
