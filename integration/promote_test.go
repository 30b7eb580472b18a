package integration

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func init() { subprocessModes["promoter"] = promoterMain }

// promoterMain is a promoter subprocess: it registers as ready (INCR
// PW_READY), waits for its go signal (a BLPOP on PW_GO), then calls
// stream.PromoteDue(PW_STREAM, limit 100) in a loop until the delayed set
// has stayed empty for 300 ms or SIGTERM, and prints "PROMOTED <n>", the
// number of jobs it moved.
func promoterMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	name := os.Getenv("PW_STREAM")
	keys, err := stream.KeysFor(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("PW_ADDR")})
	defer rdb.Close()
	if err := rdb.Incr(ctx, os.Getenv("PW_READY")).Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := rdb.BLPop(ctx, 5*time.Minute, os.Getenv("PW_GO")).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "waiting for the go signal:", err)
		return 2
	}
	moved := 0
	var emptySince time.Time
	for ctx.Err() == nil {
		n, err := stream.PromoteDue(ctx, rdb, name, 100)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		moved += n
		if n > 0 {
			emptySince = time.Time{}
			continue
		}
		left, err := rdb.ZCard(ctx, keys.Delayed).Result()
		if err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		switch {
		case left > 0:
			emptySince = time.Time{}
		case emptySince.IsZero():
			emptySince = time.Now()
		case time.Since(emptySince) > 300*time.Millisecond:
			fmt.Printf("PROMOTED %d\n", moved)
			return 0
		}
		time.Sleep(5 * time.Millisecond) // the promoter's polling interval
	}
	fmt.Printf("PROMOTED %d\n", moved)
	return 0
}

// delayedDue returns the due time (Unix ms, the member's score) of every
// member of the delayed set, by its key (the job ID of a scheduled job).
func delayedDue(t *testing.T, rdb *redis.Client, keys stream.Keys) map[string]int64 {
	t.Helper()
	zs, err := rdb.ZRangeWithScores(context.Background(), keys.Delayed, 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE delayed: %v", err)
	}
	due := make(map[string]int64, len(zs))
	for _, z := range zs {
		key, _, err := stream.DecodeDelayed(z.Member.(string))
		if err != nil {
			t.Fatalf("delayed member %q: %v", z.Member, err)
		}
		due[key] = int64(z.Score)
	}
	return due
}

// Five promoter processes over one delayed set, released at once: 5,000
// jobs already due and 1,000 due a moment later (by the Redis clock). Every
// job reaches the stream exactly once, none before its due time, and the
// delayed set ends empty: each move is one script, so concurrent promoters
// neither lose nor duplicate a job.
//
// The early-promotion check means something only if the promoters drained
// every due job while some later job was still waiting, and the
// concurrency check only if at least two promoters moved jobs. Both are
// measured after each run (from the stream's entry IDs, which are Redis
// times, and the promoters' counts); a run on a machine too slow for them
// (the later jobs all due before the promoters were through the first
// 5,000) is repeated with the later jobs' delay widened from what the run
// took, instead of failing.
func TestPromote_fiveProcesses(t *testing.T) {
	t.Parallel()
	redistest.Widen(t, "delay", time.Second, runPromoters)
}

