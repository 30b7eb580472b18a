package control_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// On a real Redis: a scheduled job, a retrying one and a waiting one are
// cancelled (gone from the delayed set or the stream, Lookup says
// cancelled); a running one is cancelling (Lookup says where), its
// handler's context is cancelled with ErrCancelled and it ends cancelled,
// not retried; a finished one and an unknown one are refused with their
// errors and nothing changes; cancelling twice is refused.
func TestCancel_states(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tracked []string
	t.Cleanup(func() {
		for _, id := range tracked {
			rdb.Del(context.Background(), stream.JobKey(keys, id))
		}
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead)
	})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	newJob := func(typ string) *stream.Job {
		j := &stream.Job{Type: typ, Payload: []byte(`{}`)}
		tracked = append(tracked, "") // set below
		return j
	}
	state := func(id string) string {
		t.Helper()
		info, err := control.Lookup(ctx, rdb, name, id)
		if err != nil {
			t.Fatal(err)
		}
		return info.State
	}
	// Two scheduled jobs at the same time: only the one named goes.
	due := time.Now().Add(time.Hour)
	sched, other := newJob("work"), newJob("work")
	for i, j := range []*stream.Job{other, sched} { // sched sorts after other
		if err := p.EnqueueAt(ctx, j, due); err != nil {
			t.Fatal(err)
		}
		tracked[i] = j.ID
	}
	if was, err := control.Cancel(ctx, rdb, name, sched.ID); err != nil || was != stream.StateScheduled {
		t.Fatalf("Cancel(scheduled) = %q, %v", was, err)
	}
	if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != 1 || state(sched.ID) != stream.StateCancelled || state(other.ID) != stream.StateScheduled {
		t.Fatalf("after cancel: delayed set holds %d, states %s %s; want 1, cancelled, scheduled", n, state(sched.ID), state(other.ID))
	}
	if m := rdb.ZRange(ctx, keys.Delayed, 0, -1).Val(); len(m) != 1 || !strings.HasPrefix(m[0], other.ID+"|") {
		t.Fatalf("delayed set after cancel = %.60q; want only the other job (%s)", m, other.ID)
	}
	if _, err := control.Cancel(ctx, rdb, name, sched.ID); !errors.Is(err, control.ErrJobFinished) {
		t.Errorf("Cancel twice: %v; want ErrJobFinished", err)
	}
	waiting := newJob("work")
	if _, err := p.Enqueue(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	tracked[2] = waiting.ID
	if was, err := control.Cancel(ctx, rdb, name, waiting.ID); err != nil || was != stream.StateWaiting {
		t.Fatalf("Cancel(waiting) = %q, %v", was, err)
	}
	if n := rdb.XLen(ctx, name).Val(); n != 0 || state(waiting.ID) != stream.StateCancelled {
		t.Fatalf("after cancel: stream holds %d, state %s; want 0, cancelled", n, state(waiting.ID))
	}
	if _, err := control.Cancel(ctx, rdb, name, "never-enqueued"); !errors.Is(err, control.ErrUnknownJob) {
		t.Errorf("Cancel(unknown): %v; want ErrUnknownJob", err)
	}

	// Running: the handler's context is cancelled with ErrCancelled, and
	// the job ends cancelled although the handler then asked for a retry.
	// Then a retrying job is cancelled out of the delayed set.
	run := newJob("work")
	if _, err := p.Enqueue(ctx, run); err != nil {
		t.Fatal(err)
	}
	tracked[3] = run.ID
	started, causes := make(chan struct{}, 1), make(chan error, 1)
	var handled atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		handled.Add(1)
		if j.Type == "work" {
			started <- struct{}{}
			<-ctx.Done()
			causes <- context.Cause(ctx)
		}
		return consumer.RetryAfter(time.Hour, errors.New("later"))
	})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 100 * time.Millisecond}).Handle(h)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-started
	if was, err := control.Cancel(ctx, rdb, name, run.ID); err != nil || was != stream.StateCancelling {
		t.Fatalf("Cancel(running) = %q, %v; want cancelling", was, err)
	}
	if info, err := control.Lookup(ctx, rdb, name, run.ID); err != nil ||
		(info.State == stream.StateCancelling && (info.Consumer != "c1" || info.EntryID == "" || info.At.IsZero())) ||
		(info.State != stream.StateCancelling && info.State != stream.StateCancelled) {
		t.Errorf("Lookup(cancelling) = %+v, %v; want cancelling by c1 with entry and time, or cancelled", info, err)
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, consumer.ErrCancelled) {
			t.Fatalf("handler's context cause = %v; want ErrCancelled", cause)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("handler's context not cancelled within 30s of Cancel")
	}
	poll.Until(t, 30*time.Second, func() (bool, string) { s := state(run.ID); return s == stream.StateCancelled, s })
	if _, err := control.Cancel(ctx, rdb, name, run.ID); !errors.Is(err, control.ErrJobFinished) {
		t.Errorf("Cancel(cancelled) = %v; want ErrJobFinished", err)
	}
	fail := newJob("fail")
	if _, err := p.Enqueue(ctx, fail); err != nil {
		t.Fatal(err)
	}
	tracked[4] = fail.ID
	poll.Until(t, 30*time.Second, func() (bool, string) { s := state(fail.ID); return s == stream.StateRetrying, s })
	if was, err := control.Cancel(ctx, rdb, name, fail.ID); err != nil || was != stream.StateRetrying {
		t.Fatalf("Cancel(retrying) = %q, %v", was, err)
	}
	if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != 1 || state(fail.ID) != stream.StateCancelled {
		t.Errorf("after cancel: delayed set holds %d (want only the other scheduled job), state %s", n, state(fail.ID))
	}
	if n := handled.Load(); n != 2 {
		t.Errorf("handler ran %d times; want twice (once each; cancelled jobs never run again)", n)
	}
	if st := c.Stats(); st.Cancelled != 1 {
		t.Errorf("Stats().Cancelled = %d; want 1", st.Cancelled)
	}
}

