package stream_test

// Outside tests (attack16) of partitioned queues: the layout and routing
// rules recomputed independently (own CRC16 XMODEM and own CRC-32), the
// producer's routing, batch scatter/gather, enqueue-once across
// partitions, scheduling and validation. Partitions are plain streams, so
// the shared single-node Redis serves (every name is the test's own).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// a16CRC16 is CRC16-XMODEM (poly 0x1021, init 0), bit by bit.
func a16CRC16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// a16CRC32 is CRC-32 IEEE (reflected, poly 0xEDB88320), bit by bit.
func a16CRC32(b []byte) uint32 {
	crc := ^uint32(0)
	for _, c := range b {
		crc ^= uint32(c)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xEDB88320
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

// a16Slot is the Redis Cluster slot of key, hash tags included.
func a16Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(a16CRC16([]byte(key)) % 16384)
}

// a16Partition is the documented rule, computed from scratch.
func a16Partition(queue string, n, i int) string {
	lo, hi := i*16384/n, (i+1)*16384/n
	for k := 0; ; k++ {
		tag := queue + "~" + strconv.Itoa(n) + "~" + strconv.Itoa(i) + "~" + strconv.Itoa(k)
		if s := int(a16CRC16([]byte(tag)) % 16384); lo <= s && s < hi {
			return "{" + tag + "}"
		}
	}
}

func TestAttack16_layoutVectors(t *testing.T) {
	want := map[int][]string{
		1:  {"{orders~1~0~0}"},
		3:  {"{orders~3~0~2}", "{orders~3~1~0}", "{orders~3~2~3}"},
		12: {"{orders~12~0~43}", "{orders~12~1~13}", "{orders~12~2~41}", "{orders~12~3~3}", "{orders~12~4~3}", "{orders~12~5~41}", "{orders~12~6~54}", "{orders~12~7~26}", "{orders~12~8~12}", "{orders~12~9~9}", "{orders~12~10~10}", "{orders~12~11~13}"},
	}
	slots := map[string]int{"{orders~1~0~0}": 10927, "{orders~3~0~2}": 3694, "{orders~3~1~0}": 6428, "{orders~3~2~3}": 12335,
		"{orders~12~0~43}": 324, "{orders~12~11~13}": 15932, "{orders~12~6~54}": 9483}
	for n, w := range want {
		got, err := stream.Partitions("orders", n)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, ",") != strings.Join(w, ",") {
			t.Errorf("Partitions(orders, %d) = %v, want %v (wire-format.md)", n, got, w)
		}
		for i := range n {
			if mine := a16Partition("orders", n, i); mine != w[i] {
				t.Errorf("own rule gives %s for partition %d of %d, doc says %s", mine, i, n, w[i])
			}
		}
	}
	for s, slot := range slots {
		if got := a16Slot(s); got != slot {
			t.Errorf("slot of %s = %d, doc says %d", s, got, slot)
		}
	}
	keys := []struct {
		key     string
		crc     uint32
		p12, p3 int
	}{{"customer-42", 1241360405, 5, 2}, {"invoice-1042", 3214071541, 1, 1}, {"a", 3904355907, 3, 0}, {"café", 2561491637, 5, 2}}
	for _, k := range keys {
		if c := a16CRC32([]byte(k.key)); c != k.crc {
			t.Errorf("crc32(%q) = %d, doc says %d", k.key, c, k.crc)
		}
		if p := stream.PartitionOf(k.key, 12); p != k.p12 {
			t.Errorf("PartitionOf(%q, 12) = %d, want %d", k.key, p, k.p12)
		}
		if p := stream.PartitionOf(k.key, 3); p != k.p3 {
			t.Errorf("PartitionOf(%q, 3) = %d, want %d", k.key, p, k.p3)
		}
	}
}

// a16Names are odd but legal queue names: ':', spaces, unicode, control
// bytes, invalid UTF-8, glob characters, long names ('~' is refused: see
// TestAttack16_aclPatternIsolation).
func a16Names() []string {
	names := []string{"orders", "a", ":", "a:b:c", "with space",
		"tab\there", "nl\nx", "café", "日本語", "\x00nul", "\xff\xfe", "emoji🙂", "*", "?", "[a]", "\\", "%7C|", strings.Repeat("q", 5000),
		"12", "0", "-1", "orders}"[:6]}
	r := rand.New(rand.NewPCG(16, 16))
	for range 40 {
		b := make([]byte, 1+r.IntN(30))
		for i := range b {
			for {
				b[i] = byte(r.IntN(256))
				if b[i] != '{' && b[i] != '}' && b[i] != '~' {
					break
				}
			}
		}
		names = append(names, string(b))
	}
	return names
}

