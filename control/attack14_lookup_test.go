package control_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// noPanic runs f and fails the test if it panics.
func a14NoPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v", what, r)
		}
	}()
	f()
}

// Hostile records at a job's index key: wrong Redis types, garbage strings,
// length prefixes that lie. Lookup must return an error (the record is not
// one Pelican wrote), never panic, never report a state; Cancel must refuse
// with an error and change nothing.
func TestAttack14Lookup_hostileRecords(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	id := "hostile-1"
	key := stream.JobKey(keys, id)
	t.Cleanup(func() { rdb.Del(context.Background(), key, name, keys.Delayed) })

	garbage := []string{
		"", "garbage", "7:waiting", "7:waiting0:0:0:0:0:", "999999999:waiting0:0:0:0:0:",
		"-1:x0:0:0:0:0:", "7:waiting0:0:0:0:0:0:extra", "4:done0:0:abc:0:0:", "\x00\x01\x02",
		"1:",
	}
	for _, g := range garbage {
		rdb.Set(ctx, key, g, 0)
		a14NoPanic(t, "ParseRecord", func() { _, _ = stream.ParseRecord(g) })
		var info control.JobInfo
		var err error
		a14NoPanic(t, "Lookup", func() { info, err = control.Lookup(ctx, rdb, name, id) })
		if err == nil {
			t.Errorf("Lookup of record %q = %+v, nil; want an error", g, info)
		}
		var cerr error
		a14NoPanic(t, "Cancel", func() { _, cerr = control.Cancel(ctx, rdb, name, id) })
		if cerr == nil {
			t.Errorf("Cancel of record %q succeeded; want an error", g)
		}
		if v := rdb.Get(ctx, key).Val(); v != g {
			t.Errorf("Cancel changed garbage record %q to %q", g, v)
		}
	}
	// Wrong types.
	for _, mk := range []func(){
		func() { rdb.Del(ctx, key); rdb.HSet(ctx, key, "state", "waiting") },
		func() { rdb.Del(ctx, key); rdb.RPush(ctx, key, "x") },
		func() { rdb.Del(ctx, key); rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "x"}) },
		func() { rdb.Del(ctx, key); rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []string{"a", "b"}}) },
	} {
		mk()
		typ := rdb.Type(ctx, key).Val()
		var err error
		a14NoPanic(t, "Lookup", func() { _, err = control.Lookup(ctx, rdb, name, id) })
		if err == nil {
			t.Errorf("Lookup of a %s record succeeded; want an error", typ)
		}
		a14NoPanic(t, "Cancel", func() { _, err = control.Cancel(ctx, rdb, name, id) })
		if err == nil {
			t.Errorf("Cancel of a %s record succeeded; want an error", typ)
		}
		if got := rdb.Type(ctx, key).Val(); got != typ {
			t.Errorf("Cancel changed a %s record into %s", typ, got)
		}
	}
}

