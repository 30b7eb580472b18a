package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// blockedReads returns the connections named name that are blocked in
// XREADGROUP on the server admin talks to.
func blockedReads(t *testing.T, admin redis.Cmdable, name string) int {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		f := " " + line + " "
		if strings.Contains(f, " name="+name+" ") && strings.Contains(f, " cmd=xreadgroup ") && strings.Contains(f, " flags=b ") {
			n++
		}
	}
	return n
}

// countJobs returns a handler that counts its jobs per payload.
func countJobs(mu *sync.Mutex, done map[string]int) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		mu.Lock()
		done[string(job.Payload)]++
		mu.Unlock()
		return nil
	})
}

// TestPool_sharedRead: five queues of one group and consumer name are read
// by one blocking XREADGROUP: one connection blocked, never more, and every
// queue's jobs run.
func TestPool_sharedRead(t *testing.T) {
	t.Parallel()
	admin := redistest.Shared(t)
	prefix := "{" + redistest.Prefix(t, admin) + "}"
	name := strings.NewReplacer(":", "-", "{", "", "}", "").Replace(redistest.Name(t))
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(), ClientName: name})
	t.Cleanup(func() { _ = rdb.Close() })
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 10})
	var mu sync.Mutex
	done := map[string]int{}
	var qs []*consumer.Queue
	for i := range 5 {
		cfg := poolConfig(fmt.Sprintf("%s:q%d", prefix, i))
		cfg.Block = 2 * time.Second
		qs = append(qs, p.Add(cfg, consumer.QueueOptions{}).Handle(countJobs(&mu, done)))
	}
	stop := runPool(t, p)
	waitFor(t, 20*time.Second, "a blocked read", func() bool { return blockedReads(t, admin, name) >= 1 })
	for range 20 {
		if n := blockedReads(t, admin, name); n > 1 {
			t.Fatalf("%d connections blocked in XREADGROUP, want 1 for 5 queues of one read group", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, q := range qs {
		poolFill(t, rdb, q.Stream(), 20)
	}
	waitFor(t, 20*time.Second, "every job done", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == 100
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for k, n := range done {
		if n != 1 {
			t.Errorf("job %s done %d times", k, n)
		}
	}
}

// TestPool_sharedReadRoom: a queue left out of the shared read (no room)
// whose backlog waits is read as soon as it gets room, not when the other
// queue's blocking read times out.
// On miniredis (no CLIENT ID, so no CLIENT UNBLOCK) the shared read's
// block is bounded instead.
func TestPool_sharedReadRoom(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Shared(t)
		sharedReadRoom(t, rdb, "{"+redistest.Prefix(t, rdb)+"}")
	})
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		sharedReadRoom(t, rdb, "{room}")
	})
}

