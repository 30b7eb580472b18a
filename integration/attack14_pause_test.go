package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// a14Secret is in every payload of these tests: it must never reach a log.
const a14Secret = "A14-SECRET-PAYLOAD"

type a14Start struct {
	id         string
	at         time.Time
	attempt    int
	deliveries int
}

// a14Rec records the starts and ends of an in-process consumer's handler.
type a14Rec struct {
	mu     sync.Mutex
	starts []a14Start
	done   map[string]int
	logs   syncBuffer
}

func (r *a14Rec) startsSince(t time.Time) []a14Start {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []a14Start
	for _, s := range r.starts {
		if !s.at.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

func (r *a14Rec) lastStart() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var l time.Time
	for _, s := range r.starts {
		if s.at.After(l) {
			l = s.at
		}
	}
	return l
}

func (r *a14Rec) doneCount(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done[id]
}

type a14Payload struct {
	SleepMS int    `json:"sleep_ms"`
	Secret  string `json:"secret"`
}

// a14Consumer runs an in-process consumer of s on rdb; it is stopped at the
// end of the test. Its handler sleeps as the payload says.
func a14Consumer(t *testing.T, rdb redis.UniversalClient, s, name string, edit func(*consumer.Config)) (*consumer.Consumer, *a14Rec, <-chan error) {
	t.Helper()
	rec := &a14Rec{done: map[string]int{}}
	cfg := consumer.Config{
		Stream: s, Group: "g", Consumer: name,
		VisibilityTimeout: 2 * time.Second, SweepInterval: 100 * time.Millisecond,
		Block: 200 * time.Millisecond, Concurrency: 2, ShutdownTimeout: 2 * time.Second,
		PromoteInterval: 50 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(&rec.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(&cfg)
	}
	c := consumer.New(rdb, cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		var p a14Payload
		_ = job.Decode(&p)
		rec.mu.Lock()
		rec.starts = append(rec.starts, a14Start{id: job.ID, at: time.Now(), attempt: job.Attempt, deliveries: job.Deliveries})
		rec.mu.Unlock()
		if p.SleepMS > 0 {
			select {
			case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		rec.mu.Lock()
		rec.done[job.ID]++
		rec.mu.Unlock()
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-errc:
		case <-time.After(30 * time.Second):
			t.Errorf("consumer %s did not return", name)
		}
		if strings.Contains(rec.logs.String(), a14Secret) {
			t.Errorf("consumer %s logged a payload:\n%s", name, tail(rec.logs.String(), 2000))
		}
	})
	return c, rec, errc
}

// a14Enqueue adds n jobs of type typ that sleep ms and returns their IDs.
func a14Enqueue(t *testing.T, rdb redis.UniversalClient, s, typ string, n, ms int) []string {
	t.Helper()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	jobs := make([]*stream.Job, n)
	ids := make([]string, n)
	for i := range jobs {
		j, err := stream.NewJSONJob(typ, a14Payload{SleepMS: ms, Secret: a14Secret})
		if err != nil {
			t.Fatal(err)
		}
		jobs[i] = j
	}
	for i := 0; i < n; i += 500 {
		if _, err := p.EnqueueBatch(context.Background(), jobs[i:min(i+500, n)]); err != nil {
			t.Fatal(err)
		}
	}
	for i, j := range jobs {
		ids[i] = j.ID
	}
	return ids
}

// a14Feed enqueues a short job every 20 ms until the test ends, so that a
// running consumer starts jobs all the time: the last start after a pause
// measures when the pause took effect.
func a14Feed(t *testing.T, rdb redis.UniversalClient, s string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			j, _ := stream.NewJSONJob("feed", a14Payload{SleepMS: 5, Secret: a14Secret})
			_, _ = p.Enqueue(ctx, j)
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

func a14Keys(t *testing.T, rdb redis.UniversalClient) (string, stream.Keys) {
	t.Helper()
	name := redistest.Name(t)
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rdb.Del(context.Background(), keys.Stream)
		redistest.DeleteKeys(rdb, "{"+name+"}:*")
	})
	return name, keys
}

// waitStarting waits until rec has started a job at or after since.
func waitStarting(t *testing.T, rec *a14Rec, since time.Time, within time.Duration, what string) time.Time {
	t.Helper()
	var first time.Time
	eventually(t, within, func() (bool, string) {
		s := rec.startsSince(since)
		if len(s) == 0 {
			return false, "no job started " + what
		}
		first = s[0].at
		return true, ""
	})
	return first
}

// quietFor watches d and returns the last start seen from since on.
func quietFor(rec *a14Rec, since time.Time, d time.Duration) time.Time {
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	last := since
	for _, s := range rec.startsSince(since) {
		if s.at.After(last) {
			last = s.at
		}
	}
	return last
}

// The safety net: a pause written into the hash without any PUBLISH (as
// redis-cli HSET would, or as a consumer that missed the message sees it)
// takes effect within the documented 5 s re-read (plus a second and the
// stalls), and so does its removal.
func TestAttack14Pause_safetyNetWithoutPublish(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, keys := a14Keys(t, rdb)
	watch, _ := watchStalls(rdb)
	defer watch.Stop()
	_, rec, _ := a14Consumer(t, rdb, s, "a", nil)
	a14Feed(t, rdb, s)
	waitStarting(t, rec, time.Time{}, 30*time.Second, "before the pause")
	// The field as Pause writes it (checked first on a scratch queue).
	if err := control.Pause(t.Context(), rdb, s+"-probe", control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	pk, _ := stream.KeysFor(s + "-probe")
	fields := rdb.HGetAll(t.Context(), pk.Paused).Val()
	rdb.Del(t.Context(), pk.Paused)
	if len(fields) != 1 {
		t.Fatalf("the probe's pause hash = %v, want one field", fields)
	}
	for f, v := range fields {
		rdb.HSet(t.Context(), keys.Paused, f, v)
	}
	written := time.Now()
	const net = 5 * time.Second
	last := quietFor(rec, written, net+3*time.Second)
	lag := last.Sub(written)
	t.Logf("pause written without PUBLISH: last start %v after", lag.Round(time.Millisecond))
	if bound := net + 1500*time.Millisecond + watch.Longest(); lag > bound {
		t.Errorf("a job started %v after the pause was written, want within the 5 s safety net (%v)", lag, bound)
	}
	rdb.Del(t.Context(), keys.Paused)
	removed := time.Now()
	first := waitStarting(t, rec, removed, 30*time.Second, "after the pause was removed without PUBLISH")
	if lag := first.Sub(removed); lag > net+1500*time.Millisecond+watch.Longest() {
		t.Errorf("jobs started again %v after the pause's removal, want within the 5 s safety net", lag)
	}
}

// A consumer cut off from Redis (faultproxy: every connection reset, the
// Pub/Sub one included) while the pause is made misses the message; once
// the network is back it must stop within the safety net's period, and
// resume once resumed.
func TestAttack14Pause_missedMessage(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, _ := a14Keys(t, rdb)
	px, err := faultproxy.Start(redistest.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	crdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1})
	t.Cleanup(func() { crdb.Close() })
	watch, _ := watchStalls(rdb)
	defer watch.Stop()
	_, rec, errc := a14Consumer(t, crdb, s, "a", nil)
	a14Feed(t, rdb, s)
	waitStarting(t, rec, time.Time{}, 30*time.Second, "before the cut")
	px.Refuse()
	if err := control.Pause(t.Context(), rdb, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the outage (a fault's length, not a wait for something)
	px.Pass()
	healed := time.Now()
	last := quietFor(rec, healed, 8*time.Second)
	lag := last.Sub(healed)
	t.Logf("after the network healed: last start %v after", lag.Round(time.Millisecond))
	if bound := 5*time.Second + 1500*time.Millisecond + watch.Longest(); lag > bound {
		t.Errorf("a job started %v after the network healed while paused, want within the safety net (%v)", lag, bound)
	}
	select {
	case err := <-errc:
		t.Fatalf("Run returned during the outage: %v", err)
	default:
	}
	resumed := time.Now()
	if err := control.Resume(t.Context(), rdb, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if first := waitStarting(t, rec, resumed, 30*time.Second, "after Resume"); first.Sub(resumed) > 1500*time.Millisecond+watch.Longest() {
		t.Errorf("jobs started %v after Resume, want about a second", first.Sub(resumed))
	}
}

// Hostile contents of the pause key, each announced on the control channel
// (so that every consumer re-reads it at once): a key of another type,
// garbage and out-of-range values, a huge hash. The consumer must not
// crash, and a real Pause and Resume afterwards must still work within
// about a second (not wedged).
func TestAttack14Pause_hostileKeyConsumer(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, keys := a14Keys(t, rdb)
	watch, _ := watchStalls(rdb)
	defer watch.Stop()
	c, rec, errc := a14Consumer(t, rdb, s, "a", nil)
	a14Feed(t, rdb, s)
	waitStarting(t, rec, time.Time{}, 30*time.Second, "at first")
	ctx := t.Context()
	publish := func() { rdb.Publish(ctx, keys.Control, "x") }
	steps := []struct {
		name  string
		write func()
	}{
		{"string key", func() { rdb.Set(ctx, keys.Paused, "garbage", 0) }},
		{"list key", func() { rdb.RPush(ctx, keys.Paused, "queue", "0") }},
		{"garbage queue value", func() { rdb.HSet(ctx, keys.Paused, "queue", "garbage") }},
		{"negative queue value", func() { rdb.HSet(ctx, keys.Paused, "queue", "-5") }},
		{"overflowing value", func() { rdb.HSet(ctx, keys.Paused, "queue", "999999999999999999999999999", "type:x", "1e308") }},
		{"huge hash", func() {
			pipe := rdb.Pipeline()
			for i := range 50000 {
				pipe.HSet(ctx, keys.Paused, fmt.Sprintf("type:junk%d", i), strings.Repeat("9", 30))
			}
			_, _ = pipe.Exec(ctx)
		}},
	}
	for _, st := range steps {
		st.write()
		publish()
		time.Sleep(300 * time.Millisecond) // let it re-read the hostile value (a window; nothing to poll)
		select {
		case err := <-errc:
			t.Fatalf("Run returned after %s: %v", st.name, err)
		default:
		}
		rdb.Del(ctx, keys.Paused)
		publish()
		since := time.Now()
		waitStarting(t, rec, since, 15*time.Second, "after "+st.name+" was deleted")
	}
	// The hostile values paused nothing, so the starts above do not show
	// that the consumer has finished reading them: a read of the huge hash
	// (HGETALL of 50,000 fields, parsed) takes seconds on a busy machine
	// without any stall, and a message that comes meanwhile is read after
	// it. A pause of a type no job has, seen in Health, says the reads
	// before it are done (they are sequential); the wait for it is itself
	// the check that the consumer is not wedged.
	caughtUp := time.Now()
	a14Sentinel(t, c, rdb, s)
	t.Logf("the consumer had read the hostile values %v after jobs started again", time.Since(caughtUp).Round(time.Millisecond))
	// Still obeys a real pause within about a second.
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	last := quietFor(rec, paused, 3*time.Second)
	if lag := last.Sub(paused); lag > 1500*time.Millisecond+watch.Longest() {
		t.Errorf("after the hostile values, a job started %v after Pause, want about a second", lag)
	}
	if err := control.Resume(ctx, rdb, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStarting(t, rec, time.Now(), 15*time.Second, "after the final Resume")
	if !c.Health().Live {
		t.Error("consumer not live")
	}
}

// a14Sentinel pauses and resumes a type that no job has, waiting each
// time until c's Health shows it: once it does, c has finished every read
// of the pauses that was under way or due before.
func a14Sentinel(t *testing.T, c *consumer.Consumer, rdb redis.UniversalClient, s string) {
	t.Helper()
	const typ = "a14-sentinel"
	follows := func() bool { return slices.Contains(c.Health().PausedTypes, typ) }
	if err := control.Pause(t.Context(), rdb, s, control.PauseOptions{Type: typ}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, poll.True("the consumer does not follow a type's pause (wedged)", follows))
	if err := control.Resume(t.Context(), rdb, s, control.ResumeOptions{Type: typ}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, poll.True("the consumer does not follow a type's resume (wedged)", func() bool { return !follows() }))
}

// While the queue is paused: a consumer started paused is ready without
// starting anything; due delayed jobs are promoted into the stream but not
// started; a dead consumer's pending jobs are swept (taken over) but not
// started, and their delivery count does not keep growing; after Resume
// every job runs once with no attempt counted and nothing dead-lettered.
func TestAttack14Pause_promoteAndSweepWhilePaused(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, keys := a14Keys(t, rdb)
	ctx := t.Context()
	watch := redistest.WatchStalls(rdb, 2*redistest.StallInterval)
	defer watch.Stop()
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	// A dead consumer's jobs: read by "ghost", never acknowledged.
	ghost := a14Enqueue(t, rdb, s, "ghosted", 2, 0)
	if err := rdb.XGroupCreateMkStream(ctx, s, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "ghost", Streams: []string{s, ">"}, Count: 10}).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := a14Enqueue(t, rdb, s, "fresh", 3, 0)
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	var delayed []string
	for range 2 {
		j, _ := stream.NewJSONJob("delayed", a14Payload{Secret: a14Secret})
		j.ID = fmt.Sprintf("%s-delayed-%d", s, len(delayed))
		if err := p.EnqueueIn(ctx, j, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		delayed = append(delayed, j.ID)
	}
	c, rec, _ := a14Consumer(t, rdb, s, "b", func(c *consumer.Config) { c.VisibilityTimeout = time.Second })
	select {
	case <-c.Reading():
	case <-time.After(30 * time.Second):
		t.Fatal("a consumer started while paused never became ready (Reading)")
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		n := rdb.ZCard(ctx, keys.Delayed).Val()
		return n == 0, fmt.Sprintf("%d delayed jobs not promoted while paused", n)
	})
	eventually(t, 30*time.Second, func() (bool, string) {
		for _, e := range rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: "g", Start: "-", End: "+", Count: 100}).Val() {
			if e.Consumer == "ghost" {
				return false, "the dead consumer's job " + e.ID + " was not swept while paused"
			}
		}
		return true, ""
	})
	// Held past several visibility timeouts.
	time.Sleep(3 * time.Second)
	if st := rec.startsSince(time.Time{}); len(st) > 0 {
		t.Errorf("%d jobs started while the queue was paused (first %s)", len(st), st[0].id)
	}
	for _, e := range rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: "g", Start: "-", End: "+", Count: 100}).Val() {
		if e.RetryCount > 2 {
			t.Errorf("held entry %s delivered %d times while paused (ghost's read and one takeover at most)", e.ID, e.RetryCount)
		}
		// Renewed every third of the 1 s visibility timeout; a stall of this
		// process or Redis delays a renewal by as much.
		if e.Idle > time.Second+watch.Longest() {
			t.Errorf("held entry %s idle %v, beyond the visibility timeout (stalled %v at most): its lease is not extended",
				e.ID, e.Idle, watch.Longest())
		}
	}
	if err := control.Resume(ctx, rdb, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	all := append(append(ghost, fresh...), delayed...)
	eventually(t, 30*time.Second, func() (bool, string) {
		for _, id := range all {
			if rec.doneCount(id) == 0 {
				return false, "job " + id + " never ran after Resume"
			}
		}
		return true, ""
	})
	for _, id := range all {
		if n := rec.doneCount(id); n != 1 {
			t.Errorf("job %s ran %d times", id, n)
		}
	}
	for _, st := range rec.startsSince(time.Time{}) {
		if st.attempt != 0 {
			t.Errorf("job %s started with attempt %d after a pause, want 0", st.id, st.attempt)
		}
	}
	if n := rdb.XLen(ctx, keys.Dead).Val(); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// A Redis restart while paused: with persistence (AOF) the pause is kept,
// and a consumer that reconnects stays paused (nothing starts), then
// resumes on Resume.
func TestAttack14Pause_redisRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{AOF: "always"})
	rdb := srv.Client(t)
	s := redistest.Name(t)
	c, rec, errc := a14Consumer(t, redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1}), s, "a", nil)
	a14Enqueue(t, rdb, s, "x", 1, 0)
	waitStarting(t, rec, time.Time{}, 30*time.Second, "before the pause")
	if err := control.Pause(t.Context(), rdb, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, poll.True("the pause to reach the consumer", func() bool { return c.Health().Paused }))
	srv.Shutdown()
	srv.Restart()
	eventually(t, 30*time.Second, func() (bool, string) {
		err := rdb.Ping(t.Context()).Err()
		return err == nil, fmt.Sprint(err)
	})
	st, err := control.State(t.Context(), rdb, s)
	if err != nil || !st.Queue {
		t.Fatalf("State after a restart with AOF = %+v, %v; want the queue paused", st, err)
	}
	after := time.Now()
	ids := a14Enqueue(t, rdb, s, "x", 20, 0)
	if last := quietFor(rec, after, 7*time.Second); last.After(after) {
		t.Errorf("a job started after the Redis restart while the queue was paused (at +%v)", last.Sub(after))
	}
	select {
	case err := <-errc:
		t.Fatalf("Run returned: %v", err)
	default:
	}
	if err := control.Resume(t.Context(), rdb, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		for _, id := range ids {
			if rec.doneCount(id) != 1 {
				return false, "job " + id + " did not run once after Resume"
			}
		}
		return true, ""
	})
}

