package stream_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// commandRecorder is a go-redis hook that records every command sent, and
// how: one Process call per single command, one ProcessPipeline call per
// round trip of a pipeline.
type commandRecorder struct {
	mu        sync.Mutex
	singles   [][]any   // args of each single command
	pipelines [][][]any // args of each command, per pipeline round trip
}

func (r *commandRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *commandRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.mu.Lock()
		r.singles = append(r.singles, cmd.Args())
		r.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (r *commandRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		args := make([][]any, len(cmds))
		for i, c := range cmds {
			args[i] = c.Args()
		}
		r.mu.Lock()
		r.pipelines = append(r.pipelines, args)
		r.mu.Unlock()
		return next(ctx, cmds)
	}
}

// xadds returns the args of the XADDs sent as single commands, and the number
// of XADDs in each pipeline round trip that had any.
func (r *commandRecorder) xadds() (singles [][]any, perPipeline []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.singles {
		if a[0] == "xadd" {
			singles = append(singles, a)
		}
	}
	for _, p := range r.pipelines {
		n := 0
		for _, a := range p {
			if a[0] == "xadd" {
				n++
			}
		}
		if n > 0 {
			perPipeline = append(perPipeline, n)
		}
	}
	return singles, perPipeline
}

// producerBundle holds what a producer test inspects besides the producer.
type producerBundle struct {
	mr     *miniredis.Miniredis
	rdb    *redis.Client
	rec    *commandRecorder
	stream string
}

// setupProducer returns a producer for stream "jobs" (with cfg's other
// settings) on a fresh miniredis whose clock is frozen at 1700000000000 ms.
func setupProducer(t *testing.T, cfg stream.ProducerConfig) (*stream.Producer, *producerBundle) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(time.UnixMilli(1700000000000))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	// Open the connection now, so that its handshake is not recorded.
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping miniredis: %v", err)
	}
	rec := &commandRecorder{}
	rdb.AddHook(rec)
	if cfg.Stream == "" {
		cfg.Stream = "jobs"
	}
	return stream.NewProducer(rdb, cfg), &producerBundle{mr: mr, rdb: rdb, rec: rec, stream: cfg.Stream}
}