func TestAttack16_layoutIndependent(t *testing.T) {
	t.Parallel()
	ns := []int{1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 16, 24, 100, 127, 128, 1000, 1023, 1024}
	bigN := map[string]bool{"orders": true, "a:b:c": true, "\xff\xfe": true} // the costly counts, for a few names
	for _, q := range a16Names() {
		for _, n := range ns {
			if (len(q) > 100 && n > 16) || (n > 128 && !bigN[q]) {
				continue
			}
			got, err := stream.Partitions(q, n)
			if err != nil {
				t.Fatalf("Partitions(%q, %d): %v", q, n, err)
			}
			if len(got) != n {
				t.Fatalf("Partitions(%q, %d) has %d names", q, n, len(got))
			}
			seen := map[string]bool{}
			prev := -1
			for i, s := range got {
				if want := a16Partition(q, n, i); s != want {
					t.Fatalf("Partitions(%q, %d)[%d] = %q, own rule %q", q, n, i, s, want)
				}
				if seen[s] {
					t.Fatalf("Partitions(%q, %d): %q twice", q, n, s)
				}
				seen[s] = true
				slot := a16Slot(s)
				if slot < i*16384/n || slot >= (i+1)*16384/n || slot <= prev {
					t.Fatalf("Partitions(%q, %d)[%d] = %q has slot %d, outside its range", q, n, i, s, slot)
				}
				prev = slot
				if i%97 == 0 || i == n-1 {
					one, err := stream.PartitionStream(q, n, i)
					if err != nil || one != s {
						t.Fatalf("PartitionStream(%q, %d, %d) = %q, %v; want %q", q, n, i, one, err, s)
					}
					pq, pn, pi, ok := stream.ParsePartition(s)
					if !ok || pq != q || pn != n || pi != i {
						t.Fatalf("ParsePartition(%q) = %q, %d, %d, %v; want %q, %d, %d", s, pq, pn, pi, ok, q, n, i)
					}
					keys, err := stream.KeysFor(s)
					if err != nil {
						t.Fatalf("KeysFor(%q): %v", s, err)
					}
					for _, k := range []string{keys.Dead, keys.Delayed, keys.Once + "x", keys.Idem + "x", keys.Lock + "{x}", keys.Crashes + "g:j"} {
						if a16Slot(k) != slot {
							t.Fatalf("key %q of partition %q is in slot %d, not %d", k, s, a16Slot(k), slot)
						}
					}
				}
			}
		}
	}
}

func TestAttack16_parsePartitionLookalikes(t *testing.T) {
	real, _ := stream.PartitionStream("orders", 12, 0) // {orders~12~0~43}
	for _, s := range []string{
		"{orders~12~0~44}",     // not the smallest suffix (slot may still be in range)
		"{orders~12~0~043}",    // leading zero
		"{orders~12~0~+43}",    // sign
		"{orders~012~0~43}",    // leading zero in n
		"{orders~12~00~43}",    // leading zero in i
		"{orders~12~12~0}",     // i >= n
		"{orders~0~0~0}",       // n = 0
		"{orders~1025~0~0}",    // n > max
		"{orders~12~-1~0}",     // negative i
		"{orders~12~0~43}:dlq", // its dead-letter stream
		"{orders~12~0~43}x",
		"x{orders~12~0~43}",
		"orders~12~0~43",
		"{~12~0~43}",
		"{orders~12~0}",
		"{orders~12~0~43~}",
		"{orders~ 12~0~43}",
		"",
		"{}",
	} {
		if q, n, i, ok := stream.ParsePartition(s); ok {
			t.Errorf("ParsePartition(%q) = %q, %d, %d, true: not a partition name", s, q, n, i)
		}
	}
	// Every k below the smallest is also not a partition, whatever its slot.
	for k := range 43 {
		s := "{orders~12~0~" + strconv.Itoa(k) + "}"
		if _, _, _, ok := stream.ParsePartition(s); ok {
			t.Errorf("ParsePartition(%q) = ok, but %s is partition 0", s, real)
		}
	}
	// 1024 is allowed, 1025 is not.
	last, err := stream.PartitionStream("orders", 1024, 1023)
	if err != nil {
		t.Fatal(err)
	}
	if _, n, i, ok := stream.ParsePartition(last); !ok || n != 1024 || i != 1023 {
		t.Errorf("ParsePartition(%q) = %d %d %v", last, n, i, ok)
	}
}

