package stream_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/stream"
)

// TestPartitions_docVectors checks the code against the test vectors of
// docs/wire-format.md ("Partitioned queues"), which non-Go producers follow.
func TestPartitions_docVectors(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/wire-format.md")
	if err != nil {
		t.Fatal(err)
	}
	layout := regexp.MustCompile("(?m)^\\| `([^`]+)` \\| (\\d+) \\| (`\\{.*)\\|$")
	stream1 := regexp.MustCompile("`(\\{[^`]+\\})` \\((\\d+)\\)")
	routes := regexp.MustCompile("(?m)^\\| `([^`]+)`(?: \\(UTF-8\\))? \\| (\\d+) \\| (\\d+) \\| (\\d+) \\|$")
	layouts, keys := 0, 0
	for _, m := range layout.FindAllStringSubmatch(string(doc), -1) {
		n, _ := strconv.Atoi(m[2])
		got, err := stream.Partitions(m[1], n)
		if err != nil {
			t.Fatalf("Partitions(%q, %d): %v", m[1], n, err)
		}
		var want []string
		for _, s := range stream1.FindAllStringSubmatch(m[3], -1) {
			want = append(want, s[1])
			if slot, _ := strconv.Atoi(s[2]); keyslot.Of(s[1]) != slot {
				t.Errorf("doc: %s is in slot %d, not %d", s[1], keyslot.Of(s[1]), slot)
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("Partitions(%q, %d) = %v, the doc says %v", m[1], n, got, want)
		}
		layouts++
	}
	for _, m := range routes.FindAllStringSubmatch(string(doc), -1) {
		of12, _ := strconv.Atoi(m[3])
		of3, _ := strconv.Atoi(m[4])
		if g12, g3 := stream.PartitionOf(m[1], 12), stream.PartitionOf(m[1], 3); g12 != of12 || g3 != of3 {
			t.Errorf("PartitionOf(%q) = %d of 12, %d of 3; the doc says %d, %d", m[1], g12, g3, of12, of3)
		}
		keys++
	}
	if layouts != 3 || keys != 4 {
		t.Fatalf("found %d layout and %d routing vectors in docs/wire-format.md, want 3 and 4", layouts, keys)
	}
}

// TestPartitions_spread checks that partition i of n has its slot in the
// i-th of n equal slot ranges, for counts up to MaxPartitions, and that
// ParsePartition recognises every name.
func TestPartitions_spread(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 3, 7, 12, 16, 100, stream.MaxPartitions} {
		for _, q := range []string{"orders", "a", "shop:orders x"} {
			if n == stream.MaxPartitions && q != "orders" {
				continue // a second each under -race
			}
			names, err := stream.Partitions(q, n)
			if err != nil {
				t.Fatalf("Partitions(%q, %d): %v", q, n, err)
			}
			if len(names) != n {
				t.Fatalf("Partitions(%q, %d) returned %d names", q, n, len(names))
			}
			for i, name := range names {
				lo, hi := i*keyslot.Slots/n, (i+1)*keyslot.Slots/n
				if s := keyslot.Of(name); s < lo || s >= hi {
					t.Fatalf("partition %d of %d of %q is %s in slot %d, outside [%d, %d)", i, n, q, name, s, lo, hi)
				}
				gq, gn, gi, ok := stream.ParsePartition(name)
				if !ok || gq != q || gn != n || gi != i {
					t.Fatalf("ParsePartition(%s) = %q, %d, %d, %v", name, gq, gn, gi, ok)
				}
				if one, err := stream.PartitionStream(q, n, i); err != nil || one != name {
					t.Fatalf("PartitionStream(%q, %d, %d) = %q, %v, want %s", q, n, i, one, err, name)
				}
			}
		}
	}
}