// The metric: pelican_paused{stream,type=""} is 1 while the queue is paused
// and 0 otherwise; a type's series is 1 while it is paused and gone after.
func TestAttack14Pause_metric(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, _ := a14Keys(t, rdb)
	a14Enqueue(t, rdb, s, "x", 1, 0)
	rdb.XGroupCreate(t.Context(), s, "g", "0")
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(rdb, metrics.CollectorConfig{CacheFor: time.Millisecond, Queues: []metrics.Queue{{Stream: s, Groups: []string{"g"}}}}))
	read := func() map[string]float64 {
		out := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "pelican_paused" {
				continue
			}
			for _, m := range mf.GetMetric() {
				var st, ty string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "stream":
						st = l.GetValue()
					case "type":
						ty = l.GetValue()
					}
				}
				if st == s {
					out[ty] = m.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	check := func(what string, want map[string]float64) {
		t.Helper()
		var got map[string]float64
		eventually(t, 10*time.Second, func() (bool, string) {
			got = read()
			if len(got) != len(want) {
				return false, fmt.Sprintf("%s: pelican_paused = %v, want %v", what, got, want)
			}
			for k, v := range want {
				if got[k] != v {
					return false, fmt.Sprintf("%s: pelican_paused = %v, want %v", what, got, want)
				}
			}
			return true, ""
		})
	}
	check("running", map[string]float64{"": 0})
	until := time.Now().Add(time.Hour)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(control.Pause(t.Context(), rdb, s, control.PauseOptions{Type: "invoice.send", Until: until}))
	check("type paused", map[string]float64{"": 0, "invoice.send": 1})
	must(control.Pause(t.Context(), rdb, s, control.PauseOptions{}))
	check("queue and type paused", map[string]float64{"": 1, "invoice.send": 1})
	must(control.Resume(t.Context(), rdb, s, control.ResumeOptions{All: true}))
	check("resumed", map[string]float64{"": 0})
	// A timed pause's series ends by itself.
	now, _ := rdb.Time(t.Context()).Result()
	must(control.Pause(t.Context(), rdb, s, control.PauseOptions{Until: now.Add(500 * time.Millisecond)}))
	check("timed pause ended", map[string]float64{"": 0})
}