func TestAttack16_layoutRejects(t *testing.T) {
	cases := []struct {
		q    string
		n, i int
		word string
	}{
		{"", 12, 0, "queue"}, {"a{b", 12, 0, "queue"}, {"a}b", 12, 0, "queue"}, {"{a}", 12, 0, "queue"},
		{"orders", 0, 0, "n"}, {"orders", -1, 0, "n"}, {"orders", 1025, 0, "n"}, {"orders", 1 << 40, 0, "n"},
	}
	for _, c := range cases {
		if got, err := stream.Partitions(c.q, c.n); err == nil {
			t.Errorf("Partitions(%q, %d) = %v, nil: want an error", c.q, c.n, got)
		}
		if got, err := stream.PartitionStream(c.q, c.n, c.i); err == nil {
			t.Errorf("PartitionStream(%q, %d, %d) = %q, nil: want an error", c.q, c.n, c.i, got)
		}
	}
	for _, i := range []int{-1, 12, 13, 1 << 40} {
		if got, err := stream.PartitionStream("orders", 12, i); err == nil {
			t.Errorf("PartitionStream(orders, 12, %d) = %q, nil: want an error", i, got)
		}
	}
}

func TestAttack16_partitionOfIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ns := []int{2, 3, 5, 7, 12, 13, 24, 100, 1000, 1023, 1024, 1 << 20, 1 << 31}
	high := 0
	for range 20000 {
		b := make([]byte, r.IntN(40))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		key := string(b)
		c := a16CRC32(b)
		if c >= 1<<31 {
			high++
		}
		for _, n := range ns {
			if got, want := stream.PartitionOf(key, n), int(uint64(c)%uint64(n)); got != want {
				t.Fatalf("PartitionOf(%q, %d) = %d, want crc32 %d mod n = %d", key, n, got, c, want)
			}
		}
		for _, n := range []int{1, 0, -1, -12} {
			if got := stream.PartitionOf(key, n); got != 0 {
				t.Fatalf("PartitionOf(%q, %d) = %d, want 0", key, n, got)
			}
		}
	}
	if high < 1000 {
		t.Fatalf("only %d keys with crc32 >= 2^31: the test checked too little", high)
	}
}

// TestAttack16_partitionOfHugeN: PartitionOf is documented as crc32(key)
// mod n, 0 for n below 2, with no upper bound on n.
func TestAttack16_partitionOfHugeN(t *testing.T) {
	for _, n := range []int{1 << 32, 1<<32 + 5, 1 << 33} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("PartitionOf(a, %d) panicked: %v", n, r)
				}
			}()
			if got, want := stream.PartitionOf("a", n), int(uint64(a16CRC32([]byte("a")))%uint64(n)); got != want {
				t.Errorf("PartitionOf(a, %d) = %d, want %d", n, got, want)
			}
		}()
	}
}

func a16Producer(t *testing.T, cfg stream.PartitionedProducerConfig) (*stream.PartitionedProducer, *redis.Client) {
	t.Helper()
	rdb := redistest.Shared(t)
	if cfg.Queue == "" {
		cfg.Queue = redistest.Name(t)
	}
	p, err := stream.NewPartitionedProducer(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range p.Streams() {
			redistest.DeleteKeys(rdb, s)
			redistest.DeleteKeys(rdb, s+":*")
		}
	})
	return p, rdb
}