func TestPartitions_invalid(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		queue string
		n     int
		want  string
	}{
		{"", 3, "empty queue"},
		{"{orders}", 3, "braces"},
		{"orders", 0, "between 1 and 1024"},
		{"orders", stream.MaxPartitions + 1, "between 1 and 1024"},
	} {
		if _, err := stream.Partitions(c.queue, c.n); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Partitions(%q, %d) = %v, want an error with %q", c.queue, c.n, err, c.want)
		}
	}
	if _, err := stream.PartitionStream("orders", 3, 3); err == nil {
		t.Error("PartitionStream(orders, 3, 3) succeeded")
	}
	for _, name := range []string{"orders", "{orders}", "{orders~12~0~44}", "{orders~12~0}", "{~12~0~43}",
		"{orders~12~12~0}", "{orders~x~0~43}", "{orders~12~0~43}:dlq", "{orders~0~0~0}"} {
		if q, n, i, ok := stream.ParsePartition(name); ok {
			t.Errorf("ParsePartition(%q) = %q, %d, %d, true; want not a partition", name, q, n, i)
		}
	}
}

func TestPartitionOf(t *testing.T) {
	t.Parallel()
	counts := make([]int, 12)
	for k := range 12000 {
		p := stream.PartitionOf("customer-"+strconv.Itoa(k), 12)
		if p != stream.PartitionOf("customer-"+strconv.Itoa(k), 12) {
			t.Fatal("PartitionOf is not deterministic")
		}
		counts[p]++
	}
	for p, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("partition %d got %d of 12,000 keys, want about 1,000: %v", p, c, counts)
		}
	}
	if stream.PartitionOf("x", 1) != 0 || stream.PartitionOf("x", 0) != 0 {
		t.Error("PartitionOf with fewer than 2 partitions is not 0")
	}
}