// a14CLI runs the pelican command and returns its exit code and output.
func a14CLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(pelicanCLI(t), append([]string{"--redis", "redis://" + redistest.Addr() + "/0"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

// The CLI: pause and resume print what they did, resume of nothing exits
// 4, flags that exclude each other exit 2, stats lists the pauses.
func TestAttack14Pause_cli(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, _ := a14Keys(t, rdb)
	a14Enqueue(t, rdb, s, "x", 1, 0)
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"resume", s}, 4, "not paused"},
		{[]string{"pause", s, "--type", "t1", "--for", "1h"}, 0, "t1"},
		{[]string{"pause", s, "--for", "-1m"}, 2, "--for"},
		{[]string{"pause", s, "--for", "1m", "--until", "2099-01-01T00:00:00Z"}, 2, "--until"},
		{[]string{"pause", s, "--until", "yesterday"}, 2, "--until"},
		{[]string{"pause", s, "--until", "2001-01-01T00:00:00Z"}, 2, "Until"},
		{[]string{"pause", s, "--type", "a\nb"}, 2, "Type"},
		{[]string{"resume", s, "--all", "--type", "x"}, 2, "Type"},
		{[]string{"pause", s}, 0, s},
		{[]string{"stats", s, "-o", "json"}, 0, `"t1"`},
		{[]string{"resume", s, "--type", "nope"}, 4, "not paused"},
		{[]string{"resume", s}, 0, s},
		{[]string{"resume", s, "--all"}, 0, s},
		{[]string{"resume", s, "--all"}, 4, "not paused"},
	} {
		code, out := a14CLI(t, c.args...)
		if code != c.code || !strings.Contains(out, c.out) {
			t.Errorf("pelican %q: exit %d, output %q; want exit %d and output naming %q", c.args, code, out, c.code, c.out)
		}
	}
}