// entries returns, per stream, the job_id fields of its entries, by entry ID.
func a16Entries(t *testing.T, rdb *redis.Client, streams []string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, s := range streams {
		msgs, err := rdb.XRange(context.Background(), s, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		out[s] = map[string]string{}
		for _, m := range msgs {
			id, _ := m.Values[stream.FieldJobID].(string)
			out[s][m.ID] = id
		}
	}
	return out
}

func TestAttack16_routeKeyedAndKeyless(t *testing.T) {
	p, _ := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 7})
	for _, k := range []string{"customer-42", "café", "", "x"} {
		j := &stream.Job{Type: "t", IdempotencyKey: k}
		if k == "" {
			continue
		}
		for range 5 {
			if got := p.Route(j); got != stream.PartitionOf(k, 7) {
				t.Fatalf("Route of key %q = %d, want %d", k, got, stream.PartitionOf(k, 7))
			}
		}
	}
	// Keyless: a job routes by its job ID (docs: the same job always to the
	// same partition), and keyless jobs spread evenly. (The outside test
	// first checked round robin, as the docs then said; routing by ID is
	// what fixed TestAttack16_rescheduleKeyless.)
	for i := range 50 {
		j := &stream.Job{Type: "t", ID: "job-" + strconv.Itoa(i)}
		if got, want := p.Route(j), stream.PartitionOf(j.ID, 7); got != want || p.Route(j) != got {
			t.Fatalf("keyless job %s routed to %d, want %d every time", j.ID, got, want)
		}
	}
	counts := make([]int, 7)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]int, 7)
			for range 7 * 250 {
				j := &stream.Job{Type: "t"}
				local[p.Route(j)]++
				if j.ID == "" {
					t.Error("Route left a keyless job without an ID")
				}
			}
			mu.Lock()
			for i, c := range local {
				counts[i] += c
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i, c := range counts {
		if c < 8*250*6/10 || c > 8*250*14/10 {
			t.Fatalf("keyless jobs: partition %d got %d of %d, want about %d (%v)", i, c, 8*7*250, 8*250, counts)
		}
	}
}

// TestAttack16_batchScatterGather sends one batch of mixed keyed and
// keyless jobs over 12 partitions and checks that ids[i] is the entry of
// jobs[i], in the partition its key routes to, each job exactly once.
func TestAttack16_batchScatterGather(t *testing.T) {
	p, rdb := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 12})
	ctx := context.Background()
	var jobs []*stream.Job
	for i := range 1500 {
		j := &stream.Job{ID: "job-" + strconv.Itoa(i), Type: "t", Payload: []byte(`{}`)}
		if i%3 != 0 {
			j.IdempotencyKey = "key-" + strconv.Itoa(i%200) + "-" + strconv.Itoa(i)
		}
		jobs = append(jobs, j)
	}
	ids, err := p.EnqueueBatch(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(jobs) {
		t.Fatalf("%d ids for %d jobs", len(ids), len(jobs))
	}
	ents := a16Entries(t, rdb, p.Streams())
	total := 0
	where := map[string]string{}
	for s, m := range ents {
		total += len(m)
		for eid, jid := range m {
			if w, dup := where[jid]; dup {
				t.Fatalf("job %s twice: %s and %s", jid, w, s)
			}
			where[jid] = s + " " + eid
		}
	}
	if total != len(jobs) {
		t.Fatalf("%d entries for %d jobs", total, len(jobs))
	}
	perPart := map[string]int{}
	for i, j := range jobs {
		w := where[j.ID]
		s, eid, _ := strings.Cut(w, " ")
		if eid != ids[i] {
			t.Fatalf("ids[%d] = %s, but job %s is entry %s", i, ids[i], j.ID, w)
		}
		if j.IdempotencyKey != "" && s != p.Streams()[stream.PartitionOf(j.IdempotencyKey, 12)] {
			t.Fatalf("job %s of key %q in %s, want partition %d", j.ID, j.IdempotencyKey, s, stream.PartitionOf(j.IdempotencyKey, 12))
		}
		if j.IdempotencyKey == "" {
			perPart[s]++
		}
	}
	for _, s := range p.Streams() {
		if perPart[s] < 500/12*4/10 || perPart[s] > 500/12*16/10 {
			t.Errorf("keyless jobs of one batch are not spread: %s got %d of 500, want about %d", s, perPart[s], 500/12)
		}
	}
}