func TestProducer_Enqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SetsUUIDv7AndWritesFields", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		job := &stream.Job{Type: "email.send", Payload: []byte(`{"to":"a@example.com"}`), Headers: map[string]string{"tenant": "acme"}}
		id, err := p.Enqueue(ctx, job)
		if err != nil {
			t.Fatalf("Enqueue error: %v", err)
		}
		if id != "1700000000000-0" {
			t.Errorf("Enqueue = %q, want the entry ID 1700000000000-0", id)
		}
		u, err := uuid.Parse(job.ID)
		if err != nil {
			t.Fatalf("job.ID %q is not a UUID: %v", job.ID, err)
		}
		if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Errorf("job.ID %s has version %d, variant %v; want version 7, RFC 4122", u, u.Version(), u.Variant())
		}

		entries, err := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
		if err != nil {
			t.Fatalf("XRANGE: %v", err)
		}
		if len(entries) != 1 || entries[0].ID != id {
			t.Fatalf("stream holds %v; want one entry %s", entries, id)
		}
		if want := wireFields(t, stream.Encode(job)); !reflect.DeepEqual(entries[0].Values, want) {
			t.Errorf("entry fields = %v, want %v", entries[0].Values, want)
		}
		got, err := stream.Decode(entries[0].ID, entries[0].Values)
		if err != nil {
			t.Fatalf("Decode of the written entry: %v", err)
		}
		if got.ID != job.ID || got.Type != job.Type || got.Headers["tenant"] != "acme" {
			t.Errorf("decoded job = %+v, want ID %s, type %s, header tenant=acme", got, job.ID, job.Type)
		}
	})

	t.Run("NewIDsIncrease", func(t *testing.T) {
		t.Parallel()
		p, _ := setupProducer(t, stream.ProducerConfig{})

		var prev string
		for i := range 50 {
			job := &stream.Job{Type: "t"}
			if _, err := p.Enqueue(ctx, job); err != nil {
				t.Fatalf("Enqueue %d: %v", i, err)
			}
			if job.ID <= prev {
				t.Fatalf("job ID %s after %s; UUIDv7s must sort in creation order", job.ID, prev)
			}
			prev = job.ID
		}
	})

	t.Run("KeepsJobID", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		job := &stream.Job{Type: "t", ID: "my-id"}
		if _, err := p.Enqueue(ctx, job); err != nil {
			t.Fatalf("Enqueue error: %v", err)
		}
		if job.ID != "my-id" {
			t.Errorf("job.ID = %q, want it unchanged", job.ID)
		}
		entries, _ := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
		if len(entries) != 1 || entries[0].Values[stream.FieldJobID] != "my-id" {
			t.Errorf("stream holds %v; want one entry with job_id my-id", entries)
		}
	})

	t.Run("NoTypeTouchesNoRedis", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		before := b.mr.CommandCount()
		for _, job := range []*stream.Job{nil, {}, {Payload: []byte("{}"), ID: "x"}} {
			id, err := p.Enqueue(ctx, job)
			if err == nil || id != "" {
				t.Errorf("Enqueue(%+v) = %q, %v; want an error", job, id, err)
			} else if !strings.Contains(err.Error(), "Type") {
				t.Errorf("Enqueue(%+v) error %q does not name Type", job, err)
			}
		}
		if singles, pipes := b.rec.xadds(); len(singles)+len(pipes) != 0 {
			t.Errorf("sent %d XADDs and %d pipelines for invalid jobs; want none", len(singles), len(pipes))
		}
		if after := b.mr.CommandCount(); after != before {
			t.Errorf("miniredis ran %d commands for invalid jobs; want none", after-before)
		}
	})

	t.Run("RedisErrorNotEnqueued", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		b.mr.SetError("ERR injected")
		job := &stream.Job{Type: "t", ID: "j1"}
		_, err := p.Enqueue(ctx, job)
		if err == nil {
			t.Fatal("Enqueue succeeded while Redis fails every command")
		}
		for _, want := range []string{"(not enqueued)", "j1", "injected"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not contain %q", err, want)
			}
		}
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			t.Errorf("error %v does not wrap the redis.Error", err)
		}
	})

	t.Run("MaxLenTrimsApproximately", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{MaxLen: 5})

		for i := range 20 {
			if _, err := p.Enqueue(ctx, &stream.Job{Type: "t"}); err != nil {
				t.Fatalf("Enqueue %d: %v", i, err)
			}
		}
		singles, _ := b.rec.xadds()
		if len(singles) != 20 {
			t.Fatalf("sent %d XADDs, want 20", len(singles))
		}
		// XADD jobs MAXLEN ~ 5 * ...: approximate, so that Redis trims whole
		// macro nodes only.
		if got, want := fmt.Sprint(singles[0][:6]), "[xadd jobs maxlen ~ 5 *]"; got != want {
			t.Errorf("XADD args start %s, want %s", got, want)
		}
		// Real Redis keeps at least MaxLen (often more); miniredis trims exactly.
		n, err := b.rdb.XLen(ctx, b.stream).Result()
		if err != nil {
			t.Fatalf("XLEN: %v", err)
		}
		if n < 5 || n >= 20 {
			t.Errorf("XLEN after 20 enqueues = %d, want at least 5 and fewer than 20", n)
		}
	})

	t.Run("NoMaxLenNoTrim", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		for range 3 {
			if _, err := p.Enqueue(ctx, &stream.Job{Type: "t"}); err != nil {
				t.Fatal(err)
			}
		}
		singles, _ := b.rec.xadds()
		for _, a := range singles {
			if got := fmt.Sprint(a[:3]); got != "[xadd jobs *]" {
				t.Errorf("XADD args start %s, want [xadd jobs *]", got)
			}
		}
	})
}