func newPartitioned(t *testing.T, cfg stream.PartitionedProducerConfig) (*stream.PartitionedProducer, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	p, err := stream.NewPartitionedProducer(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, rdb
}

// TestPartitionedProducer_routing checks that jobs with a key land in that
// key's partition, in the order they were added, and jobs without one are
// spread evenly; EnqueueBatch agrees with Enqueue.
func TestPartitionedProducer_routing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, rdb := newPartitioned(t, stream.PartitionedProducerConfig{Queue: "orders", Partitions: 4,
		Key: func(j *stream.Job) string { return j.LockKey }})
	streams := p.Streams()
	// Keyed: every job of customer-k in PartitionOf(customer-k), in order.
	var batch []*stream.Job
	for i := range 40 {
		key := "customer-" + strconv.Itoa(i%5)
		job := &stream.Job{Type: "t", LockKey: key, Payload: []byte(strconv.Itoa(i))}
		if i%8 < 4 {
			s, id, err := p.Enqueue(ctx, job)
			if err != nil || id == "" || s != streams[stream.PartitionOf(key, 4)] {
				t.Fatalf("Enqueue: %s %s %v, want stream %s", s, id, err, streams[stream.PartitionOf(key, 4)])
			}
		} else {
			batch = append(batch, job)
		}
		if len(batch) == 4 {
			ids, err := p.EnqueueBatch(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			for k, j := range batch {
				if got := rdb.XRange(ctx, streams[stream.PartitionOf(j.LockKey, 4)], ids[k], ids[k]).Val(); len(got) != 1 {
					t.Fatalf("job %s of batch not in its key's partition", j.Payload)
				}
			}
			batch = nil
		}
	}
	total := 0
	for _, s := range streams {
		last := map[string]int{}
		for _, e := range rdb.XRange(ctx, s, "-", "+").Val() {
			job, err := stream.Decode(e.ID, e.Values)
			if err != nil {
				t.Fatal(err)
			}
			if s != streams[stream.PartitionOf(job.LockKey, 4)] {
				t.Fatalf("job of %s in %s", job.LockKey, s)
			}
			n, _ := strconv.Atoi(string(job.Payload))
			if prev, ok := last[job.LockKey]; ok && n < prev {
				t.Fatalf("%s: job %d after job %d", job.LockKey, n, prev)
			}
			last[job.LockKey] = n
			total++
		}
	}
	if total != 40 {
		t.Fatalf("%d jobs in the partitions, want 40", total)
	}

	// Without a key: each job goes to the partition of its job ID, and a
	// job scheduled again stays in its partition (moved, not copied).
	q, rdb2 := newPartitioned(t, stream.PartitionedProducerConfig{Queue: "rr", Partitions: 3})
	jobs := make([]*stream.Job, 30)
	for i := range jobs {
		jobs[i] = &stream.Job{Type: "t", ID: fmt.Sprintf("rr-%d", i)}
	}
	if _, err := q.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		s := q.Streams()[stream.PartitionOf(j.ID, 3)]
		if n := len(rdb2.XRange(ctx, s, "-", "+").Val()); n == 0 {
			t.Fatalf("job %s is not in %s, the partition of its ID", j.ID, s)
		}
	}
	total = 0
	for _, s := range q.Streams() {
		total += int(rdb2.XLen(ctx, s).Val())
	}
	if total != 30 {
		t.Errorf("%d jobs in the partitions, want 30", total)
	}
	again := &stream.Job{Type: "t", ID: "rr-scheduled"}
	for range 3 {
		if _, err := q.EnqueueIn(ctx, again, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	delayed := int64(0)
	for _, s := range q.Streams() {
		keys, _ := stream.KeysFor(s)
		delayed += rdb2.ZCard(ctx, keys.Delayed).Val()
	}
	if delayed != 1 {
		t.Errorf("a keyless job scheduled 3 times is in the delayed sets %d times, want 1", delayed)
	}
}

// TestPartitionedProducer_once checks that enqueue-once holds across a
// partitioned queue: the default key is the idempotency key, so a repeat
// reaches the same partition and its marker.
func TestPartitionedProducer_once(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, rdb := newPartitioned(t, stream.PartitionedProducerConfig{Queue: "orders", Partitions: 12,
		Producer: stream.ProducerConfig{EnqueueOnce: 60_000_000_000}})
	for range 3 {
		if _, err := p.EnqueueBatch(ctx, []*stream.Job{{Type: "t", IdempotencyKey: "invoice-1"}, {Type: "t", IdempotencyKey: "invoice-2"}}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := p.Enqueue(ctx, &stream.Job{Type: "t", IdempotencyKey: "invoice-1"}); err != nil {
			t.Fatal(err)
		}
	}
	var total int64
	for _, s := range p.Streams() {
		total += rdb.XLen(ctx, s).Val()
	}
	if total != 2 {
		t.Fatalf("%d jobs added for 2 idempotency keys, want 2", total)
	}
}

func TestPartitionedProducerConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  stream.PartitionedProducerConfig
		want string
	}{
		{stream.PartitionedProducerConfig{Partitions: 3}, "Queue is required"},
		{stream.PartitionedProducerConfig{Queue: "q"}, "Partitions (0)"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 2000}, "Partitions (2000)"},
		{stream.PartitionedProducerConfig{Queue: "{q}", Partitions: 3}, "Queue: "},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{Stream: "x"}}, "Producer.Stream"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{MaxLen: -1}}, "Producer: stream: ProducerConfig.MaxLen"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{EnqueueOnce: 1}}, "Producer: stream: ProducerConfig.EnqueueOnce"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{OnceNamespace: "dlq"}}, "Producer: stream: ProducerConfig.OnceNamespace"},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error with %q", c.cfg, err, c.want)
		}
		// Nothing is sent: a nil client would panic on a command.
		if _, err := stream.NewPartitionedProducer(nil, c.cfg); err == nil {
			t.Errorf("NewPartitionedProducer(%+v) succeeded", c.cfg)
		}
	}
}

func ExamplePartitions() {
	names, _ := stream.Partitions("orders", 3)
	fmt.Println(names)
	key := "customer-42"
	fmt.Println(key, "→", names[stream.PartitionOf(key, 3)])
	keys, _ := stream.KeysFor(names[0])
	fmt.Println(keys.Dead)
	// Output:
	// [{orders~3~0~2} {orders~3~1~0} {orders~3~2~3}]
	// customer-42 → {orders~3~2~3}
	// {orders~3~0~2}:dlq
}