// TestAttack16_batchPartitionOfKeyless checks the EnqueueBatch doc: "its
// partition is Streams()[Route]" for every job, keyless ones included.
func TestAttack16_batchPartitionOfKeyless(t *testing.T) {
	p, rdb := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 4})
	var jobs []*stream.Job
	for i := range 5 { // not a multiple of the partition count
		jobs = append(jobs, &stream.Job{ID: "kl-" + strconv.Itoa(i), Type: "t"})
	}
	ids, err := p.EnqueueBatch(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	ents := a16Entries(t, rdb, p.Streams())
	for i, j := range jobs {
		s := p.Streams()[p.Route(j)]
		if ents[s][ids[i]] != j.ID {
			t.Errorf("job %s (entry %s): not in Streams()[Route] = %s", j.ID, ids[i], s)
		}
	}
}

// TestAttack16_enqueueOnceAcrossPartitions: with EnqueueOnce and the
// default key, a job of one idempotency key is added once whoever sends
// it, by Enqueue, EnqueueBatch (duplicates inside the batch and across
// batches, many partitions) or a second producer, and every duplicate gets
// the first job's IDs.
func TestAttack16_enqueueOnceAcrossPartitions(t *testing.T) {
	queue := redistest.Name(t)
	cfg := stream.PartitionedProducerConfig{Queue: queue, Partitions: 12, Producer: stream.ProducerConfig{EnqueueOnce: time.Minute}}
	p1, rdb := a16Producer(t, cfg)
	p2, err := stream.NewPartitionedProducer(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := map[string][2]string{} // key -> job id, entry id
	for i := range 60 {
		k := "ik-" + strconv.Itoa(i)
		j := &stream.Job{Type: "t", IdempotencyKey: k}
		s, id, err := p1.Enqueue(ctx, j)
		if err != nil || id == "" || s != p1.Streams()[stream.PartitionOf(k, 12)] {
			t.Fatalf("Enqueue %s: %s %s %v", k, s, id, err)
		}
		first[k] = [2]string{j.ID, id}
	}
	var batch []*stream.Job
	for r := range 3 {
		for i := range 90 { // 60 known keys and 30 new ones, each new key three times in the batch
			batch = append(batch, &stream.Job{Type: "t", IdempotencyKey: "ik-" + strconv.Itoa(i), ID: fmt.Sprintf("dup-%d-%d", r, i)})
		}
	}
	ids, err := p2.EnqueueBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := range batch {
		if f, ok := first[j.IdempotencyKey]; ok {
			if j.ID != f[0] || ids[i] != f[1] {
				t.Fatalf("duplicate %d of %s: job %s entry %s, want the first's %s %s", i, j.IdempotencyKey, j.ID, ids[i], f[0], f[1])
			}
		} else {
			first[j.IdempotencyKey] = [2]string{j.ID, ids[i]}
		}
	}
	ents := a16Entries(t, rdb, p1.Streams())
	n := 0
	for _, m := range ents {
		n += len(m)
	}
	if n != 90 {
		t.Fatalf("%d entries over the partitions, want 90 (one per key)", n)
	}
}

// TestAttack16_onceKeyNotRouted: ProducerConfig.OnceKey is "the key a job
// is enqueued once by", and PartitionedProducer says enqueue once holds per
// partition. A job whose once key is set but which has no idempotency key
// goes round robin, so each repeat lands in another partition and is added
// again: enqueue-once silently stops working, with no validation error.
func TestAttack16_onceKeyNotRouted(t *testing.T) {
	p, rdb := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 4, Producer: stream.ProducerConfig{
		EnqueueOnce: time.Minute,
		OnceKey:     func(j *stream.Job) string { return j.Headers["row"] },
	}})
	ctx := context.Background()
	for range 4 {
		if _, _, err := p.Enqueue(ctx, &stream.Job{Type: "t", Headers: map[string]string{"row": "42"}}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for _, m := range a16Entries(t, rdb, p.Streams()) {
		n += len(m)
	}
	if n != 1 {
		t.Fatalf("the job of once key 42 was added %d times, want once", n)
	}
}

// TestAttack16_rescheduleKeyless: "Scheduling the same job (same ID and
// fields) again moves its time instead of adding a copy" holds for a
// Producer; through a PartitionedProducer a keyless job scheduled again goes
// to the next partition, and a copy is added.
func TestAttack16_rescheduleKeyless(t *testing.T) {
	p, rdb := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 4})
	ctx := context.Background()
	for range 3 {
		j := &stream.Job{ID: "sched-1", Type: "t", Payload: []byte(`{}`)}
		if _, err := p.EnqueueIn(ctx, j, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	var n int64
	for _, s := range p.Streams() {
		k, _ := stream.KeysFor(s)
		c, err := rdb.ZCard(ctx, k.Delayed).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += c
	}
	if n != 1 {
		t.Fatalf("job sched-1 scheduled 3 times is in the delayed sets %d times, want once (its time moved)", n)
	}
}

// TestAttack16_rescheduleKeyed: the same with a key: one copy, time moved.
func TestAttack16_rescheduleKeyed(t *testing.T) {
	p, rdb := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 4})
	ctx := context.Background()
	var s string
	for i := range 3 {
		j := &stream.Job{ID: "sched-2", Type: "t", IdempotencyKey: "k2", Payload: []byte(`{}`)}
		got, err := p.EnqueueIn(ctx, j, time.Duration(i+1)*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if s != "" && got != s {
			t.Fatalf("keyed job scheduled on %s then %s", s, got)
		}
		s = got
	}
	k, _ := stream.KeysFor(s)
	zs, err := rdb.ZRangeWithScores(ctx, k.Delayed, 0, -1).Result()
	if err != nil || len(zs) != 1 {
		t.Fatalf("delayed set of %s: %v %v, want one member", s, zs, err)
	}
}

