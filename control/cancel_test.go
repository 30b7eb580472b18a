package control_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// On a real Redis: a scheduled job, a retrying one and a waiting one are
// cancelled (gone from the delayed set or the stream, Lookup says
// cancelled); a running job, a finished one and an unknown one are refused
// with their errors and nothing changes; cancelling twice is refused.
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

	// Running, then retrying, then done.
	run := newJob("work")
	if _, err := p.Enqueue(ctx, run); err != nil {
		t.Fatal(err)
	}
	tracked[3] = run.ID
	started, release := make(chan struct{}, 1), make(chan error)
	var handled atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		handled.Add(1)
		started <- struct{}{}
		return <-release
	})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 100 * time.Millisecond}).Handle(h)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-started
	if _, err := control.Cancel(ctx, rdb, name, run.ID); !errors.Is(err, control.ErrJobRunning) {
		t.Errorf("Cancel(running): %v; want ErrJobRunning", err)
	}
	release <- consumer.RetryAfter(time.Hour, errors.New("later"))
	deadline := time.Now().Add(30 * time.Second)
	for state(run.ID) != stream.StateRetrying {
		if time.Now().After(deadline) {
			t.Fatalf("job not retrying within 30s: %s", state(run.ID))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if was, err := control.Cancel(ctx, rdb, name, run.ID); err != nil || was != stream.StateRetrying {
		t.Fatalf("Cancel(retrying) = %q, %v", was, err)
	}
	if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != 1 || state(run.ID) != stream.StateCancelled {
		t.Errorf("after cancel: delayed set holds %d (want only the other scheduled job), state %s", n, state(run.ID))
	}
	if n := handled.Load(); n != 1 {
		t.Errorf("handler ran %d times; want once (cancelled jobs never run)", n)
	}
}

// Cancel racing with a consumer: each of many tracked jobs ends in exactly
// one final state: either Cancel succeeded, the handler never ran it and
// Lookup says cancelled, or Cancel was refused (running or finished), the
// handler ran it once and Lookup says done. Nothing is lost or doubled.
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
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		ran[j.ID]++
		mu.Unlock()
		return nil
	})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 100 * time.Millisecond}).Handle(h)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	cancelled := make(map[string]bool)
	for i := range jobs {
		jobs[i] = &stream.Job{Type: "work", Payload: []byte(`{}`)}
		if _, err := p.Enqueue(ctx, jobs[i]); err != nil {
			t.Fatal(err)
		}
		_, err := control.Cancel(ctx, rdb, name, jobs[i].ID)
		switch {
		case err == nil:
			cancelled[jobs[i].ID] = true
		case errors.Is(err, control.ErrJobRunning), errors.Is(err, control.ErrJobFinished):
		default:
			t.Fatalf("Cancel: %v", err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, j := range jobs {
		want := stream.StateDone
		if cancelled[j.ID] {
			want = stream.StateCancelled
		}
		for {
			info, err := control.Lookup(ctx, rdb, name, j.ID)
			if err != nil {
				t.Fatal(err)
			}
			if info.State == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: state %s; want %s", j.ID, info.State, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, j := range jobs {
		if want := map[bool]int{true: 0, false: 1}[cancelled[j.ID]]; ran[j.ID] != want {
			t.Errorf("job %s (cancelled %v) ran %d times; want %d", j.ID, cancelled[j.ID], ran[j.ID], want)
		}
	}
	t.Logf("%d of %d jobs cancelled before they ran", len(cancelled), n)
}
