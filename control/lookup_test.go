package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// On a real Redis, one tracked job goes through every state and Lookup
// follows it: scheduled (due), waiting (entry), running (consumer,
// deliveries), retrying (due, error), waiting again, running, done (with
// the result the handler recorded); another is dead-lettered (reason). An
// untracked job has no record and costs no key; an ID never enqueued is
// unknown.
func TestLookup_states(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t.Cleanup(func() {
		for _, k := range []string{name, keys.Delayed, keys.Dead} {
			rdb.Del(context.Background(), k)
		}
	})
	var tracked []string // their records are deleted at the end
	t.Cleanup(func() {
		for _, id := range tracked {
			rdb.Del(context.Background(), stream.JobKey(keys, id))
		}
	})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	lookup := func(id, want string) control.JobInfo {
		t.Helper()
		info, err := control.Lookup(ctx, rdb, name, id)
		if err != nil {
			t.Fatalf("Lookup(%s): %v", id, err)
		}
		if info.State != want {
			t.Fatalf("Lookup(%s) = %+v; want state %s", id, info, want)
		}
		return info
	}
	waitFor := func(id, want string) control.JobInfo {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			info, err := control.Lookup(ctx, rdb, name, id)
			if err == nil && info.State == want {
				return info
			}
			if time.Now().After(deadline) {
				t.Fatalf("Lookup(%s) = %+v, %v; want state %s within 30s", id, info, err, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// dueNow makes the delayed set's members due and promotes them.
	dueNow := func() {
		t.Helper()
		for _, m := range rdb.ZRange(ctx, keys.Delayed, 0, -1).Val() {
			rdb.ZAdd(ctx, keys.Delayed, redis.Z{Score: 0, Member: m})
		}
		if _, err := stream.PromoteDue(ctx, rdb, name, 100); err != nil {
			t.Fatal(err)
		}
	}

	job := &stream.Job{Type: "work", Payload: []byte(`{}`)}
	if err := p.EnqueueIn(ctx, job, time.Hour); err != nil {
		t.Fatal(err)
	}
	tracked = append(tracked, job.ID)
	if info := lookup(job.ID, stream.StateScheduled); time.Until(info.Due) < 50*time.Minute {
		t.Errorf("scheduled job due %v; want in about an hour", info.Due)
	}
	dueNow()
	waiting := lookup(job.ID, stream.StateWaiting)
	if waiting.EntryID == "" {
		t.Errorf("waiting job has no entry ID: %+v", waiting)
	}

	// The dead one and an untracked one.
	dead := &stream.Job{Type: "dead", Payload: []byte(`{}`)}
	if _, err := p.Enqueue(ctx, dead); err != nil {
		t.Fatal(err)
	}
	tracked = append(tracked, dead.ID)
	plain := &stream.Job{Type: "plain", Payload: []byte(`{}`)}
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(ctx, plain); err != nil {
		t.Fatal(err)
	}

	release := make(chan error)
	started := make(chan int, 4)
	runs := 0
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		switch j.Type {
		case "dead":
			return consumer.Permanent(errors.New("bad card"))
		case "plain":
			return nil
		}
		runs++
		started <- runs
		err := <-release
		if err == nil {
			if e := consumer.SetResult(ctx, []byte("receipt-42")); e != nil {
				return e
			}
			if e := consumer.SetResult(ctx, make([]byte, consumer.MaxResultBytes+1)); e == nil {
				t.Errorf("SetResult of %d bytes succeeded; want an error", consumer.MaxResultBytes+1)
			}
		}
		return err
	})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 100 * time.Millisecond, TrackTTL: time.Hour}).Handle(h)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()

	<-started
	run := lookup(job.ID, control.StateRunning)
	if run.Consumer != "c1" || run.Group != "g" || run.Deliveries != 1 || run.EntryID != waiting.EntryID {
		t.Errorf("running job = %+v; want consumer c1 of group g, 1 delivery, entry %s", run, waiting.EntryID)
	}
	release <- consumer.RetryAfter(time.Hour, errors.New("card declined"))
	retry := waitFor(job.ID, stream.StateRetrying)
	if !strings.Contains(retry.Error, "card declined") || time.Until(retry.Due) < 50*time.Minute {
		t.Errorf("retrying job = %+v; want error \"card declined\", due in about an hour", retry)
	}
	dueNow()
	<-started
	if again := lookup(job.ID, control.StateRunning); again.EntryID == waiting.EntryID {
		t.Errorf("retried job runs from its old entry %s", again.EntryID)
	}
	release <- nil
	fin := waitFor(job.ID, stream.StateDone)
	if string(fin.Result) != "receipt-42" || fin.At.IsZero() {
		t.Errorf("done job = %+v; want result receipt-42 and a time", fin)
	}
	if ttl := rdb.PTTL(ctx, stream.JobKey(keys, job.ID)).Val(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("done record lives %v; want TrackTTL (1h)", ttl)
	}

	d := waitFor(dead.ID, stream.StateDead)
	if !strings.Contains(d.Error, "bad card") {
		t.Errorf("dead job = %+v; want its reason and error", d)
	}
	lookup(plain.ID, control.StateUnknown)
	if n := rdb.Exists(ctx, stream.JobKey(keys, plain.ID)).Val(); n != 0 {
		t.Errorf("untracked job has an index record")
	}
	lookup("never-enqueued", control.StateUnknown)
	if _, err := control.Lookup(ctx, rdb, name, ""); err == nil {
		t.Errorf("Lookup of an empty ID succeeded")
	}
}

// A dead tracked job replayed from the dead-letter stream is waiting again,
// from its new entry.
func TestLookup_replayed(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := "{" + redistest.Name(t) + "}:jobs"
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	job := &stream.Job{Type: "dead", Payload: []byte(`{}`)}
	t.Cleanup(func() { rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, stream.JobKey(keys, job.ID)) })
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true}).Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 100 * time.Millisecond}).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return consumer.Permanent(errors.New("no")) }))
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	deadline := time.Now().Add(30 * time.Second)
	var first control.JobInfo
	for {
		info, err := control.Lookup(ctx, rdb, name, job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if info.State == stream.StateDead {
			break
		}
		if info.State == control.StateRunning || info.State == stream.StateWaiting {
			first = info
		}
		if time.Now().After(deadline) {
			t.Fatalf("job not dead within 30s: %+v", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	d, err := dlq.New(rdb, name, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); err != nil || res.Replayed != 1 {
		t.Fatalf("Replay = %+v, %v; want 1 replayed", res, err)
	}
	info, err := control.Lookup(ctx, rdb, name, job.ID)
	if err != nil || info.State != stream.StateWaiting || info.EntryID == "" || info.EntryID == first.EntryID {
		t.Fatalf("Lookup after replay = %+v, %v; want waiting from a new entry (not %q)", info, err, first.EntryID)
	}
}