// A record whose state is not one of the State constants (written by hand,
// or by a newer/other writer) is not one Pelican wrote: Lookup must return
// an error, not report JobInfo.State "bogus..".
func TestAttack14Lookup_unknownStateRecord(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	key := stream.JobKey(keys, "odd-state")
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	for _, st := range []string{"bogus..", "running", "unknown", "WAITING"} {
		rec := itoa(len(st)) + ":" + st + "0:0:0:0:0:"
		rdb.Set(ctx, key, rec, 0)
		info, err := control.Lookup(ctx, rdb, name, "odd-state")
		if err == nil {
			t.Errorf("Lookup of record %q = state %q, nil; want an error", rec, info.State)
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

// ParseRecord on arbitrary bytes never panics.
func FuzzAttack14ParseRecord(f *testing.F) {
	for _, s := range []string{"7:waiting3:1-00:0:0:0:", "4:done0:0:13:17000000000000:2:ok", "9:", "2:ab-3:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := stream.ParseRecord(s)
		if err == nil && r.State == "" {
			t.Errorf("ParseRecord(%q) = %+v, nil: a record without a state", s, r)
		}
	})
}

// Job IDs: empty, over MaxJobIDBytes, odd bytes. Lookup and Cancel must give
// an error for bad IDs, never panic; odd but valid IDs (over 128 bytes:
// sha1 key; braces, newlines, colons) go through every state.
func TestAttack14Lookup_oddIDs(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), name, keys.Delayed, keys.Dead) })

	huge := strings.Repeat("x", control.MaxJobIDBytes+1)
	for _, bad := range []string{"", huge, strings.Repeat("y", 1<<20)} {
		var err error
		a14NoPanic(t, "Lookup", func() { _, err = control.Lookup(ctx, rdb, name, bad) })
		if err == nil {
			t.Errorf("Lookup of a %d-byte ID succeeded; want an error", len(bad))
		}
		var cerr error
		a14NoPanic(t, "Cancel", func() { _, cerr = control.Cancel(ctx, rdb, name, bad) })
		if cerr == nil {
			t.Errorf("Cancel of a %d-byte ID succeeded; want an error", len(bad))
		}
	}
	if _, err := control.Lookup(ctx, rdb, "", "x"); err == nil {
		t.Errorf("Lookup with an empty stream name succeeded")
	}
	if _, err := control.Cancel(ctx, rdb, "", "x"); err == nil {
		t.Errorf("Cancel with an empty stream name succeeded")
	}

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	ids := []string{strings.Repeat("L", 129), strings.Repeat("M", control.MaxJobIDBytes), "a}b{c", "new\nline", "co:lon:job:x", "ünï"}
	for _, id := range ids {
		t.Cleanup(func() { rdb.Del(context.Background(), stream.JobKey(keys, id)) })
		j := &stream.Job{ID: id, Type: "w", Payload: []byte(`{}`)}
		if err := p.EnqueueIn(ctx, j, time.Hour); err != nil {
			t.Logf("EnqueueIn(ID %q...): %v (rejected)", trunc(id), err)
			continue
		}
		info, err := control.Lookup(ctx, rdb, name, id)
		if err != nil || info.State != stream.StateScheduled {
			t.Errorf("Lookup(%q...) after EnqueueIn = %+v, %v; want scheduled", trunc(id), info, err)
			continue
		}
		// promote it
		for _, m := range rdb.ZRange(ctx, keys.Delayed, 0, -1).Val() {
			rdb.ZAdd(ctx, keys.Delayed, redis.Z{Score: 0, Member: m})
		}
		if _, err := stream.PromoteDue(ctx, rdb, name, 100); err != nil {
			t.Fatal(err)
		}
		info, err = control.Lookup(ctx, rdb, name, id)
		if err != nil || info.State != stream.StateWaiting || info.EntryID == "" {
			t.Errorf("Lookup(%q...) after promotion = %+v, %v; want waiting with entry", trunc(id), info, err)
			continue
		}
		was, err := control.Cancel(ctx, rdb, name, id)
		if err != nil || was != stream.StateWaiting {
			t.Errorf("Cancel(%q...) = %q, %v; want waiting", trunc(id), was, err)
		}
		if n := rdb.XLen(ctx, name).Val(); n != 0 {
			t.Errorf("after Cancel(%q...) stream holds %d entries", trunc(id), n)
			rdb.Del(ctx, name)
		}
	}
}

func trunc(s string) string {
	if len(s) > 20 {
		return s[:20]
	}
	return s
}