func TestAttack16_validation(t *testing.T) {
	rdb := redistest.Shared(t)
	cases := []struct {
		cfg  stream.PartitionedProducerConfig
		word string
	}{
		{stream.PartitionedProducerConfig{Partitions: 3}, "Queue"},
		{stream.PartitionedProducerConfig{Queue: "a{b", Partitions: 3}, "Queue"},
		{stream.PartitionedProducerConfig{Queue: "a}", Partitions: 3}, "Queue"},
		{stream.PartitionedProducerConfig{Queue: "q~x", Partitions: 3}, "Queue"},
		{stream.PartitionedProducerConfig{Queue: "q"}, "Partitions"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: -2}, "Partitions"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 1025}, "Partitions"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{Stream: "x"}}, "Stream"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{EnqueueOnce: -time.Second}}, "EnqueueOnce"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{EnqueueOnce: time.Microsecond}}, "EnqueueOnce"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{EnqueueOnce: time.Second, OnceNamespace: "dlq"}}, "OnceNamespace"},
		{stream.PartitionedProducerConfig{Queue: "q", Partitions: 3, Producer: stream.ProducerConfig{OnceNamespace: "a b"}}, "OnceNamespace"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.word) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", c.cfg, err, c.word)
		}
		if p, err2 := stream.NewPartitionedProducer(rdb, c.cfg); err2 == nil || p != nil {
			t.Errorf("NewPartitionedProducer(%+v) = %v, %v; want nil and an error", c.cfg, p, err2)
		}
	}
	for _, n := range []int{1, 1024} {
		if err := (stream.PartitionedProducerConfig{Queue: "q:x", Partitions: n}).Validate(); err != nil {
			t.Errorf("Partitions %d: %v", n, err)
		}
	}
}

// TestAttack16_badJobs: a nil job, a job without a type, a batch with a nil
// job: an error (no panic), and nothing of the bad batch half-added.
func TestAttack16_badJobs(t *testing.T) {
	p, rdb := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 3})
	ctx := context.Background()
	call := func(name string, f func() error) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%s panicked: %v", name, r)
			}
		}()
		if err := f(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	call("Enqueue(nil)", func() error { _, _, err := p.Enqueue(ctx, nil); return err })
	call("Enqueue(no type)", func() error { _, _, err := p.Enqueue(ctx, &stream.Job{}); return err })
	call("EnqueueIn(nil)", func() error { _, err := p.EnqueueIn(ctx, nil, time.Second); return err })
	call("EnqueueAt(nil)", func() error { _, err := p.EnqueueAt(ctx, nil, time.Now()); return err })
	call("EnqueueBatch(nil job)", func() error {
		_, err := p.EnqueueBatch(ctx, []*stream.Job{{Type: "t"}, nil, {Type: "t", IdempotencyKey: "x"}})
		return err
	})
	ids, err := p.EnqueueBatch(ctx, nil)
	if err != nil || len(ids) != 0 {
		t.Errorf("EnqueueBatch(empty) = %v, %v", ids, err)
	}
	_ = rdb
}

