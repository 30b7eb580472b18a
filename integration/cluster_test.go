package integration

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/periodic"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/claim"
	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// TestCluster runs Pelican against a real 3-master Redis Cluster: three
// queues, each on its own master, go through enqueue, processing, retry,
// dead-lettering, reclaim, idle-consumer reaping, heartbeats, trimming and
// shutdown, all through a *redis.ClusterClient. Every command the client
// sends is watched (at the cluster level and on every node connection):
// none may fail with CROSSSLOT or a "non local key" error, and every
// embedded Lua script of the repository must have run, with keys of one
// slot owned by the node that ran it, on every master.
func TestCluster(t *testing.T) {
	t.Parallel() // its own redis-server (or cluster) and subprocesses
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client(t)
	watch := clusterWatch(cc)
	ctx := t.Context()

	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	masters := make(map[string]bool)
	for _, s := range slots {
		masters[s.Nodes[0].Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("CLUSTER SLOTS names %d masters (%v), want 3", len(masters), slots)
	}
	// masterOf returns the address of the master serving slot, or "". The
	// hooks call it from the consumers' goroutines.
	masterOf := func(slot int) string {
		for _, s := range slots {
			if s.Start <= slot && slot <= s.End {
				return s.Nodes[0].Addr
			}
		}
		return ""
	}
	watch.setMasterOf(masterOf)

	// Two plain names, whose derived keys get a hash tag ("orders" →
	// "{orders}:dlq"), and one hash-tagged name, whose derived keys keep it
	// ("{billing}:invoices:dlq"): slots 105, 8507 and 12682, one in each
	// third of the slots that redis-cli gives each master. ("{shop}:emails",
	// slot 3808, would share the first master with "orders".)
	names := []string{"orders", "payments", "{billing}:invoices"}
	onNode := make(map[string]string) // master address -> stream
	for _, name := range names {
		keys, err := stream.KeysFor(name)
		if err != nil {
			t.Fatal(err)
		}
		slot := keyslot.Of(name)
		for _, k := range []string{keys.Stream, keys.Dead, keys.Delayed, keys.Crashes + "1-0",
			keys.Idem + "k", keys.Lock + "{k}", keys.Rate + "k", keys.Limit + "k", keys.Paused, keys.Control} {
			if got := keyslot.Of(k); got != slot {
				t.Errorf("keyslot.Of(%q) = %d, want the stream's slot %d", k, got, slot)
			}
			srv, err := cc.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
			}
			if int(srv) != slot {
				t.Errorf("CLUSTER KEYSLOT %s = %d, keyslot.Of = %d", k, srv, slot)
			}
		}
		addr := masterOf(slot)
		if addr == "" {
			t.Fatalf("slot %d of %q is served by no master in CLUSTER SLOTS %v", slot, name, slots)
		}
		if other, dup := onNode[addr]; dup {
			t.Fatalf("streams %q and %q are both on master %s; pick names on distinct masters", other, name, addr)
		}
		onNode[addr] = name
		t.Logf("stream %q: slot %d, master %s, dead-letter %q, delayed %q", name, slot, addr, keys.Dead, keys.Delayed)
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("queues", func(t *testing.T) {
		for _, name := range names {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				clusterQueue(t, cc, name, masterOf(keyslot.Of(name)), cl.Addrs())
				clusterDLQ(t, cc, name)
				clusterDashboard(t, cc, name)
				clusterMiddleware(t, cc, name)
				clusterControl(t, cc, name)
				clusterPeriodic(t, cc, name)
				clusterLookup(t, cc, name)
			})
		}
		t.Run("shutdown", func(t *testing.T) {
			t.Parallel()
			clusterShutdown(t, cc, "{idle}:jobs")
		})
	})

	watch.check(t, cl.Addrs())
}