func sharedReadRoom(t *testing.T, rdb *redis.Client, prefix string) {
	const block = 20 * time.Second
	cfg := func(s string) consumer.Config {
		c := poolConfig(prefix + s)
		c.Block, c.VisibilityTimeout, c.SweepInterval = block, 3*block, 3*block
		c.Prefetch = -1 // room for the running job only
		return c
	}
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 2})
	release := make(chan struct{})
	started := make(chan time.Time, 10)
	full := p.Add(cfg(":full"), consumer.QueueOptions{Max: 1}).Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		started <- time.Now()
		if string(job.Payload) == prefix+":full/0" {
			<-release
		}
		return nil
	}))
	p.Add(cfg(":idle"), consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	poolFill(t, rdb, full.Stream(), 1)
	stop := runPool(t, p)
	recv(t, started, 20*time.Second, "the first job")
	waitFor(t, 20*time.Second, "both queues ready", func() bool { return p.Health().Ready })
	// The backlog arrives while the full queue has no room: the shared read
	// blocks on the idle stream alone.
	poolFill(t, rdb, full.Stream(), 1)
	time.Sleep(100 * time.Millisecond) // let the read block; its end is block away
	at := time.Now()
	close(release)
	second := recv(t, started, 2*block, "the backlog's job")
	wait := second.Sub(at)
	t.Logf("backlog picked up %v after the queue got room (Block %v)", wait, block)
	if wait >= block/2 {
		t.Errorf("backlog picked up %v after the queue got room: it waited for the shared read's block (%v)", wait, block)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPool_sharedReadNoGroup: a stream deleted, or its group destroyed,
// under the shared read fails only its own queue's read: the queue
// recreates its group and runs its next job, and the other queue never
// sees a read error.
func TestPool_sharedReadNoGroup(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"destroy", "del"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			prefix := "{" + redistest.Prefix(t, rdb) + "}"
			p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
			var mu sync.Mutex
			done := map[string]int{}
			cfg := func(s string) consumer.Config {
				c := poolConfig(prefix + s)
				c.Block = 2 * time.Second
				return c
			}
			broken := p.Add(cfg(":broken"), consumer.QueueOptions{}).Handle(countJobs(&mu, done))
			other := p.Add(cfg(":other"), consumer.QueueOptions{}).Handle(countJobs(&mu, done))
			stop := runPool(t, p)
			waitFor(t, 20*time.Second, "the pool ready", func() bool { return p.Health().Ready })
			ctx := context.Background()
			var err error
			if how == "destroy" {
				err = rdb.XGroupDestroy(ctx, broken.Stream(), "g").Err()
			} else {
				err = rdb.Del(ctx, broken.Stream()).Err()
			}
			if err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			poolFill(t, rdb, other.Stream(), 1)
			waitFor(t, 20*time.Second, "the other queue's job", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return done[other.Stream()+"/0"] == 1
			})
			waitFor(t, 20*time.Second, "the group recreated", func() bool {
				g, err := rdb.XInfoGroups(ctx, broken.Stream()).Result()
				return err == nil && len(g) == 1
			})
			poolFill(t, rdb, broken.Stream(), 1)
			waitFor(t, 20*time.Second, "the broken queue's next job", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return done[broken.Stream()+"/0"] == 1
			})
			if n := other.Stats().ReadErrors; n != 0 {
				t.Errorf("the other queue saw %d read errors, want 0", n)
			}
			if n := broken.Stats().ReadErrors; n == 0 {
				t.Errorf("the broken queue saw no read error: was its stream's NOGROUP seen at all?")
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}

// TestPool_clusterSharedTag: on a cluster, queues whose streams share a
// hash tag are read by one blocking read on their master, and queues on
// other slots by reads of their own.
func TestPool_clusterSharedTag(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.ClientName = "pooltag" })
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 6})
	var mu sync.Mutex
	done := map[string]int{}
	var qs []*consumer.Queue
	streams := []string{"{tag}:a", "{tag}:b", "{tag}:c", "{other}:d"}
	for _, s := range streams {
		cfg := poolConfig(s)
		cfg.Block = 2 * time.Second
		qs = append(qs, p.Add(cfg, consumer.QueueOptions{}).Handle(countJobs(&mu, done)))
	}
	stop := runPool(t, p)
	ctx := context.Background()
	node, err := rdb.MasterForKey(ctx, "{tag}:a")
	if err != nil {
		t.Fatalf("MasterForKey: %v", err)
	}
	otherNode, err := rdb.MasterForKey(ctx, "{other}:d")
	if err != nil {
		t.Fatalf("MasterForKey: %v", err)
	}
	want := 1
	if otherNode.Options().Addr == node.Options().Addr {
		want = 2 // {other} is on this master too, in another slot: a read of its own
	}
	waitFor(t, 30*time.Second, "the tag's read blocked", func() bool { return blockedReads(t, node, "pooltag") >= want })
	for range 20 {
		if n := blockedReads(t, node, "pooltag"); n > want {
			t.Fatalf("%d connections blocked in XREADGROUP on the {tag} master, want %d (slots %d and %d)", n, want, keyslot.Of("{tag}"), keyslot.Of("{other}"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, q := range qs {
		poolFill(t, rdb, q.Stream(), 50)
	}
	waitFor(t, 30*time.Second, "every job done", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == 200
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for k, n := range done {
		if n != 1 {
			t.Errorf("job %s done %d times", k, n)
		}
	}
}

// TestPool_sharedReadIdle: idle queues of one read group cost one read per
// Block together, not one each (nor an interrupt each).
func TestPool_sharedReadIdle(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 10})
	const queues, block, window = 5, 200 * time.Millisecond, 2 * time.Second
	for i := range queues {
		cfg := poolConfig(fmt.Sprintf("{idle}:q%d", i))
		cfg.Block = block
		p.Add(cfg, consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	}
	runPool(t, p)
	ctx := context.Background()
	waitFor(t, 20*time.Second, "the pool ready", func() bool { return p.Health().Ready })
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
	start := time.Now()
	time.Sleep(window) // the window measured, not a wait for a condition
	info, err := rdb.Info(ctx, "commandstats").Result()
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	calls := func(cmd string) int {
		_, rest, ok := strings.Cut(info, "cmdstat_"+cmd+":calls=")
		if !ok {
			return 0
		}
		n := 0
		for _, c := range rest {
			if c < '0' || c > '9' {
				break
			}
			n = 10*n + int(c-'0')
		}
		return n
	}
	reads, unblocks := calls("xreadgroup"), calls("client|unblock")
	t.Logf("%d idle queues, Block %v, %v: %d XREADGROUP, %d CLIENT UNBLOCK", queues, block, elapsed, reads, unblocks)
	// Unshared, each queue reads once per Block (46 reads measured);
	// shared, about one read per Block for all, plus one after each
	// interrupt: a queue due for its sweep ends the shared read (6 to 9
	// interrupts and 13 to 20 reads measured quiet, 11 and 25 beside busy
	// loops), so the reads the Block timed are the reads less the
	// interrupts.
	alone := queues * int(elapsed/block)
	if timed := reads - unblocks; timed >= alone/2 {
		t.Errorf("%d reads (%d after an interrupt) in %v: about one per queue per Block (%d), want them shared", reads, unblocks, elapsed, alone)
	}
	if unblocks >= alone/2 {
		t.Errorf("%d interrupts in %v: about one per queue per Block (%d), want them rare", unblocks, elapsed, alone)
	}
}

// TestPool_clusterSlotMove: the slot of a read group's streams moves to
// another master while the shared read blocks on the old one; the read
// group reads on the new master and runs every job, enqueued before and
// after the move, once.
func TestPool_clusterSlotMove(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.ClientName = "poolmove" })
	ctx := context.Background()
	streams := []string{"{move}:a", "{move}:b"}
	slot := keyslot.Of(streams[0])
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4})
	var mu sync.Mutex
	done := map[string]int{}
	var qs []*consumer.Queue
	for _, s := range streams {
		cfg := poolConfig(s)
		cfg.Block = 2 * time.Second
		qs = append(qs, p.Add(cfg, consumer.QueueOptions{}).Handle(countJobs(&mu, done)))
	}
	for _, q := range qs {
		poolFill(t, rdb, q.Stream(), 20)
	}
	runPool(t, p)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(done)
	}
	waitFor(t, 30*time.Second, "the jobs before the move", func() bool { return count() == 40 })

	src, err := rdb.MasterForKey(ctx, streams[0])
	if err != nil {
		t.Fatalf("MasterForKey: %v", err)
	}
	nodes, err := redistest.ClusterNodes(cl.Masters()[0])
	if err != nil {
		t.Fatalf("CLUSTER NODES: %v", err)
	}
	var srcID, dstID, dstAddr string
	for _, n := range nodes {
		switch {
		case !n.Is("master"):
		case n.Addr == src.Options().Addr:
			srcID = n.ID
		case dstID == "":
			dstID, dstAddr = n.ID, n.Addr
		}
	}
	dst := redis.NewClient(&redis.Options{Addr: dstAddr})
	t.Cleanup(func() { _ = dst.Close() })
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("IMPORTING", dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must("MIGRATING", src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	must("GETKEYSINSLOT", err)
	host, port, _ := strings.Cut(dstAddr, ":")
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	must("MIGRATE", src.Do(ctx, args...).Err())
	for _, m := range cl.Masters() {
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		must("SETSLOT NODE", c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
		_ = c.Close()
	}
	for _, q := range qs {
		prod := stream.NewProducer(rdb, stream.ProducerConfig{Stream: q.Stream()})
		for i := range 20 {
			if _, err := prod.Enqueue(ctx, &stream.Job{Type: "t", Payload: fmt.Appendf(nil, "%s/after%d", q.Stream(), i)}); err != nil {
				t.Fatalf("Enqueue after the move: %v", err)
			}
		}
	}
	waitFor(t, 60*time.Second, "the jobs after the move", func() bool { return count() == 80 })
	waitFor(t, 30*time.Second, "the shared read blocked on the new master", func() bool { return blockedReads(t, dst, "poolmove") == 1 })
	mu.Lock()
	defer mu.Unlock()
	for k, n := range done {
		if n != 1 {
			t.Errorf("job %s done %d times", k, n)
		}
	}
}