// Bad arguments exit 2 ("usage: bad flag, argument"), and a --for that is
// not positive is refused like a negative one.
func TestAttack14Pause_cliBadArguments(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, _ := a14Keys(t, rdb)
	for _, args := range [][]string{
		{"pause", ""},
		{"pause", "a{b"},
		{"resume", ""},
		{"pause", s, "--for", "0s"},
		{"pause", s, "--for", "1ms"},
	} {
		code, out := a14CLI(t, args...)
		if code != 2 {
			t.Errorf("pelican %q: exit %d (%q), want 2 (a bad argument)", args, code, strings.TrimSpace(out))
		}
	}
	if st, _ := control.State(t.Context(), rdb, s); st.Any() {
		t.Errorf("a refused pause left %+v", st)
	}
}

// A consumer whose Redis user may not SUBSCRIBE to the control channel
// (docs/acl.md's consumer line without "+subscribe &{q}:control") runs,
// says so in its logs, and still stops within the 5 s re-read after a
// Pause, and starts again within it after Resume.
func TestAttack14Pause_noSubscribePermission(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	s := "a14acl"
	line := "ACL SETUSER c reset on >pw ~" + s + " ~{" + s + "}:* +xgroup|create +xgroup|delconsumer +xinfo|groups +xinfo|consumers +xreadgroup +xpending +xack +xautoclaim +xclaim +xrange +xadd +xdel +xtrim +xlen +zadd +zrangebyscore +zrem +get +set +del +time +evalsha +eval +incr +pexpire +pttl +hmget +hset +type +zremrangebyscore +zscore +zcard +zrange +hgetall +client|id +client|unblock +config|get +info"
	args := []any{}
	for _, w := range strings.Fields(line) {
		args = append(args, w)
	}
	if err := admin.Do(t.Context(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	crdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "c", Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { crdb.Close() })
	watch, _ := watchStalls(admin)
	defer watch.Stop()
	_, rec, errc := a14Consumer(t, crdb, s, "a", nil)
	a14Feed(t, admin, s)
	waitStarting(t, rec, time.Time{}, 30*time.Second, "at first")
	if err := control.Pause(t.Context(), admin, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	const net = 5 * time.Second
	last := quietFor(rec, paused, net+3*time.Second)
	t.Logf("without SUBSCRIBE: last start %v after Pause", last.Sub(paused).Round(time.Millisecond))
	if lag := last.Sub(paused); lag > net+1500*time.Millisecond+watch.Longest() {
		t.Errorf("a job started %v after Pause on a consumer that may not subscribe, want within the 5 s re-read", lag)
	}
	select {
	case err := <-errc:
		t.Fatalf("Run returned: %v", err)
	default:
	}
	resumed := time.Now()
	if err := control.Resume(t.Context(), admin, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if first := waitStarting(t, rec, resumed, 30*time.Second, "after Resume"); first.Sub(resumed) > net+1500*time.Millisecond+watch.Longest() {
		t.Errorf("jobs started %v after Resume, want within the 5 s re-read", first.Sub(resumed))
	}
	if logs := rec.logs.String(); !strings.Contains(strings.ToLower(logs), "subscri") {
		t.Errorf("the consumer did not log that it may not subscribe:\n%s", tail(logs, 2000))
	}
}

// Three consumer processes busy with a stream of short jobs (starts happen
// all the time, so the last start measures the pause's reach): after Pause
// has returned, no process starts a job later than about a second; nothing
// starts while paused past the visibility timeout; held jobs are not
// redelivered; after Resume every job runs once with no attempt counted.
func TestAttack14Pause_threeProcesses(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	watch, report := watchStalls(s.rdb)
	defer report()
	ids := s.enqueue(3000, behaviour{SleepMS: 20})
	o := pauseWorkers
	o.Concurrency = 3
	for _, n := range []string{"a", "b", "c"} {
		s.worker(n, o)
	}
	eventually(t, time.Minute, func() (bool, string) {
		seen := map[string]bool{}
		for _, e := range readLedger(t, s.ledger) {
			seen[e.Consumer] = true
		}
		return len(seen) == 3, fmt.Sprintf("%d of 3 workers started a job", len(seen))
	})
	if err := control.Pause(t.Context(), s.rdb, s.stream, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	for deadline := returned.Add(quietWindow); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	var last time.Time
	per := map[string]time.Time{}
	for _, e := range readLedger(t, s.ledger) {
		if e.Event == "start" && e.At.After(per[e.Consumer]) {
			per[e.Consumer] = e.At
			if e.At.After(last) {
				last = e.At
			}
		}
	}
	for n, at := range per {
		t.Logf("worker %s: last start %v after Pause returned", n, at.Sub(returned).Round(time.Millisecond))
	}
	if bound := 1500*time.Millisecond + watch.Longest(); last.Sub(returned) > bound {
		t.Errorf("a job started %v after Pause returned, want within about a second (%v)", last.Sub(returned), bound)
	}
	if n := len(countEvents(readLedger(t, s.ledger), "start")); n >= len(ids) {
		t.Skipf("all %d jobs started before the pause took effect: the scenario's precondition broke", n)
	}
	checkHeld(t, s)
	if err := control.Resume(t.Context(), s.rdb, s.stream, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	checkDoneOnce(t, s, ids)
}

// Pausing what is paused replaces its end, and every consumer follows the
// new end: a pause until an hour from now cut short to a second ends then
// (no message at the end), and a short timed pause extended to an hour does
// not end at its old end. The same for a type's pause, while another type
// runs.
func TestAttack14Pause_replaceEnd(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, _ := a14Keys(t, rdb)
	watch, _ := watchStalls(rdb)
	defer watch.Stop()
	c, rec, _ := a14Consumer(t, rdb, s, "a", nil)
	a14Feed(t, rdb, s)
	waitStarting(t, rec, time.Time{}, 30*time.Second, "at first")
	ctx := t.Context()
	redisNow := func() time.Time {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	// Shortened.
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{Until: redisNow().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the pause reaches the consumer
	end := redisNow().Add(2 * time.Second)
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{Until: end}); err != nil {
		t.Fatal(err)
	}
	first := waitStarting(t, rec, time.Now(), 30*time.Second, "after the shortened pause's end")
	if late := first.Sub(end); late > 1500*time.Millisecond+watch.Longest() || late < -200*time.Millisecond {
		t.Errorf("jobs started %v after the shortened pause's end, want at its end, within about a second", late)
	}
	// Extended.
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{Until: redisNow().Add(2500 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	extended := time.Now()
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{Until: redisNow().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if last := quietFor(rec, extended, 4*time.Second); last.Sub(extended) > 1500*time.Millisecond+watch.Longest() {
		t.Errorf("a job started %v after the pause was extended to an hour (its old end was 1 s later)", last.Sub(extended))
	}
	if err := control.Resume(ctx, rdb, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	// A type's timed pause ends by itself while another type runs.
	tend := redisNow().Add(2 * time.Second)
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{Type: "slow", Until: tend}); err != nil {
		t.Fatal(err)
	}
	// The jobs are enqueued once the consumer follows the pause (or it has
	// ended: they may start at once then).
	eventually(t, 30*time.Second, poll.True("the type's pause to reach the consumer", func() bool {
		return slices.Contains(c.Health().PausedTypes, "slow") || !redisNow().Before(tend)
	}))
	slow := a14Enqueue(t, rdb, s, "slow", 3, 0)
	eventually(t, 30*time.Second, func() (bool, string) {
		for _, id := range slow {
			if rec.doneCount(id) != 1 {
				return false, "job " + id + " of the type whose timed pause ended did not run once"
			}
		}
		return true, ""
	})
	for _, st := range rec.startsSince(time.Time{}) {
		for _, id := range slow {
			if st.id == id && st.at.Before(tend.Truncate(time.Millisecond).Add(-time.Millisecond)) { // the end is stored in whole ms
				t.Errorf("job %s of a paused type started %v before its pause's end", id, tend.Sub(st.at))
			}
		}
	}
}

// A suspect (a job that crashed its worker once) while the queue is
// paused: a worker restarted under the same name re-reads it and holds it,
// SIGKILLed while holding it and restarted again, twice: the hold never
// counts a run (its crash counter does not grow, it is not dead-lettered
// with reason crashed however often the holder dies), and it does not start.
func TestAttack14Pause_suspectHeldAcrossKills(t *testing.T) {
	t.Parallel()
	s := newScenario(t, nil, "")
	ids := s.enqueue(1, behaviour{Crash: "before"})
	o := pauseWorkers
	o.Concurrency, o.MaxCrashes = 1, 2
	w := s.worker("a", o)
	eventually(t, time.Minute, func() (bool, string) { return w.killed(), "the worker did not crash on its job" })
	if err := control.Pause(t.Context(), s.rdb, s.stream, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	crashKeys := func() map[string]string {
		out := map[string]string{}
		keys, _ := s.rdb.Keys(t.Context(), s.keys.Crashes+"*").Result()
		for _, k := range keys {
			out[k] = s.rdb.Get(t.Context(), k).Val()
		}
		return out
	}
	before := crashKeys()
	t.Logf("crash counters after the first crash: %v", before)
	for round := 1; round <= 3; round++ {
		w := s.worker("a", o)
		// Held past the visibility timeout.
		for end := time.Now().Add(o.Visibility + time.Second); time.Now().Before(end); {
			time.Sleep(100 * time.Millisecond)
		}
		if w.killed() {
			t.Fatalf("round %d: the worker crashed while the queue was paused: it ran the job", round)
		}
		w.kill()
		if n := countEvents(readLedger(t, s.ledger), "start")[ids[0]]; n != 1 {
			t.Errorf("round %d: the job started %d times, want 1 (the run before the pause)", round, n)
		}
		if d := s.dead(); len(d) > 0 {
			t.Fatalf("round %d: the suspect was dead-lettered while the queue was paused: %v", round, d[0].Values)
		}
		if now := crashKeys(); fmt.Sprint(now) != fmt.Sprint(before) {
			t.Errorf("round %d: crash counters %v, want %v as before the pause (a hold counted a run)", round, now, before)
		}
	}
	if n := s.pending("g"); n != 1 {
		t.Errorf("pending = %d, want the held job", n)
	}
}

// WaitIdle does not return while the queue is paused, also when the
// consumer was idle (empty stream) when the pause came, and when the pause
// is only a type's with jobs of that type parked; it returns once resumed
// and the held jobs ran.
func TestAttack14Pause_waitIdle(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, _ := a14Keys(t, rdb)
	c, rec, _ := a14Consumer(t, rdb, s, "a", nil)
	<-c.Reading()
	if err := c.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := control.Pause(t.Context(), rdb, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, poll.True("the pause to reach the consumer", func() bool { return c.Health().Paused }))
	ids := a14Enqueue(t, rdb, s, "x", 3, 0)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	err := c.WaitIdle(ctx)
	cancel()
	if err == nil {
		t.Errorf("WaitIdle returned nil while the queue was paused with %d jobs enqueued", len(ids))
	}
	// A type's pause with parked jobs of it: they were enqueued before the
	// call and have not run, so WaitIdle must not say they did.
	if err := control.Pause(t.Context(), rdb, s, control.PauseOptions{Type: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := control.Resume(t.Context(), rdb, s, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, poll.True("the type's pause alone to reach the consumer", func() bool {
		h := c.Health()
		return !h.Paused && slices.Equal(h.PausedTypes, []string{"x"})
	}))
	ctx, cancel = context.WithTimeout(t.Context(), 3*time.Second)
	err = c.WaitIdle(ctx)
	cancel()
	if err == nil {
		for _, id := range ids {
			if rec.doneCount(id) == 0 {
				t.Errorf("WaitIdle returned nil while job %s (enqueued before the call) was parked by its type's pause", id)
			}
		}
	}
	if err := control.Resume(t.Context(), rdb, s, control.ResumeOptions{All: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.WaitIdle(ctx); err != nil {
		t.Fatalf("WaitIdle after Resume: %v", err)
	}
	for _, id := range ids {
		if n := rec.doneCount(id); n != 1 {
			t.Errorf("job %s ran %d times by the time WaitIdle returned, want 1", id, n)
		}
	}
}

// For hostile values of the queue's field, what the consumers do agrees
// with what State (and so pelican stats and the metric) says: an operator
// never sees "running" while every consumer is held, or the reverse.
func TestAttack14Pause_hostileValueAgreesWithState(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, keys := a14Keys(t, rdb)
	watch, _ := watchStalls(rdb)
	defer watch.Stop()
	_, rec, _ := a14Consumer(t, rdb, s, "a", nil)
	a14Feed(t, rdb, s)
	waitStarting(t, rec, time.Time{}, 30*time.Second, "at first")
	ctx := t.Context()
	for _, v := range []string{"garbage", "-5", "99999999999999999999999999", "", "1e3"} {
		rdb.HSet(ctx, keys.Paused, "queue", v)
		rdb.Publish(ctx, keys.Control, "x")
		st, err := control.State(ctx, rdb, s)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // the value reaches the consumer
		since := time.Now()
		last := quietFor(rec, since, 1500*time.Millisecond)
		running := last.After(since)
		if watch.Longest() > time.Second {
			t.Logf("value %q: stalled %v, skipping the comparison", v, watch.Longest())
		} else if running == st.Queue {
			t.Errorf("queue field %q: State.Queue = %v but the consumer is running = %v", v, st.Queue, running)
		} else {
			t.Logf("queue field %q: State.Queue = %v, consumer running = %v", v, st.Queue, running)
		}
		rdb.Del(ctx, keys.Paused)
		rdb.Publish(ctx, keys.Control, "x")
		waitStarting(t, rec, time.Now(), 15*time.Second, "after the value was deleted")
	}
}

// A pause key of another type (one hostile redis-cli SET) in one queue
// does not blind the collector: the other queue's series, and this queue's
// stream length, are still exported.
func TestAttack14Pause_metricWrongTypeKey(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	bad, badKeys := a14Keys(t, rdb)
	good := bad + "-good"
	t.Cleanup(func() { rdb.Del(context.Background(), good) })
	for _, s := range []string{bad, good} {
		a14Enqueue(t, rdb, s, "x", 1, 0)
		rdb.XGroupCreate(t.Context(), s, "g", "0")
	}
	rdb.Set(t.Context(), badKeys.Paused, "garbage", 0)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(rdb, metrics.CollectorConfig{CacheFor: time.Millisecond,
		Queues: []metrics.Queue{{Stream: bad, Groups: []string{"g"}}, {Stream: good, Groups: []string{"g"}}}}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	lengths := map[string]bool{}
	up := -1.0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "pelican_stream_length":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "stream" {
						lengths[l.GetValue()] = true
					}
				}
			}
		case "pelican_collector_up":
			up = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Logf("pelican_collector_up = %v, stream lengths exported for %v", up, lengths)
	if !lengths[good] {
		t.Errorf("a wrong-type pause key of queue %s removed the series of another queue, %s (collector_up %v)", bad, good, up)
	}
	if !lengths[bad] {
		t.Errorf("a wrong-type pause key removed the queue's own pelican_stream_length (collector_up %v)", up)
	}
}