// clusterQueue checks one queue, on the master at addr, end to end.
func clusterQueue(t *testing.T, cc *redis.ClusterClient, name, addr string, all []string) {
	ctx := t.Context()
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	const (
		group      = "workers"
		visibility = time.Second
		block      = 300 * time.Millisecond
		nBatch     = 20
	)

	// The group exists before the consumer starts, so that "ghost" can take
	// an entry and die with it pending.
	clusterMust(t, "XGROUP CREATE", cc.XGroupCreateMkStream(ctx, name, group, "0").Err())
	// EnqueueOnce: the batch goes through the enqueue-once script on each master.
	prod := stream.NewProducer(cc, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
	ghost := &stream.Job{Type: "ok", Payload: []byte(`{"who":"ghost"}`)}
	ghostEntry, err := prod.Enqueue(ctx, ghost)
	clusterMust(t, "Enqueue ghost job", err)
	res, err := cc.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "ghost", Streams: []string{name, ">"}, Count: 1, Block: -1,
	}).Result()
	clusterMust(t, "XREADGROUP as ghost", err)
	if len(res) != 1 || len(res[0].Messages) != 1 || res[0].Messages[0].ID != ghostEntry {
		t.Fatalf("ghost read %v, want entry %s", res, ghostEntry)
	}

	batch := make([]*stream.Job, nBatch)
	for i := range batch {
		batch[i] = &stream.Job{Type: "ok", Payload: []byte(`{"i":` + strconv.Itoa(i) + `}`)}
	}
	batchIDs, err := prod.EnqueueBatch(ctx, batch)
	clusterMust(t, "EnqueueBatch", err)
	if len(batchIDs) != nBatch || slices.Contains(batchIDs, "") {
		t.Fatalf("EnqueueBatch IDs = %v", batchIDs)
	}
	single := &stream.Job{Type: "ok", Payload: []byte(`{}`)}
	retry := &stream.Job{Type: "retry", Payload: []byte(`{}`)}
	dead := &stream.Job{Type: "dead", Payload: []byte(`{}`)}
	slow := &stream.Job{Type: "slow", Payload: []byte(`{}`)}
	entryOf := make(map[string]string) // job ID -> entry ID
	for _, j := range []*stream.Job{single, retry, dead, slow} {
		id, err := prod.Enqueue(ctx, j)
		clusterMust(t, "Enqueue "+j.Type, err)
		entryOf[j.ID] = id
	}
	malformed, err := cc.Do(ctx, "XADD", name, "*", "foo", "bar").Text()
	clusterMust(t, "raw XADD without type", err)

	// The stream really is on addr: that master answers for it, another
	// one redirects.
	clusterOnNode(t, name, addr, all)

	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := &clusterRecorder{runs: make(map[string][]stream.Job), done: make(map[string]int)}
	mux := consumer.NewMux().
		HandleFunc("ok", func(_ context.Context, j *stream.Job) error {
			rec.start(j)
			rec.finish(j)
			return nil
		}).
		HandleFunc("retry", func(_ context.Context, j *stream.Job) error {
			rec.start(j)
			if j.Attempt == 0 {
				return consumer.Retry(20*time.Millisecond, errors.New("transient"))
			}
			rec.finish(j)
			return nil
		}).
		HandleFunc("dead", func(_ context.Context, j *stream.Job) error {
			rec.start(j)
			return consumer.Dead("bad_input", errors.New("cannot ever work"))
		}).
		HandleFunc("slow", func(ctx context.Context, j *stream.Job) error {
			rec.start(j)
			// Longer than the visibility timeout: only heartbeats keep it.
			select {
			case <-time.After(3 * visibility / 2):
				rec.finish(j)
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
	c := consumer.New(cc, consumer.Config{
		Stream:              name,
		Group:               group,
		Consumer:            "live",
		Block:               block,
		VisibilityTimeout:   visibility,
		SweepInterval:       100 * time.Millisecond,
		PromoteInterval:     50 * time.Millisecond,
		IdleConsumerTimeout: time.Second,
		SettleTimeout:       2 * time.Second,
		ShutdownTimeout:     2 * time.Second,
		Logger:              log,
	}).Handle(mux)
	runCtx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(runCtx) }()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-runErr
		}
		if t.Failed() {
			t.Logf("consumer log of %s:\n%s", name, tail(logs.String(), 6000))
		}
	}()

	wantDone := append([]*stream.Job{ghost, single, retry, slow}, batch...)
	eventually(t, 10*time.Second, func() (bool, string) {
		for _, j := range wantDone {
			if rec.finished(j.ID) == 0 {
				return false, fmt.Sprintf("%s job %s (entry %s) not done", j.Type, j.ID, entryOf[j.ID])
			}
		}
		if n := cc.XLen(ctx, keys.Dead).Val(); n != 2 {
			return false, fmt.Sprintf("dead-letter stream has %d entries, want 2", n)
		}
		if p, err := cc.XPending(ctx, name, group).Result(); err != nil || p.Count != 0 {
			return false, fmt.Sprintf("XPENDING: %+v, %v; want nothing pending", p, err)
		}
		if n, err := cc.ZCard(ctx, keys.Delayed).Result(); err != nil || n != 0 {
			return false, fmt.Sprintf("delayed set: %d, %v; want empty", n, err)
		}
		cs, err := cc.XInfoConsumers(ctx, name, group).Result()
		if err != nil {
			return false, fmt.Sprintf("XINFO CONSUMERS: %v", err)
		}
		for _, x := range cs {
			if x.Name == "ghost" {
				return false, fmt.Sprintf("idle consumer ghost not reaped yet (pending %d, idle %v)", x.Pending, x.Idle)
			}
		}
		return true, ""
	})

	// What the handlers saw.
	for _, j := range append([]*stream.Job{single, slow}, batch...) {
		runs := rec.get(j.ID)
		if len(runs) != 1 || runs[0].Deliveries != 1 || runs[0].Attempt != 0 {
			t.Errorf("%s job %s: runs %s, want one, first delivery, attempt 0", j.Type, j.ID, clusterRuns(runs))
		}
	}
	if runs := rec.get(ghost.ID); len(runs) != 1 || runs[0].Deliveries != 2 || runs[0].EntryID != ghostEntry {
		t.Errorf("ghost's job: runs %s, want one run of entry %s on its second delivery (reclaimed)", clusterRuns(runs), ghostEntry)
	}
	if runs := rec.get(retry.ID); len(runs) != 2 || runs[0].Attempt != 0 || runs[1].Attempt != 1 ||
		runs[1].LastError != "transient" || runs[1].EntryID == runs[0].EntryID {
		t.Errorf("retried job: runs %s, want attempt 0 then attempt 1 (last_error \"transient\") from a promoted entry", clusterRuns(runs))
	}
	if runs := rec.get(dead.ID); len(runs) != 1 {
		t.Errorf("dead job: runs %s, want one", clusterRuns(runs))
	}

	// The dead-letter stream, on the same node.
	dl, err := cc.XRange(ctx, keys.Dead, "-", "+").Result()
	clusterMust(t, "XRANGE dead-letter", err)
	byEntry := make(map[string]map[string]any)
	for _, m := range dl {
		byEntry[clusterField(m, "dead_entry_id")] = m.Values
	}
	if d := byEntry[entryOf[dead.ID]]; d == nil {
		t.Errorf("dead job's entry %s not in %s: %v", entryOf[dead.ID], keys.Dead, dl)
	} else if d["dead_reason"] != "bad_input" || d["dead_error"] != "cannot ever work" ||
		d["job_id"] != dead.ID || d["dead_stream"] != name || d["dead_consumer"] != "live" {
		t.Errorf("dead job's dead-letter entry = %v", d)
	}
	if d := byEntry[malformed]; d == nil {
		t.Errorf("malformed entry %s not in %s: %v", malformed, keys.Dead, dl)
	} else if d["dead_reason"] != consumer.ReasonMalformed || d["foo"] != "bar" ||
		!strings.Contains(fmt.Sprint(d["dead_error"]), `"type"`) {
		t.Errorf("malformed entry's dead-letter entry = %v", d)
	}

	clusterClaimAPI(t, cc, name)

	// Trim: keep=1h keeps every (young) entry; keep=0 removes every acked
	// entry but the last delivered one.
	before, err := cc.XLen(ctx, name).Result()
	clusterMust(t, "XLEN", err)
	n, err := stream.TrimAcked(ctx, cc, name, time.Hour)
	clusterMust(t, "TrimAcked keep=1h", err)
	if n != 0 {
		t.Errorf("TrimAcked(keep=1h) removed %d young entries, want 0", n)
	}
	n, err = stream.TrimAcked(ctx, cc, name, 0)
	clusterMust(t, "TrimAcked keep=0", err)
	after, err := cc.XLen(ctx, name).Result()
	clusterMust(t, "XLEN", err)
	// The consumer deletes settled entries itself; what it left (a stream
	// node not yet trimmed) goes, but for the last delivered entry.
	if wantLeft := min(before, 1); n != before-wantLeft || after != wantLeft {
		t.Errorf("TrimAcked(keep=0) removed %d of %d entries, %d left; want %d removed, %d left (the last delivered)",
			n, before, after, before-wantLeft, wantLeft)
	}

	// Shutdown through the ClusterClient returns within Block + 1 s.
	cancel()
	t0 := time.Now()
	select {
	case err := <-runErr:
		stopped = true
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(block + time.Second):
		t.Fatalf("Run did not return within Block (%v) + 1 s of cancel", block)
	}
	t.Logf("%s: Run returned %v after cancel", name, time.Since(t0).Round(time.Millisecond))

	st := c.Stats()
	want := consumer.Stats{Acked: uint64(len(wantDone)), Retried: 1, DeadLettered: 2, Reclaimed: 1, Suspects: 1}
	if st != want {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}

	clusterCheckLogs(t, logs.String(), 2,
		"reclaimed jobs idle past the visibility timeout", "removed idle consumers with no pending jobs", "job failed; retry scheduled")

	// Scheduled jobs: EnqueueIn (Redis clock) and EnqueueAt, then promotion.
	xlen0 := cc.XLen(ctx, name).Val()
	clusterMust(t, "EnqueueIn", prod.EnqueueIn(ctx, &stream.Job{Type: "later"}, 0))
	clusterMust(t, "EnqueueAt", prod.EnqueueAt(ctx, &stream.Job{Type: "later"}, time.Now().Add(-time.Second)))
	moved, err := stream.PromoteDue(ctx, cc, name, 10)
	clusterMust(t, "PromoteDue", err)
	if after := cc.XLen(ctx, name).Val(); moved != 2 || after != xlen0+2 {
		t.Errorf("PromoteDue moved %d jobs, stream grew %d -> %d; want 2 jobs added", moved, xlen0, after)
	}
}