// Garbage in the delayed set next to a tracked scheduled job: Cancel still
// removes the job (only its member) and leaves the garbage; Lookup is fine.
// A record that says scheduled but whose member is gone: Cancel must not
// report success for a job it did not remove.
func TestAttack14Cancel_delayedGarbage(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	j := &stream.Job{Type: "w", Payload: []byte(`{}`)}
	j2 := &stream.Job{Type: "w", Payload: []byte(`{}`)}
	t.Cleanup(func() {
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, stream.JobKey(keys, j.ID), stream.JobKey(keys, j2.ID))
	})
	due := time.Now().Add(time.Hour)
	if err := p.EnqueueAt(ctx, j, due); err != nil {
		t.Fatal(err)
	}
	if err := p.EnqueueAt(ctx, j2, due); err != nil {
		t.Fatal(err)
	}
	rdb.ZAdd(ctx, keys.Delayed, redis.Z{Score: float64(due.UnixMilli()), Member: "not a job"},
		redis.Z{Score: float64(due.UnixMilli()), Member: j.ID},
		redis.Z{Score: float64(due.UnixMilli()), Member: "\x00\xff"})
	before := rdb.ZCard(ctx, keys.Delayed).Val()
	var was string
	var err error
	a14NoPanic(t, "Cancel", func() { was, err = control.Cancel(ctx, rdb, name, j.ID) })
	if err != nil || was != stream.StateScheduled {
		t.Fatalf("Cancel(scheduled) with garbage in the delayed set = %q, %v", was, err)
	}
	if after := rdb.ZCard(ctx, keys.Delayed).Val(); after != before-1 {
		t.Errorf("delayed set %d -> %d members; want exactly one removed", before, after)
	}
	for _, m := range []string{"not a job", j.ID, "\x00\xff"} {
		if rdb.ZScore(ctx, keys.Delayed, m).Err() != nil {
			t.Errorf("garbage member %q was removed", m)
		}
	}
	if info, err := control.Lookup(ctx, rdb, name, j.ID); err != nil || info.State != stream.StateCancelled || info.At.IsZero() {
		t.Errorf("Lookup after Cancel = %+v, %v; want cancelled with a time", info, err)
	}
	if ttl := rdb.PTTL(ctx, stream.JobKey(keys, j.ID)).Val(); ttl <= 0 || ttl > stream.DefaultTrackTTL+time.Minute {
		t.Errorf("cancelled record lives %v; want about DefaultTrackTTL", ttl)
	}
	// The member of j2 disappears behind the record's back (e.g. promoted by
	// hand, or ZREM): Cancel must not claim to have cancelled it silently.
	rdb.ZRemRangeByScore(ctx, keys.Delayed, "-inf", "+inf")
	was, err = control.Cancel(ctx, rdb, name, j2.ID)
	if err == nil {
		t.Errorf("Cancel of a scheduled job whose delayed member is gone = %q, nil; want an error (ErrUnknownJob)", was)
	} else if !errors.Is(err, control.ErrUnknownJob) {
		t.Logf("Cancel of vanished scheduled job: %v", err)
	}
}

