package stream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// wantOutcome fails unless err says outcome (and not the other one) and
// still unwraps to the Redis error reply whose text starts with reply.
func wantOutcome(t *testing.T, what string, err error, outcome, reply string) {
	t.Helper()
	var re redis.Error
	switch {
	case err == nil:
		t.Errorf("%s: no error; want %q", what, outcome)
	case !strings.Contains(err.Error(), "("+outcome+")"):
		t.Errorf("%s: %v; want %q", what, err, outcome)
	case reply != "" && (!errors.As(err, &re) || !strings.HasPrefix(re.Error(), reply)):
		t.Errorf("%s: %v does not unwrap to a %s reply", what, err, reply)
	}
}

// TestProducer_refused: an error reply that Redis gives before the write
// runs (OOM under maxmemory 1 with noeviction, NOPERM, WRONGTYPE) says "not
// enqueued" ("not scheduled"), and nothing was written; a network error
// says "outcome unknown".
func TestProducer_refused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OOM", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "1", "--maxmemory-policy", "noeviction"}})
		rdb := srv.Client(t)
		for _, cfg := range []stream.ProducerConfig{{Stream: "q"}, {Stream: "q", EnqueueOnce: time.Hour}, {Stream: "q", Track: true}} {
			p := stream.NewProducer(rdb, cfg)
			_, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "k"})
			wantOutcome(t, "Enqueue", err, "not enqueued", "OOM")
			_, err = p.EnqueueBatch(ctx, []*stream.Job{{Type: "t", IdempotencyKey: "a"}, {Type: "t", IdempotencyKey: "b"}})
			wantOutcome(t, "EnqueueBatch", err, "not enqueued", "OOM")
			wantOutcome(t, "EnqueueIn", p.EnqueueIn(ctx, &stream.Job{Type: "t", IdempotencyKey: "c"}, time.Minute), "not scheduled", "OOM")
		}
		if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Errorf("DBSIZE = %d, %v after refused writes; want 0", n, err)
		}
	})

	t.Run("NOPERM", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, redistest.Options{})
		admin := srv.Client(t)
		if err := admin.Do(ctx, "ACL", "SETUSER", "ro", "on", ">pw", "~*", "+@all", "-xadd", "-zadd").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "ro", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		for _, cfg := range []stream.ProducerConfig{{Stream: "q"}, {Stream: "q", EnqueueOnce: time.Hour}} {
			p := stream.NewProducer(rdb, cfg)
			_, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "k"})
			wantOutcome(t, "Enqueue", err, "not enqueued", "NOPERM")
			wantOutcome(t, "EnqueueIn", p.EnqueueIn(ctx, &stream.Job{Type: "t", IdempotencyKey: "c"}, time.Minute), "not scheduled", "NOPERM")
		}
		if n, err := admin.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Errorf("DBSIZE = %d, %v after refused writes; want 0", n, err)
		}
	})

	// A batch whose second job's marker is of another type: the script
	// reads every marker before its first write, so the first job is not
	// added either, and both say so.
	t.Run("WRONGTYPE", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Shared(t)
		name := t.Name() + ":" + time.Now().Format("150405.000000000")
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
		marker, _ := stream.OnceKey(name, "b")
		if err := rdb.HSet(ctx, marker, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rdb.Del(context.Background(), marker, name) })
		_, err := p.EnqueueBatch(ctx, []*stream.Job{{Type: "t", IdempotencyKey: "a"}, {Type: "t", IdempotencyKey: "b"}})
		wantOutcome(t, "EnqueueBatch", err, "not enqueued", "WRONGTYPE")
		if n := rdb.XLen(ctx, name).Val(); n != 0 {
			t.Errorf("XLEN = %d after a refused batch; want 0", n)
		}
	})

	t.Run("NetworkError", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, redistest.Options{})
		rdb := srv.Client(t)
		if err := rdb.Close(); err != nil {
			t.Fatal(err)
		}
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "q"})
		_, err := p.Enqueue(ctx, &stream.Job{Type: "t"})
		wantOutcome(t, "Enqueue on a closed client", err, "outcome unknown", "")
	})
}