// clusterClaimAPI calls the claimer's methods directly on a stream of its
// own in name's slot (so the consumer's group is not disturbed): ReadOwn,
// Extend, Release, Sweep, the owner check, and Reap.
func clusterClaimAPI(t *testing.T, cc *redis.ClusterClient, name string) {
	ctx := t.Context()
	key, err := stream.DerivedKey(name, "claimcheck")
	if err != nil {
		t.Fatal(err)
	}
	if keyslot.Of(key) != keyslot.Of(name) {
		t.Fatalf("DerivedKey %q is not in %q's slot", key, name)
	}
	clusterMust(t, "XGROUP CREATE", cc.XGroupCreateMkStream(ctx, key, "g", "0").Err())
	prod := stream.NewProducer(cc, stream.ProducerConfig{Stream: key})
	var ids []string
	for range 3 {
		id, err := prod.Enqueue(ctx, &stream.Job{Type: "x"})
		clusterMust(t, "Enqueue", err)
		ids = append(ids, id)
	}
	_, err = cc.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{key, ">"}, Count: 10, Block: -1}).Result()
	clusterMust(t, "XREADGROUP", err)

	c1 := claim.New(cc, key, "g", "c1", claim.Oversize{})
	own, deleted, err := c1.ReadOwn(ctx, "0", 10)
	clusterMust(t, "ReadOwn", err)
	if got := clusterEntryIDs(own); !slices.Equal(got, ids) || len(deleted) != 0 || own[0].Deliveries != 2 || own[0].Field("type") != "x" {
		t.Errorf("ReadOwn = %+v, deleted %v; want %v on their second delivery", own, deleted, ids)
	}
	lost, err := c1.Extend(ctx, ids...)
	clusterMust(t, "Extend", err)
	if len(lost) != 0 {
		t.Errorf("Extend by the owner lost %v", lost)
	}
	lost, err = c1.Release(ctx, time.Minute, ids...)
	clusterMust(t, "Release", err)
	if len(lost) != 0 {
		t.Errorf("Release by the owner lost %v", lost)
	}
	pend, err := cc.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: "g", Start: "-", End: "+", Count: 10}).Result()
	clusterMust(t, "XPENDING", err)
	for _, p := range pend {
		if p.Idle < time.Minute || p.Consumer != "c1" || p.RetryCount != 1 {
			t.Errorf("after Release: pending %+v, want idle >= 1m, owner c1, delivery count 1 (giving back takes one off)", p)
		}
	}

	c2 := claim.New(cc, key, "g", "c2", claim.Oversize{})
	var claimed []claim.Entry
	err = c2.Sweep(ctx, 30*time.Second, func(max int) int { return min(max, 10) },
		func(_ int, got []claim.Entry, del []string) {
			claimed = append(claimed, got...)
			if len(del) != 0 {
				t.Errorf("Sweep found deleted entries %v", del)
			}
		})
	clusterMust(t, "Sweep", err)
	if got := clusterEntryIDs(claimed); !slices.Equal(got, ids) || claimed[0].Deliveries != 2 {
		t.Errorf("Sweep claimed %+v, want %v on their second delivery (the give-back did not count)", claimed, ids)
	}
	lost, err = c1.Extend(ctx, ids...)
	clusterMust(t, "Extend by the former owner", err)
	if slices.Sort(lost); !slices.Equal(lost, ids) {
		t.Errorf("Extend by the former owner lost %v, want all of %v", lost, ids)
	}
	clusterMust(t, "XACK", cc.XAck(ctx, key, "g", ids...).Err())
	reaped, err := c2.Reap(ctx, 0)
	clusterMust(t, "Reap", err)
	if !slices.Equal(reaped, []string{"c1"}) {
		t.Errorf("Reap = %v, want [c1]", reaped)
	}
}