// runPromoters runs five promoter processes over 5,000 due jobs and 1,000
// due after delay, and checks that every job reached the stream exactly
// once and none early. It returns a wider delay if the run could not check
// early promotion or concurrency (see TestPromote_fiveProcesses).
func runPromoters(t *testing.T, delay time.Duration) (wider time.Duration) {
	const (
		nowJobs, laterJobs = 5000, 1000
		promoters          = 5
	)
	s := newScenario(t, nil, "")
	ctx := t.Context()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	all := make([]*stream.Job, nowJobs+laterJobs)
	for i := range all {
		all[i] = &stream.Job{Type: "scheduled", Payload: []byte(strconv.Itoa(i))}
	}
	// enqueue schedules jobs from 16 goroutines, the first nowJobs as due
	// a minute ago, the others after delay.
	enqueue := func(jobs []*stream.Job, later bool) {
		var wg sync.WaitGroup
		errs := make(chan error, len(jobs))
		past := time.Now().Add(-time.Minute)
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < len(jobs); i += 16 {
					var err error
					if later {
						err = p.EnqueueIn(ctx, jobs[i], delay)
					} else {
						err = p.EnqueueAt(ctx, jobs[i], past)
					}
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	enqueue(all[:nowJobs], false)

	ready, goKey := s.stream+":ready", s.stream+":go"
	t.Cleanup(func() { s.rdb.Del(context.Background(), ready, goKey) })
	var procs []*worker
	for range promoters {
		procs = append(procs, startSubprocess(t, "promoter",
			"PW_ADDR="+s.addr, "PW_STREAM="+s.stream, "PW_READY="+ready, "PW_GO="+goKey))
	}
	eventually(t, time.Minute, func() (bool, string) {
		n, _ := s.rdb.Get(ctx, ready).Int()
		return n == promoters, fmt.Sprintf("%d of %d promoters ready", n, promoters)
	})
	// The later jobs last, so that their delay is not spent on starting
	// the promoters.
	laterAt := redisNow(t, s.rdb)
	enqueue(all[nowJobs:], true)
	due := delayedDue(t, s.rdb, s.keys)
	if len(due) != len(all) {
		t.Fatalf("delayed set holds %d jobs, want %d", len(due), len(all))
	}
	if n := s.rdb.XLen(ctx, s.stream).Val(); n != 0 {
		t.Fatalf("stream has %d entries before the promoters started", n)
	}
	goAt := redisNow(t, s.rdb)
	for range promoters {
		if err := s.rdb.RPush(ctx, goKey, "go").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Each promoter exits once the delayed set has stayed empty for 300 ms;
	// the deadline only bounds a hung run.
	eventually(t, delay+2*time.Minute, func() (bool, string) {
		for _, w := range procs {
			select {
			case <-w.done:
			default:
				return false, fmt.Sprintf("promoters still running: delayed set holds %d members, stream %d entries (want 0 and %d)",
					s.rdb.ZCard(ctx, s.keys.Delayed).Val(), s.rdb.XLen(ctx, s.stream).Val(), len(all))
			}
		}
		return true, ""
	})
	var moved []int
	total, active := 0, 0
	for _, w := range procs {
		if err := w.wait(time.Second); err != nil {
			t.Fatalf("promoter exit: %v\n%s", err, w.stderr.String())
		}
		out := strings.TrimSpace(w.stderr.String())
		n, err := strconv.Atoi(strings.TrimPrefix(out, "PROMOTED "))
		if err != nil {
			t.Fatalf("promoter output %q", out)
		}
		moved = append(moved, n)
		total += n
		if n > 0 {
			active++
		}
	}

	if n := s.rdb.ZCard(ctx, s.keys.Delayed).Val(); n != 0 {
		t.Errorf("delayed set holds %d members, want 0", n)
	}
	if total != len(all) {
		t.Errorf("promoters report %d moves, want %d", total, len(all))
	}
	msgs, err := s.rdb.XRange(ctx, s.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	isLater := make(map[string]bool, laterJobs)
	for _, j := range all[nowJobs:] {
		isLater[j.ID] = true
	}
	seen := make(map[string]int, len(msgs))
	early := 0
	var lastNow int64 // entry time (Unix ms, Redis clock) of the last job due at the start
	for _, m := range msgs {
		id, _ := m.Values[stream.FieldJobID].(string)
		seen[id]++
		at, _ := stream.EntryTime(m.ID)
		if !isLater[id] {
			lastNow = max(lastNow, at.UnixMilli())
		}
		if d, ok := due[id]; ok && at.UnixMilli() < d {
			early++
			if early <= 5 {
				t.Errorf("job %s added as %s, before its due time %d", id, m.ID, d)
			}
		}
	}
	if early > 0 {
		t.Errorf("%d jobs added to the stream before their due time", early)
	}
	if len(msgs) != len(all) {
		t.Errorf("stream has %d entries, want %d", len(msgs), len(all))
	}
	dups, missing := 0, 0
	for _, j := range all {
		switch seen[j.ID] {
		case 1:
		case 0:
			missing++
		default:
			dups++
		}
	}
	if dups > 0 || missing > 0 {
		t.Errorf("%d jobs in the stream more than once, %d missing; want each exactly once", dups, missing)
	}
	if d := s.dead(); len(d) != 0 {
		t.Errorf("dead-letter stream has %d entries, want 0", len(d))
	}

	// A promoter that ignored due times would have moved the later jobs
	// still waiting when the last of the due ones was moved.
	waiting := 0
	for id := range isLater {
		if due[id] > lastNow {
			waiting++
		}
	}
	// What the later jobs' delay has to exceed.
	span := time.UnixMilli(lastNow).Sub(laterAt)
	t.Logf("later jobs scheduled in %v, promoters released then (Redis clock); the %d due jobs moved within %v, when %d of the %d later jobs were still waiting; jobs moved per promoter: %v",
		goAt.Sub(laterAt), nowJobs, time.UnixMilli(lastNow).Sub(goAt), waiting, laterJobs, moved)
	if waiting == 0 || active < 2 {
		t.Logf("the run checked nothing: %d later jobs still waiting when the due ones were all moved, %d promoters moved jobs; want > 0 and >= 2",
			waiting, active)
		return 2 * span
	}
	return 0
}

// A delayed-set member that does not parse is dead-lettered with reason
// malformed and removed by the first PromoteDue that finds it due, so no
// promoter loops on it; the valid members beside it are promoted.
func TestPromote_malformedMember(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	ctx := t.Context()
	good := &stream.Job{ID: "good", Type: "scheduled", Payload: []byte("{}")}
	bad := []string{
		"no bar at all",
		"k|3:abc",       // one field: a name without a value
		"k|x:ab",        // not a length
		"k|9:ab",        // longer than the rest
		"k|",            // no fields
		"k|1:a1:b1:c",   // odd number of fields
		"k|1:a1:b1:c1:", // a last length with no bytes after it
	}
	zs := []redis.Z{{Score: 1, Member: stream.EncodeDelayed(good.ID, stream.Encode(good))}}
	for _, m := range bad {
		zs = append(zs, redis.Z{Score: 1, Member: m})
	}
	if err := s.rdb.ZAdd(ctx, s.keys.Delayed, zs...).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := stream.PromoteDue(ctx, s.rdb, s.stream, 100)
	if err != nil || n != len(zs) {
		t.Fatalf("PromoteDue = %d, %v; want %d, nil", n, err, len(zs))
	}
	if n, err := stream.PromoteDue(ctx, s.rdb, s.stream, 100); err != nil || n != 0 {
		t.Errorf("second PromoteDue = %d, %v; want 0, nil: nothing left to move", n, err)
	}
	if left := s.rdb.ZCard(ctx, s.keys.Delayed).Val(); left != 0 {
		t.Errorf("delayed set holds %d members, want 0", left)
	}
	msgs, err := s.rdb.XRange(ctx, s.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].Values[stream.FieldJobID] != good.ID {
		t.Errorf("stream entries %v, want only job %s", msgs, good.ID)
	}
	dead := s.dead()
	got := map[string]bool{}
	for _, d := range dead {
		m, _ := d.Values["delayed_member"].(string)
		got[m] = true
		if d.Values["dead_reason"] != "malformed" || d.Values["dead_stream"] != s.stream {
			t.Errorf("dead letter %v: want dead_reason malformed, dead_stream %s", d.Values, s.stream)
		}
	}
	for _, m := range bad {
		if !got[m] {
			t.Errorf("member %q not dead-lettered", m)
		}
	}
	if len(dead) != len(bad) {
		t.Errorf("dead-letter stream has %d entries, want %d", len(dead), len(bad))
	}
}

// EnqueueIn measures its delay by the Redis clock: the job's due time is
// the Redis time of the call plus the delay, and it reaches the stream no
// earlier than that, by Redis TIME and by its entry ID.
func TestSchedule_enqueueIn(t *testing.T) {
	t.Parallel()
	const delay = time.Second
	s := newScenario(t, nil, "")
	ctx := t.Context()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	job := &stream.Job{Type: "scheduled", Payload: []byte("{}")}
	before := redisNow(t, s.rdb)
	if err := p.EnqueueIn(ctx, job, delay); err != nil {
		t.Fatal(err)
	}
	after := redisNow(t, s.rdb)
	due := delayedDue(t, s.rdb, s.keys)[job.ID]
	lo, hi := before.Add(delay).UnixMilli(), after.Add(delay).UnixMilli()
	if due < lo || due > hi {
		t.Errorf("due time %d, want Redis time of the call + %v, in [%d, %d]", due, delay, lo, hi)
	}
	// Every PromoteDue call that begins at or after the due time (Redis
	// clock) must promote the job: that, not how soon this machine gets
	// round to calling, is what bounds its lateness.
	eventually(t, 30*time.Second, func() (bool, string) {
		began := redisNow(t, s.rdb)
		n, err := stream.PromoteDue(ctx, s.rdb, s.stream, 10)
		if err != nil {
			return false, err.Error()
		}
		if n == 0 && began.UnixMilli() >= due {
			t.Fatalf("PromoteDue called at %d (Redis clock), at or after the due time %d, promoted nothing", began.UnixMilli(), due)
		}
		return s.rdb.XLen(ctx, s.stream).Val() > 0, "job not in the stream"
	})
	msgs := s.rdb.XRange(ctx, s.stream, "-", "+").Val()
	if len(msgs) != 1 || msgs[0].Values[stream.FieldJobID] != job.ID {
		t.Fatalf("stream entries %v, want job %s", msgs, job.ID)
	}
	at, _ := stream.EntryTime(msgs[0].ID)
	if at.UnixMilli() < due {
		t.Errorf("job added as %s, before its due time %d", msgs[0].ID, due)
	}
	// The entry ID is the Redis time of the XADD, in ms.
	if waited := at.UnixMilli() - before.UnixMilli(); waited < delay.Milliseconds() {
		t.Errorf("job added to the stream %d ms after EnqueueIn began (Redis clock), want at least %v", waited, delay)
	}
	t.Logf("EnqueueIn(%v): due %v after the call began, added at +%v (Redis clock)",
		delay, time.UnixMilli(due).Sub(before), at.Sub(before))
}

// A scheduled job whose ID holds the member's separator '|' (or the escape
// character '%') is promoted like any other, with its ID intact, not
// dead-lettered as a member that does not parse.
func TestPromote_jobIDWithSeparator(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	ctx := t.Context()
	p := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	ids := []string{"order|42", "50%|off", "%7C", "plain"}
	for _, id := range ids {
		if err := p.EnqueueAt(ctx, &stream.Job{ID: id, Type: "scheduled", Payload: []byte("{}")}, time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	due := delayedDue(t, s.rdb, s.keys)
	for _, id := range ids {
		if _, ok := due[id]; !ok {
			t.Errorf("delayed set has no member with key %q: %v", id, due)
		}
	}
	if n, err := stream.PromoteDue(ctx, s.rdb, s.stream, 10); err != nil || n != len(ids) {
		t.Fatalf("PromoteDue = %d, %v; want %d, nil", n, err, len(ids))
	}
	got := map[string]int{}
	for _, m := range s.rdb.XRange(ctx, s.stream, "-", "+").Val() {
		id, _ := m.Values[stream.FieldJobID].(string)
		got[id]++
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("job %q is in the stream %d times, want 1 (stream: %v)", id, got[id], got)
		}
	}
	if d := s.dead(); len(d) != 0 {
		t.Errorf("dead-letter stream has %d entries, want 0: %v", len(d), d)
	}
}