// Cancel racing with a consumer: each of many tracked jobs ends in exactly
// one final state, matching what ran: cancelled before it ran (never run),
// or cancelling while it ran (its handler, which stops when its context is
// cancelled, returned an error: cancelled; or completed first: done), or
// refused as finished (done). Nothing is lost, doubled or retried.
func TestCancel_raceWithConsumer(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 300
	jobs := make([]*stream.Job, n)
	t.Cleanup(func() {
		for _, j := range jobs {
			if j != nil {
				rdb.Del(context.Background(), stream.JobKey(keys, j.ID))
			}
		}
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead)
	})
	var mu sync.Mutex
	ran := make(map[string]int)
	completed := make(map[string]bool) // the handler returned nil
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		ran[j.ID]++
		mu.Unlock()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(time.Duration(j.ID[len(j.ID)-1]%8) * 2 * time.Millisecond): // 0 to 14 ms
		}
		mu.Lock()
		completed[j.ID] = true
		mu.Unlock()
		return nil
	})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 100 * time.Millisecond}).Handle(h)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	was := make(map[string]string)
	for i := range jobs {
		jobs[i] = &stream.Job{Type: "work", Payload: []byte(`{}`)}
		if _, err := p.Enqueue(ctx, jobs[i]); err != nil {
			t.Fatal(err)
		}
		w, err := control.Cancel(ctx, rdb, name, jobs[i].ID)
		switch {
		case err == nil:
			was[jobs[i].ID] = w
		case errors.Is(err, control.ErrJobFinished):
			was[jobs[i].ID] = "finished"
		default:
			t.Fatalf("Cancel: %v", err)
		}
	}
	final := func(j *stream.Job) string {
		info, err := control.Lookup(context.Background(), rdb, name, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		return info.State
	}
	for _, j := range jobs {
		poll.Until(t, 60*time.Second, func() (bool, string) {
			s := final(j)
			return s == stream.StateDone || s == stream.StateCancelled, s
		})
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	count := make(map[string]int)
	for _, j := range jobs {
		got, w := final(j), was[j.ID]
		count[w+"→"+got]++
		want := stream.StateCancelled
		switch {
		case w == "finished", completed[j.ID]:
			want = stream.StateDone
		}
		if got != want || ran[j.ID] > 1 || (w != stream.StateCancelling && w != "finished" && ran[j.ID] != 0) || (w == "finished" && !completed[j.ID]) {
			t.Errorf("job %s: Cancel said %q, handler ran %d times (completed %v), final state %s; want %s",
				j.ID, w, ran[j.ID], completed[j.ID], got, want)
		}
	}
	settled := n - count[stream.StateWaiting+"→"+stream.StateCancelled] - count[stream.StateScheduled+"→"+stream.StateCancelled]
	if st := c.Stats(); int(st.Cancelled+st.Acked) != settled || st.Retried != 0 || st.DeadLettered != 0 {
		t.Errorf("Stats = %+v; want %d cancelled or acked, none retried or dead", st, settled)
	}
	t.Logf("Cancel's answer → final state: %v", count)
}

// TestCancel_refused: an error reply that cancel.lua gives before it writes
// (WRONGTYPE: the job's index record is of another type) says "nothing
// changed" and unwraps to the reply; a closed client says "outcome unknown".
func TestCancel_refused(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	ctx := context.Background()
	keys, _ := stream.KeysFor(name)
	rec := stream.JobKey(keys, "j")
	if err := rdb.HSet(ctx, rec, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), rec) })
	_, err := control.Cancel(ctx, rdb, name, "j")
	var re redis.Error
	if err == nil || !strings.Contains(err.Error(), "(nothing changed)") || !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "WRONGTYPE") {
		t.Errorf("Cancel with a hash as the record: %v; want a WRONGTYPE nothing-changed error", err)
	}
	closed := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	_ = closed.Close()
	if _, err := control.Cancel(ctx, closed, name, "j"); err == nil || !strings.Contains(err.Error(), "(outcome unknown)") {
		t.Errorf("Cancel on a closed client: %v; want outcome unknown", err)
	}
}