// clusterShutdown checks that a consumer of a ClusterClient whose read is
// blocked on an empty stream stops within Block + 1 s of its context's
// cancellation: the cancel does not interrupt the blocked read, Block bounds
// it.
func clusterShutdown(t *testing.T, cc *redis.ClusterClient, name string) {
	const block = 1500 * time.Millisecond
	var logs syncBuffer
	c := consumer.New(cc, consumer.Config{
		Stream:            name,
		Group:             "workers",
		Consumer:          "idle",
		Block:             block,
		VisibilityTimeout: 20 * time.Second, // sweeps every 10 s: reads block for all of Block
		Logger:            slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	// The group exists first, so that polling XINFO CONSUMERS never fails.
	clusterMust(t, "XGROUP CREATE", cc.XGroupCreateMkStream(t.Context(), name, "workers", "$").Err())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	// Wait until the consumer has joined the group and is in a blocked read.
	eventually(t, 5*time.Second, func() (bool, string) {
		cs, err := cc.XInfoConsumers(t.Context(), name, "workers").Result()
		return err == nil && len(cs) == 1, fmt.Sprintf("consumers %v, %v", cs, err)
	})
	time.Sleep(200 * time.Millisecond)
	cancel()
	t0 := time.Now()
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(block + time.Second):
		<-runErr
		t.Fatalf("Run returned %v after cancel, more than Block (%v) + 1 s", time.Since(t0), block)
	}
	t.Logf("idle consumer with Block %v: Run returned %v after cancel", block, time.Since(t0).Round(time.Millisecond))
	clusterCheckLogs(t, logs.String(), 0)
}

// clusterOnNode checks that key lives on the master at addr: a plain client
// of that node finds it, a plain client of another master is redirected.
func clusterOnNode(t *testing.T, key, addr string, all []string) {
	t.Helper()
	ctx := t.Context()
	for _, a := range all {
		rdb := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		n, err := rdb.Exists(ctx, key).Result()
		_ = rdb.Close()
		switch {
		case a == addr && (err != nil || n != 1):
			t.Errorf("EXISTS %s on its master %s = %d, %v; want 1", key, a, n, err)
		case a != addr && (err == nil || !strings.HasPrefix(err.Error(), "MOVED ")):
			t.Errorf("EXISTS %s on %s (not its master) = %d, %v; want a MOVED redirect", key, a, n, err)
		}
	}
}

// clusterSlotErrors are the texts of the errors a script or command gets
// from Redis Cluster when its keys are not in one slot of the node.
var clusterSlotErrors = []string{"crossslot", "non local key", "do not hash to the same slot"}

func clusterSlotError(s string) bool {
	s = strings.ToLower(s)
	for _, e := range clusterSlotErrors {
		if strings.Contains(s, e) {
			return true
		}
	}
	return false
}

// clusterMust fails the test on err, saying so when it is a slot error.
func clusterMust(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if clusterSlotError(err.Error()) {
		t.Fatalf("%s: cluster slot error: %v", what, err)
	}
	t.Fatalf("%s: %v", what, err)
}

// clusterCheckLogs checks a consumer's JSON log: no slot error anywhere, no
// ERROR record but wantDead "job dead-lettered" ones, and each of wantMsgs
// logged.
func clusterCheckLogs(t *testing.T, logs string, wantDead int, wantMsgs ...string) {
	t.Helper()
	if clusterSlotError(logs) {
		t.Errorf("consumer log mentions a cluster slot error:\n%s", logs)
	}
	dead := 0
	seen := make(map[string]bool)
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if line == "" {
			continue
		}
		var r struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Errorf("log line %q: %v", line, err)
			continue
		}
		seen[r.Msg] = true
		if r.Level == slog.LevelError.String() {
			if r.Msg == "job dead-lettered" {
				dead++
			} else {
				t.Errorf("unexpected ERROR log record: %s", line)
			}
		}
	}
	if dead != wantDead {
		t.Errorf("%d \"job dead-lettered\" records, want %d", dead, wantDead)
	}
	for _, m := range wantMsgs {
		if !seen[m] {
			t.Errorf("no %q log record", m)
		}
	}
}