// TestAttack16_routeNil: Enqueue(nil) is an error, Route(nil) a panic.
func TestAttack16_routeNil(t *testing.T) {
	p, _ := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 3})
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("Route(nil) panicked: %v", r)
		}
	}()
	p.Route(nil)
}

// TestAttack16_cancelledBatch: a batch whose context is already cancelled
// adds nothing and reports every job as not added.
func TestAttack16_cancelledBatch(t *testing.T) {
	p, rdb := a16Producer(t, stream.PartitionedProducerConfig{Partitions: 6})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var jobs []*stream.Job
	for i := range 60 {
		jobs = append(jobs, &stream.Job{Type: "t", IdempotencyKey: "c" + strconv.Itoa(i)})
	}
	ids, err := p.EnqueueBatch(ctx, jobs)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("EnqueueBatch with a cancelled context: %v", err)
	}
	for i, id := range ids {
		if id != "" {
			t.Errorf("job %d has id %s after a cancelled batch", i, id)
		}
	}
	for s, m := range a16Entries(t, rdb, p.Streams()) {
		if len(m) != 0 {
			t.Errorf("%s has %d entries after a cancelled batch", s, len(m))
		}
	}
}

// TestAttack16_aclPatternIsolation: scaling.md gives "~{orders~*" as the ACL
// pattern of queue orders's partitions. It is exact because '~' appears in
// no stream name but a partition's: a queue named "orders~eu" (partitioned
// or not, or as a hash tag) is refused, naming the field, so no other
// queue's keys start with "{orders~"; the pattern still grants every key of
// orders's partitions and denies those of the neighbouring queue
// "orders-eu".
func TestAttack16_aclPatternIsolation(t *testing.T) {
	if err := (stream.PartitionedProducerConfig{Queue: "orders~eu", Partitions: 12}).Validate(); err == nil || !strings.Contains(err.Error(), "PartitionedProducerConfig.Queue") || !strings.Contains(err.Error(), "'~'") {
		t.Errorf("partitioned queue orders~eu: Validate() = %v, want an error naming Queue and '~'", err)
	}
	if err := (stream.ProducerConfig{Stream: "orders~eu"}).Validate(); err == nil || !strings.Contains(err.Error(), "ProducerConfig.Stream") {
		t.Errorf("stream orders~eu: Validate() = %v, want an error naming Stream", err)
	}
	for _, name := range []string{"orders~eu", "{orders~eu}:jobs", "{orders~eu~12~0~43}", "{orders~12~0}"} {
		if k, err := stream.KeysFor(name); err == nil {
			t.Errorf("KeysFor(%q) = %v, want an error: its keys would start with {orders~", name, k.Dead)
		}
	}
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	ctx := context.Background()
	if err := rdb.Do(ctx, "ACL", "SETUSER", "ord", "on", ">pw", "~{orders~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	dryrun := func(key string) bool {
		r, err := rdb.Do(ctx, "ACL", "DRYRUN", "ord", "XADD", key, "*", "type", "t").Text()
		return err == nil && r == "OK"
	}
	for i := range 12 {
		mine, err := stream.PartitionStream("orders", 12, i)
		if err != nil {
			t.Fatal(err)
		}
		k, err := stream.KeysFor(mine)
		if err != nil {
			t.Fatalf("KeysFor(%s): %v", mine, err)
		}
		for _, key := range []string{mine, k.Dead, k.Delayed, k.Once + "x", k.Lock + "{x}"} {
			if !dryrun(key) {
				t.Errorf("the pattern does not cover %s, a key of queue orders", key)
			}
		}
	}
	other, _ := stream.PartitionStream("orders-eu", 12, 0)
	plain, _ := stream.KeysFor("orders-eu")
	for _, k := range []string{other, plain.Stream, plain.Dead} {
		if dryrun(k) {
			t.Errorf("the ACL pattern of queue orders grants %s, a key of queue orders-eu", k)
		}
	}
}