// A waiting tracked job whose entry was trimmed: Lookup says unknown and names
// the entry; Cancel refuses with ErrUnknownJob. A record waiting whose stream
// key is the wrong type gives an error, not a panic.
func TestAttack14Lookup_trimmedEntry(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	j := &stream.Job{Type: "w", Payload: []byte(`{}`)}
	t.Cleanup(func() { rdb.Del(context.Background(), name, keys.Delayed, stream.JobKey(keys, j.ID)) })
	entry, err := p.Enqueue(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	rdb.XGroupCreateMkStream(ctx, name, "g", "$")
	rdb.XDel(ctx, name, entry)
	info, err := control.Lookup(ctx, rdb, name, j.ID)
	if err != nil || info.State != control.StateUnknown || info.EntryID != entry {
		t.Errorf("Lookup of a trimmed waiting job = %+v, %v; want unknown naming %s", info, err, entry)
	}
	if _, err := control.Cancel(ctx, rdb, name, j.ID); !errors.Is(err, control.ErrUnknownJob) {
		t.Errorf("Cancel of a trimmed waiting job = %v; want ErrUnknownJob", err)
	}
	rdb.Del(ctx, name)
	rdb.Set(ctx, name, "not a stream", 0)
	a14NoPanic(t, "Lookup", func() { _, err = control.Lookup(ctx, rdb, name, j.ID) })
	a14NoPanic(t, "Cancel", func() { _, err = control.Cancel(ctx, rdb, name, j.ID) })
	if err == nil {
		t.Errorf("Cancel with the stream key a string succeeded")
	}
}

// SetResult bounds: exactly MaxResultBytes is kept intact (binary, all byte
// values); MaxResultBytes+1 is an error and the earlier result stays; an
// untracked job returns nil and writes no key; an empty result is nil.
func TestAttack14SetResult_bounds(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &stream.Job{Type: "t", Payload: []byte(`{}`), Track: true}
	pl := &stream.Job{Type: "p", Payload: []byte(`{}`)}
	t.Cleanup(func() {
		rdb.Del(context.Background(), name, keys.Delayed, keys.Dead, stream.JobKey(keys, tr.ID), stream.JobKey(keys, pl.ID))
	})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	if _, err := p.Enqueue(ctx, tr); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Enqueue(ctx, pl); err != nil {
		t.Fatal(err)
	}
	full := make([]byte, consumer.MaxResultBytes)
	for i := range full {
		full[i] = byte(i * 7)
	}
	var untrackedErr, overErr, fullErr atomic.Value
	h := consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		if j.Type == "p" {
			if err := consumer.SetResult(ctx, []byte("x")); err != nil {
				untrackedErr.Store(err.Error())
			}
			return nil
		}
		if err := consumer.SetResult(ctx, full); err != nil {
			fullErr.Store(err.Error())
		}
		if err := consumer.SetResult(ctx, make([]byte, consumer.MaxResultBytes+1)); err == nil {
			overErr.Store("nil")
		}
		return nil
	})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 100 * time.Millisecond}).Handle(h)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	var info control.JobInfo
	for {
		var err error
		info, err = control.Lookup(ctx, rdb, name, tr.ID)
		if err != nil {
			t.Fatal(err)
		}
		pi, _ := control.Lookup(ctx, rdb, name, pl.ID)
		if info.State == stream.StateDone && rdb.XPending(ctx, name, "g").Val().Count == 0 && pi.State == control.StateUnknown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tracked job not done within 30s: %+v", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := fullErr.Load(); v != nil {
		t.Errorf("SetResult of exactly MaxResultBytes: %v", v)
	}
	if overErr.Load() != nil {
		t.Errorf("SetResult of MaxResultBytes+1 returned nil")
	}
	if string(info.Result) != string(full) {
		t.Errorf("result: got %d bytes, want the %d bytes recorded (intact)", len(info.Result), len(full))
	}
	if v := untrackedErr.Load(); v != nil {
		t.Errorf("SetResult on an untracked job: %v; want nil", v)
	}
	if n := rdb.Exists(ctx, stream.JobKey(keys, pl.ID)).Val(); n != 0 {
		t.Errorf("untracked job has an index record")
	}
	if ttl := rdb.PTTL(ctx, stream.JobKey(keys, tr.ID)).Val(); ttl <= 0 || ttl > consumer.DefaultTrackTTL+time.Minute {
		t.Errorf("done record lives %v; want about DefaultTrackTTL", ttl)
	}
}

// A tracked job whose ID is longer than MaxJobIDBytes: either the producer
// refuses it, or Lookup and Cancel find it. A producer that accepts it and a
// Lookup that then refuses its ID leave a tracked job nobody can look up.
func TestAttack14Lookup_longIDEnqueued(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	id := strings.Repeat("z", control.MaxJobIDBytes+100)
	t.Cleanup(func() { rdb.Del(context.Background(), name, keys.Delayed, stream.JobKey(keys, id)) })
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
	if _, err := p.Enqueue(ctx, &stream.Job{ID: id, Type: "w", Payload: []byte(`{}`)}); err != nil {
		t.Logf("producer refuses a %d-byte ID: %v", len(id), err)
		return
	}
	info, err := control.Lookup(ctx, rdb, name, id)
	if err != nil || info.State != stream.StateWaiting {
		t.Errorf("producer accepted a tracked job with a %d-byte ID, but Lookup = %+v, %v", len(id), info.State, err)
	}
	if _, err := control.Cancel(ctx, rdb, name, id); err != nil {
		t.Errorf("producer accepted a tracked job with a %d-byte ID, but Cancel: %v", len(id), err)
	}
}