// clusterWatcher records, through hooks on the cluster client and on each
// of its node clients, every error Redis returned and every script run.
type clusterWatcher struct {
	mu       sync.Mutex
	masterOf func(slot int) string
	errs     []string
	// ran: node address -> script SHA1 -> runs that succeeded.
	ran map[string]map[string]int
	// misplaced: script runs whose keys were not all in one slot served by
	// the node that ran them.
	misplaced []string
}

// clusterWatch installs a clusterWatcher on cc; call it before cc's first
// command, so that every node client gets the hook.
func clusterWatch(cc *redis.ClusterClient) *clusterWatcher {
	w := &clusterWatcher{ran: make(map[string]map[string]int)}
	cc.AddHook(clusterHook{w: w})
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(clusterHook{w: w, node: n.Options().Addr}) })
	return w
}

func (w *clusterWatcher) setMasterOf(f func(int) string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.masterOf = f
}

// note records cmd's outcome. err is what the next hook returned: a node
// client sets it on cmd only after its hooks have run.
func (w *clusterWatcher) note(node string, cmd redis.Cmder, err error) {
	if err == nil {
		err = cmd.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil && !errors.Is(err, redis.Nil) {
		where := "cluster client"
		if node != "" {
			where = "node " + node
		}
		w.errs = append(w.errs, fmt.Sprintf("%s: %s: %v", where, clusterCmdText(cmd), err))
		return
	}
	if node == "" {
		return
	}
	args := cmd.Args()
	name := strings.ToLower(cmd.Name())
	if (name != "eval" && name != "evalsha") || len(args) < 3 {
		return
	}
	src, _ := args[1].(string)
	sha := src
	if name == "eval" {
		sum := sha1.Sum([]byte(src))
		sha = hex.EncodeToString(sum[:])
	}
	if w.ran[node] == nil {
		w.ran[node] = make(map[string]int)
	}
	w.ran[node][sha]++
	nkeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
	if nkeys == 0 || len(args) < 3+nkeys {
		w.misplaced = append(w.misplaced, fmt.Sprintf("node %s: script %s declares no keys", node, sha))
		return
	}
	for _, k := range args[3 : 3+nkeys] {
		key := fmt.Sprint(k)
		slot := keyslot.Of(key)
		if slot != keyslot.Of(fmt.Sprint(args[3])) || (w.masterOf != nil && w.masterOf(slot) != node) {
			w.misplaced = append(w.misplaced, fmt.Sprintf("node %s: script %s: key %q (slot %d) with keys %v", node, sha, key, slot, args[3:3+nkeys]))
		}
	}
}

// check fails t on slot errors and unexpected errors, on scripts run with
// keys of several slots or of another node, and unless every Lua script of
// the repository has run on every master.
func (w *clusterWatcher) check(t *testing.T, masters []string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		switch {
		case clusterSlotError(e):
			t.Errorf("cluster slot error: %s", e)
		case strings.Contains(e, "NOSCRIPT"), // EVALSHA before the script is loaded: Run falls back to EVAL
			strings.Contains(e, "BUSYGROUP"),                                              // XGROUP CREATE of an existing group
			strings.Contains(e, context.Canceled.Error()),                                 // a command of a stopping consumer
			strings.Contains(e, context.DeadlineExceeded.Error()),                         // a command's own timeout on a loaded machine (the results are checked by the scenarios)
			strings.Contains(e, ": client ") && strings.Contains(e, "unknown subcommand"): // go-redis's handshake (CLIENT SETINFO, MAINT_NOTIFICATIONS) on Redis 7.0
		default:
			t.Errorf("unexpected Redis error: %s", e)
		}
	}
	for _, m := range w.misplaced {
		t.Errorf("misplaced script keys: %s", m)
	}
	scripts := clusterScripts(t)
	for _, node := range masters {
		for file, sha := range scripts {
			if w.ran[node][sha] == 0 {
				t.Errorf("embedded script %s (%s) never ran successfully on master %s; exercise it in TestCluster", file, sha, node)
			}
		}
	}
	total := 0
	for _, m := range w.ran {
		for _, n := range m {
			total += n
		}
	}
	t.Logf("%d script runs on %d nodes; all %d scripts ran on each of the %d masters; %d tolerated errors",
		total, len(w.ran), len(scripts), len(masters), len(w.errs))
}

