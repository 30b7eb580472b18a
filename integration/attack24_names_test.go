package integration

// Outside tester (s24-attack) of '~' being reserved in queue and stream
// names except in a partition's own hash tag, and of the documented ACL
// pattern "~{orders~*" granting one partitioned queue's keys and no other's.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func TestAttack24NamesTildeRefused(t *testing.T) {
	t.Parallel()
	parts, err := stream.Partitions("orders", 12)
	if err != nil {
		t.Fatal(err)
	}
	// Names that would put another queue's keys under "{orders~" (or use
	// '~' anywhere outside a partition's own name).
	bad := []string{"a~b", "~", "orders~", "~orders", "{orders~x}", "{orders~}", "{orders~12~0}"}
	rdb := redistest.Shared(t)
	for _, name := range bad {
		if err := (stream.ProducerConfig{Stream: name}).Validate(); err == nil {
			t.Errorf("ProducerConfig.Stream %q accepted", name)
		} else if !strings.Contains(err.Error(), "Stream") {
			t.Errorf("ProducerConfig.Stream %q: error %q does not name the field", name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := consumer.New(rdb, consumer.Config{Stream: name, Group: "g"}).Handle(consumer.HandlerFunc(
			func(context.Context, *stream.Job) error { return nil })).Run(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Errorf("consumer Config.Stream %q: Run returned %v (timed out %v), want a refusal", name, err, timedOut)
		} else if !strings.Contains(err.Error(), "Stream") {
			t.Errorf("consumer Config.Stream %q: error %q does not name the field", name, err)
		}
		if exists, _ := rdb.Exists(context.Background(), name).Result(); exists != 0 {
			t.Errorf("%q: key created", name)
		}
	}
	for _, q := range []string{"a~b", "~", "orders~", "{orders}", "or{ders"} {
		if _, err := stream.NewPartitionedProducer(rdb, stream.PartitionedProducerConfig{Queue: q, Partitions: 2}); err == nil {
			t.Errorf("PartitionedProducerConfig.Queue %q accepted", q)
		} else if !strings.Contains(err.Error(), "Queue") {
			t.Errorf("PartitionedProducerConfig.Queue %q: error %q does not name the field", q, err)
		}
	}
	for _, name := range append(parts, "orders", "{shop}:orders") {
		if err := (stream.ProducerConfig{Stream: name}).Validate(); err != nil {
			t.Errorf("ProducerConfig.Stream %q refused: %v", name, err)
		}
	}
}

// TestAttack24NamesTildeOutsidePartitionAccepted: names with '~' that are
// neither a partition's own name nor one of its keys are refused (the docs:
// '~' is reserved for partitions). Was a FINDING: they were accepted.
func TestAttack24NamesTildeOutsidePartitionAccepted(t *testing.T) {
	t.Parallel()
	parts, err := stream.Partitions("orders", 12)
	if err != nil {
		t.Fatal(err)
	}
	// A name under a partition's own namespace ("<partition>:<suffix>", as
	// its dead-letter stream is) is one of that partition's keys: accepted.
	if err := (stream.ProducerConfig{Stream: parts[0] + ":sub"}).Validate(); err != nil {
		t.Errorf("ProducerConfig.Stream %q (a key of a partition) refused: %v", parts[0]+":sub", err)
	}
	for _, name := range []string{"{a}~b", parts[0] + "~", parts[0] + ":sub~", parts[0] + "x", "{orders~12~0~44}", "{orders~12~12~0}", "{x~1~0~0}y~", "x{orders~12~0~43}"} {
		if err := (stream.ProducerConfig{Stream: name}).Validate(); err == nil {
			t.Errorf("ProducerConfig.Stream %q accepted", name)
		}
	}
}

// TestAttack24NamesACLPatternCoversOneQueue: a user limited to
// "~{orders~*" enqueues to every partition of queue orders
// (jobs and delayed jobs) and may touch each partition's keys (dead letters,
// records, locks, markers), and is refused every key of
// queue "orders2", "order" and the unpartitioned "orders".
func TestAttack24NamesACLPatternCoversOneQueue(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "orders", "on", ">pw", "~{orders~*", "+@all", "-@dangerous", "+info", "+client").Err(); err != nil {
		t.Fatal(err)
	}
	u := srv.Client(t, func(o *redis.Options) { o.Username, o.Password = "orders", "pw" })
	pp, err := stream.NewPartitionedProducer(u, stream.PartitionedProducerConfig{Queue: "orders", Partitions: 12})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 48; i++ {
		job := &stream.Job{Type: "t", IdempotencyKey: fmt.Sprint("k", i)}
		if _, _, err := pp.Enqueue(ctx, job); err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		if _, err := pp.EnqueueIn(ctx, &stream.Job{Type: "t", IdempotencyKey: fmt.Sprint("d", i)}, time.Hour); err != nil {
			t.Fatalf("enqueue in: %v", err)
		}
	}
	for _, s := range pp.Streams() {
		keys, err := stream.KeysFor(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{keys.Stream, keys.Dead, keys.Delayed, keys.Idem + "x", keys.Lock + "{x}", keys.Once + "x"} {
			if err := u.Do(ctx, "EXISTS", k).Err(); err != nil {
				t.Errorf("partition key %q refused: %v", k, err)
			}
		}
	}
	for _, q := range []string{"orders2", "order", "Orders"} {
		other, err := stream.NewPartitionedProducer(u, stream.PartitionedProducerConfig{Queue: q, Partitions: 12})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range other.Streams() {
			keys, _ := stream.KeysFor(s)
			for _, k := range []string{keys.Stream, keys.Dead, keys.Delayed, keys.Idem + "x"} {
				if err := u.Do(ctx, "EXISTS", k).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
					t.Errorf("queue %s key %q: %v, want NOPERM", q, k, err)
				}
			}
		}
	}
	plain, _ := stream.KeysFor("orders")
	for _, k := range []string{plain.Stream, plain.Dead, plain.Delayed} {
		if err := u.Do(ctx, "EXISTS", k).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("unpartitioned queue key %q: %v, want NOPERM", k, err)
		}
	}
}