func TestProducer_EnqueueBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OneRoundTripInOrder", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		jobs := make([]*stream.Job, 250)
		for i := range jobs {
			jobs[i] = &stream.Job{Type: "t", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
		}
		jobs[7].ID = "preset"
		ids, err := p.EnqueueBatch(ctx, jobs)
		if err != nil {
			t.Fatalf("EnqueueBatch error: %v", err)
		}
		if len(ids) != len(jobs) {
			t.Fatalf("EnqueueBatch returned %d IDs, want %d", len(ids), len(jobs))
		}

		singles, perPipeline := b.rec.xadds()
		if len(singles) != 0 || len(perPipeline) != 1 || perPipeline[0] != 250 {
			t.Errorf("sent %d single XADDs and pipelines of %v XADDs; want one pipeline of 250", len(singles), perPipeline)
		}

		entries, err := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
		if err != nil {
			t.Fatalf("XRANGE: %v", err)
		}
		if len(entries) != len(jobs) {
			t.Fatalf("stream holds %d entries, want %d", len(entries), len(jobs))
		}
		for i, e := range entries {
			if ids[i] != e.ID {
				t.Errorf("ids[%d] = %s, but entry %d is %s", i, ids[i], i, e.ID)
			}
			if e.Values[stream.FieldJobID] != jobs[i].ID || e.Values[stream.FieldPayload] != string(jobs[i].Payload) {
				t.Errorf("entry %d = %v, want job %d (ID %s)", i, e.Values, i, jobs[i].ID)
			}
			if _, err := uuid.Parse(jobs[i].ID); err != nil && i != 7 {
				t.Errorf("jobs[%d].ID = %q, want a UUID", i, jobs[i].ID)
			}
		}
		if jobs[7].ID != "preset" {
			t.Errorf("jobs[7].ID = %q, want it unchanged", jobs[7].ID)
		}
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		before := b.mr.CommandCount()
		for _, jobs := range [][]*stream.Job{nil, {}} {
			ids, err := p.EnqueueBatch(ctx, jobs)
			if ids != nil || err != nil {
				t.Errorf("EnqueueBatch(%v) = %v, %v; want nil, nil", jobs, ids, err)
			}
		}
		if after := b.mr.CommandCount(); after != before {
			t.Errorf("miniredis ran %d commands for an empty batch; want none", after-before)
		}
	})

	t.Run("InvalidJobAddsNothing", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		jobs := []*stream.Job{{Type: "t"}, {Type: "t"}, {Type: "t"}, {Payload: []byte("no type")}, {Type: "t"}}
		ids, err := p.EnqueueBatch(ctx, jobs)
		if err == nil || ids != nil {
			t.Fatalf("EnqueueBatch = %v, %v; want nil and an error", ids, err)
		}
		if !strings.Contains(err.Error(), "batch job 3") {
			t.Errorf("error %q does not name batch job 3", err)
		}
		if b.mr.Exists(b.stream) {
			t.Errorf("stream %s exists; a batch with an invalid job must add nothing", b.stream)
		}
	})

	t.Run("RedisErrorPerJob", func(t *testing.T) {
		t.Parallel()
		p, b := setupProducer(t, stream.ProducerConfig{})

		b.mr.SetError("ERR injected")
		jobs := []*stream.Job{{Type: "a", ID: "j0"}, {Type: "b", ID: "j1"}, {Type: "c", ID: "j2"}}
		ids, err := p.EnqueueBatch(ctx, jobs)
		if err == nil {
			t.Fatal("EnqueueBatch succeeded while Redis fails every command")
		}
		if want := []string{"", "", ""}; !reflect.DeepEqual(ids, want) {
			t.Errorf("ids = %q, want %q", ids, want)
		}
		joined, ok := err.(interface{ Unwrap() []error })
		if !ok || len(joined.Unwrap()) != 3 {
			t.Fatalf("error %v does not join three per-job errors", err)
		}
		for i, e := range joined.Unwrap() {
			if !strings.Contains(e.Error(), jobs[i].ID) || !strings.Contains(e.Error(), "(not enqueued)") {
				t.Errorf("error %d = %q; want job %s and \"(not enqueued)\"", i, e, jobs[i].ID)
			}
		}
	})
}

func TestNewProducer(t *testing.T) {
	t.Parallel()

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"}) // never dialled
	t.Cleanup(func() { _ = rdb.Close() })
	tests := []struct {
		name string
		cfg  stream.ProducerConfig
		want string // in the error
	}{
		{"EmptyStream", stream.ProducerConfig{}, "ProducerConfig.Stream"},
		{"BracesWithoutTag", stream.ProducerConfig{Stream: "a}b"}, "ProducerConfig.Stream"},
		{"NegativeMaxLen", stream.ProducerConfig{Stream: "jobs", MaxLen: -1}, "ProducerConfig.MaxLen"},
		{"EnqueueOnceUnderAMillisecond", stream.ProducerConfig{Stream: "jobs", EnqueueOnce: time.Microsecond}, "ProducerConfig.EnqueueOnce"},
		{"OnceNamespaceOfAnotherKey", stream.ProducerConfig{Stream: "jobs", OnceNamespace: "dlq"}, "ProducerConfig.OnceNamespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate(%+v) = %v; want an error naming %s", tt.cfg, err, tt.want)
			}
			// The producer is made, and every call returns the same error
			// without dialling Redis (the address is unusable).
			p := stream.NewProducer(rdb, tt.cfg)
			ctx := context.Background()
			job := func() *stream.Job { return &stream.Job{Type: "t"} }
			_, err1 := p.Enqueue(ctx, job())
			_, err2 := p.EnqueueBatch(ctx, []*stream.Job{job()})
			err3 := p.EnqueueIn(ctx, job(), time.Second)
			err4 := p.EnqueueAt(ctx, job(), time.Now())
			for i, err := range []error{err1, err2, err3, err4} {
				if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "outcome unknown") {
					t.Errorf("call %d: %v; want the config error naming %s, Redis untouched", i+1, err, tt.want)
				}
			}
		})
	}
	if err := (stream.ProducerConfig{Stream: "jobs"}).Validate(); err != nil {
		t.Errorf("Validate of a good config: %v", err)
	}
}