// clusterScripts returns the SHA1 (what redis.NewScript sends with EVALSHA)
// of every Lua script that a //go:embed directive of a non-test Go file of
// the module embeds, by path. It fails unless it finds the nine scripts of
// consumer, claim and stream at least.
func clusterScripts(t *testing.T) map[string]string {
	t.Helper()
	out := make(map[string]string)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != ".." && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(src), "\n") {
			patterns, ok := strings.CutPrefix(strings.TrimSpace(line), "//go:embed ")
			if !ok {
				continue
			}
			for _, pat := range strings.Fields(patterns) {
				if !strings.HasSuffix(pat, ".lua") {
					continue
				}
				files, err := filepath.Glob(filepath.Join(filepath.Dir(path), pat))
				if err != nil {
					return err
				}
				for _, f := range files {
					b, err := os.ReadFile(f)
					if err != nil {
						return err
					}
					sum := sha1.Sum(b)
					out[strings.TrimPrefix(f, "../")] = hex.EncodeToString(sum[:])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Helpers are no scripts of their own: consumer/settle.go puts
	// consumer/ids.lua in front of the settlement scripts, claim/claimer.go
	// claim/oversize.lua in front of the scripts that hand entries over;
	// those run as the concatenation.
	for helper, scripts := range map[string][]string{
		"consumer/ids.lua":   {"consumer/ack.lua", "consumer/retry.lua", "consumer/dead.lua"},
		"claim/oversize.lua": {"claim/reclaim.lua", "claim/readown.lua"},
	} {
		if _, ok := out[helper]; !ok {
			continue
		}
		front, err := os.ReadFile("../" + helper)
		if err != nil {
			t.Fatal(err)
		}
		delete(out, helper)
		for _, f := range scripts {
			b, err := os.ReadFile("../" + f)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha1.Sum(append(slices.Clip(front), b...))
			out[f] = hex.EncodeToString(sum[:])
		}
	}
	for _, want := range []string{"consumer/ack.lua", "consumer/dead.lua", "consumer/retry.lua", "stream/promote.lua", "stream/schedule.lua",
		"claim/readown.lua", "claim/reap.lua", "claim/reclaim.lua", "claim/touch.lua", "stream/trim.lua"} {
		if out[want] == "" {
			t.Errorf("embedded script %s not found; scripts found: %v", want, out)
		}
	}
	return out
}

func clusterCmdText(cmd redis.Cmder) string {
	args := cmd.Args()
	parts := make([]string, 0, min(len(args), 4))
	for _, a := range args[:min(len(args), 4)] {
		s := fmt.Sprint(a)
		if len(s) > 48 {
			s = s[:48] + "..."
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// clusterHook feeds a clusterWatcher; node is "" on the cluster client.
type clusterHook struct {
	w    *clusterWatcher
	node string
}

func (h clusterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h clusterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.w.note(h.node, cmd, err)
		return err
	}
}

func (h clusterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.w.note(h.node, cmd, cmd.Err())
		}
		return err
	}
}

// clusterRecorder records what the handlers of one consumer saw.
type clusterRecorder struct {
	mu   sync.Mutex
	runs map[string][]stream.Job // job ID -> every start
	done map[string]int          // job ID -> completed runs
}

func (r *clusterRecorder) start(j *stream.Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[j.ID] = append(r.runs[j.ID], *j)
}

func (r *clusterRecorder) finish(j *stream.Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done[j.ID]++
}

func (r *clusterRecorder) finished(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done[id]
}

func (r *clusterRecorder) get(id string) []stream.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.runs[id])
}

func clusterRuns(runs []stream.Job) string {
	parts := make([]string, len(runs))
	for i, j := range runs {
		parts[i] = fmt.Sprintf("{entry %s, attempt %d, deliveries %d, last_error %q}", j.EntryID, j.Attempt, j.Deliveries, j.LastError)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func clusterEntryIDs(es []claim.Entry) []string {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	return ids
}

func clusterField(m redis.XMessage, name string) string {
	s, _ := m.Values[name].(string)
	return s
}

// clusterMiddleware runs the Redis-backed middleware (lock, idempotency,
// rate limit, distributed concurrency with a lease renewal) with their
// default configurations on a job of name: their keys are in the queue's
// namespace, with the stream's hash tag, so every script runs on the master
// of name's slot. It also drives lockx and the idem store directly in that
// namespace (extend, TTL, release, forget).
func clusterMiddleware(t *testing.T, cc *redis.ClusterClient, name string) {
	t.Helper()
	ctx := t.Context()
	keys, err := stream.KeysFor(name)
	clusterMust(t, "KeysFor", err)
	store := idem.NewRedisStore(cc, idem.RedisConfig{})
	// Short TTLs and leases, so that the run renews them (every TTL/3); a
	// run whose lease or lock a stalled machine let lapse is repeated with
	// four times the TTL.
	for ttl := 60 * time.Millisecond; ; ttl *= 4 {
		var ran bool
		h := consumer.Chain(consumer.HandlerFunc(func(ctx context.Context, _ *stream.Job) error {
			ran = true
			select { // long enough for lock and lease renewals
			case <-time.After(ttl * 5 / 2):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}),
			middleware.Lock(cc, middleware.LockConfig{TTL: ttl}),
			middleware.Idempotency(store, middleware.IdempotencyConfig{}),
			middleware.RateLimit(cc, middleware.RateLimitConfig{Rate: 100, Per: time.Second}),
			middleware.DistributedConcurrency(cc, middleware.DistributedConcurrencyConfig{Limit: 1, Lease: ttl}),
		)
		job := &stream.Job{ID: "mw-1", EntryID: "1-0", Stream: name, Type: "x", LockKey: "customer-7", IdempotencyKey: "invoice-1"}
		err := h.Process(ctx, job)
		if err != nil && ttl < 4*time.Second && (strings.Contains(err.Error(), "lease lost") || strings.Contains(err.Error(), "lock lost")) {
			t.Logf("the chain lost a lease or lock renewed every %v (a stalled machine): %v; again with a longer TTL", ttl/3, err)
			continue
		}
		if err != nil || !ran {
			t.Fatalf("middleware chain on the cluster: ran %v, err %v", ran, err)
		}
		break
	}
	// (The rate limiter's key expires within an emission interval, the
	// lock's fence tombstone within the lock's TTL.)
	for _, k := range []string{keys.Idem + "invoice-1"} {
		if n, err := cc.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Errorf("key %q of the queue's namespace: exists %d, %v", k, n, err)
		}
	}

	// lockx in the queue's namespace: "<tag>:lock:{customer-8}".
	l, err := lockx.New(cc, lockx.Config{Prefix: keys.Lock}).TryAcquire(ctx, "customer-8", time.Second)
	clusterMust(t, "lockx TryAcquire", err)
	clusterMust(t, "lockx Extend", l.Extend(ctx, 2*time.Second))
	if ttl, err := l.TTL(ctx); err != nil || ttl <= time.Second {
		t.Fatalf("lockx TTL after Extend = %v, %v", ttl, err)
	}
	clusterMust(t, "lockx Release", l.Release(ctx))

	// idem: records "<tag>:idem:<key>" live on this master.
	for _, key := range []string{"done", "released"} {
		out, err := store.Begin(ctx, keys.Idem+key, "owner-1", time.Second)
		if err != nil || out.Status != idem.StatusStarted {
			t.Fatalf("idem Begin(%s) on the cluster = %+v, %v", key, out, err)
		}
	}
	clusterMust(t, "idem Complete", store.Complete(ctx, keys.Idem+"done", "owner-1", []byte("ok")))
	clusterMust(t, "idem Release", store.Release(ctx, keys.Idem+"released", "owner-1"))
	if ok, err := store.Forget(ctx, keys.Idem+"done", idem.StatusCompleted); err != nil || !ok {
		t.Fatalf("idem Forget(done, completed) on the cluster = %v, %v; want true", ok, err)
	}
}

// clusterPeriodic runs a periodic scheduler on queue name of the cluster
// until it has enqueued a tick: periodic/tick.lua with its keys in the
// stream's slot.
func clusterPeriodic(t *testing.T, cc *redis.ClusterClient, name string) {
	t.Helper()
	s, err := periodic.New(cc, periodic.Config{Stream: name, Logger: slog.New(slog.DiscardHandler),
		Schedules: []periodic.Schedule{{Name: "cluster", Type: "tick", Every: time.Second}}})
	clusterMust(t, "periodic.New", err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		clusterMust(t, "periodic Run", <-done)
	}()
	eventually(t, 30*time.Second, func() (bool, string) {
		msgs, err := cc.XRange(t.Context(), name, "-", "+").Result()
		for _, m := range msgs {
			if id, _ := m.Values["job_id"].(string); strings.HasPrefix(id, "cluster@") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no tick of schedule cluster in %s yet (%v)", name, err)
	})
}

// clusterLookup schedules a tracked job on queue name of the cluster, finds
// it, cancels it and finds it cancelled: control/cancel.lua and the index
// writes of schedule.lua, with every key in the stream's slot.
func clusterLookup(t *testing.T, cc *redis.ClusterClient, name string) {
	t.Helper()
	ctx := t.Context()
	p := stream.NewProducer(cc, stream.ProducerConfig{Stream: name, Track: true})
	job := &stream.Job{Type: "t", ID: "cluster-lookup"}
	clusterMust(t, "EnqueueIn", p.EnqueueIn(ctx, job, time.Hour))
	info, err := control.Lookup(ctx, cc, name, job.ID)
	clusterMust(t, "Lookup", err)
	if info.State != stream.StateScheduled {
		t.Fatalf("Lookup of a scheduled job: state %q, want %q", info.State, stream.StateScheduled)
	}
	_, err = control.Cancel(ctx, cc, name, job.ID)
	clusterMust(t, "Cancel", err)
	info, err = control.Lookup(ctx, cc, name, job.ID)
	clusterMust(t, "Lookup", err)
	if info.State != stream.StateCancelled {
		t.Fatalf("Lookup after Cancel: state %q, want %q", info.State, stream.StateCancelled)
	}

	// Tracked jobs added beside a plain one, promoted and replayed:
	// enqueue.lua, promote.lua and dlq/move.lua with the records in KEYS.
	plain := stream.NewProducer(cc, stream.ProducerConfig{Stream: name})
	_, err = plain.EnqueueBatch(ctx, []*stream.Job{{Type: "t", ID: "cluster-track-a", Track: true}, {Type: "t", ID: "cluster-plain"}})
	clusterMust(t, "EnqueueBatch", err)
	clusterMust(t, "EnqueueAt", p.EnqueueAt(ctx, &stream.Job{Type: "t", ID: "cluster-track-due"}, time.Now().Add(-time.Hour)))
	_, err = stream.PromoteDue(ctx, cc, name, 100)
	clusterMust(t, "PromoteDue", err)
	keys, _ := stream.KeysFor(name)
	clusterMust(t, "XADD dead", cc.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"type", "cluster-track", "payload", "{}",
		"job_id", "cluster-track-dead", "track", "1", "dead_reason", "permanent", "dead_error", "no", "dead_stream", name}}).Err())
	d, err := dlq.New(cc, name, dlq.Config{})
	clusterMust(t, "dlq.New", err)
	res, err := d.Replay(ctx, dlq.Filter{Types: []string{"cluster-track"}}, dlq.ReplayOptions{})
	clusterMust(t, "Replay", err)
	if res.Replayed != 1 {
		t.Errorf("Replay of a tracked dead job: %+v, want 1 replayed", res)
	}
	for _, id := range []string{"cluster-track-a", "cluster-track-due", "cluster-track-dead"} {
		info, err := control.Lookup(ctx, cc, name, id)
		clusterMust(t, "Lookup", err)
		if info.State != stream.StateWaiting && info.State != control.StateRunning && info.State != stream.StateDone {
			t.Errorf("Lookup of tracked job %s: state %q, want waiting (or already running or done)", id, info.State)
		}
	}
}
