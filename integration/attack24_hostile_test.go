package integration

// Outside tester (s24-attack) of the consumer's raw backlog reads: entries
// written by another client (binary names and values, empty values,
// duplicate names, thousands of fields, a 1 MB field, entries deleted while
// pending) read by a RESP2 and a RESP3 consumer sharing one group. Every
// entry ends in one final state: run once, dead-lettered as malformed, or
// reported lost; none twice, none missing.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func TestAttack24HostileEntriesBothProtocols(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := redistest.Shared(t)
	s := redistest.Name(t)
	keys, err := stream.KeysFor(s)
	if err != nil {
		t.Fatal(err)
	}
	dlqKey := keys.Dead
	t.Cleanup(func() { admin.Del(context.Background(), s, dlqKey); redistest.DeleteKeys(admin, "{"+s+"}:*") })

	xadd := func(args ...any) string {
		t.Helper()
		id, err := admin.Do(ctx, append([]any{"XADD", s, "*"}, args...)...).Text()
		if err != nil {
			t.Fatalf("XADD: %v", err)
		}
		return id
	}
	if err := admin.XGroupCreateMkStream(ctx, s, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}

	valid := map[string]bool{}     // entry ID -> must run exactly once
	malformed := map[string]bool{} // entry ID -> must be dead-lettered "malformed"
	lost := map[string]bool{}      // entry ID -> deleted while pending
	bin := string([]byte{0, 0xff, 0xfe, '\r', '\n', '*', '$', '-', 1})
	many := []any{"type", "many"}
	for i := 0; i < 3000; i++ {
		many = append(many, fmt.Sprintf("x%d", i), "v")
	}
	hundred := []any{"type", "fields"}
	for i := 0; i < 900; i++ {
		hundred = append(hundred, fmt.Sprintf("h.%d", i), bin)
	}
	big := strings.Repeat("\x00\xffpayload", 1<<20/9+1)

	// The ghost reads these first and never settles: two are then deleted
	// (lost), one stays (reclaimed after the lease and run once).
	g1 := xadd("type", "ghost", "payload", "a")
	g2 := xadd("type", "ghost", "payload", "b")
	g3 := xadd("type", "ghost", "payload", "c")
	if err := admin.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "ghost", Streams: []string{s, ">"}, Count: 3}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.XDel(ctx, s, g1, g2).Err(); err != nil {
		t.Fatal(err)
	}
	lost[g1], lost[g2] = true, true
	valid[g3] = true

	p := stream.NewProducer(admin, stream.ProducerConfig{Stream: s})
	for round := 0; round < 20; round++ {
		for i := 0; i < 10; i++ {
			id, err := p.Enqueue(ctx, &stream.Job{Type: "ok", Payload: []byte(fmt.Sprint(round, i))})
			if err != nil {
				t.Fatal(err)
			}
			valid[id] = true
		}
		valid[xadd("type", bin, "payload", bin, bin, bin, "h."+bin, "")] = true
		valid[xadd("type", "empty", "payload", "", "job_id", "", "content_type", "", "lock_key", "")] = true
		valid[xadd("type", "x", "type", "dup", "payload", "1", "payload", "2", "h.a", "1", "h.a", "2")] = true
		valid[xadd("type", "big", "payload", big)] = true
		valid[xadd(hundred...)] = true
		malformed[xadd("type", "", "payload", "x")] = true
		malformed[xadd("type", "dup", "type", "", "payload", "x")] = true
		malformed[xadd("type", "ok", "attempt", "")] = true
		malformed[xadd("type", "ok", "v", "")] = true
		malformed[xadd("payload", bin)] = true
		malformed[xadd(many...)] = true
		malformed[xadd("type", "ok", "created_at", "-1")] = true
		malformed[xadd("type", "ok", "error_history", bin)] = true
	}
	// Jobs deleted while their handler runs: they still finish once.
	held := map[string]bool{}
	for i := 0; i < 4; i++ {
		id := xadd("type", "hold", "payload", bin)
		valid[id], held[id] = true, true
	}
	release := make(chan struct{})
	var holding sync.WaitGroup
	holding.Add(len(held))

	total := len(valid) + len(malformed) + len(lost)

	var mu sync.Mutex
	ran := map[string]int{}
	h := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		mu.Lock()
		ran[job.EntryID]++
		mu.Unlock()
		if job.Type == "hold" {
			holding.Done()
			<-release
		}
		return nil
	})
	var cs []*consumer.Consumer
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(), Protocol: proto})
		t.Cleanup(func() { rdb.Close() })
		c := consumer.New(rdb, consumer.Config{
			Stream: s, Group: "g", Consumer: fmt.Sprintf("resp%d", proto),
			Block: 100 * time.Millisecond, VisibilityTimeout: 2 * time.Second, SweepInterval: 100 * time.Millisecond,
			Concurrency: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}).Handle(h)
		cs = append(cs, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(runCtx); err != nil && runCtx.Err() == nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}
	t.Cleanup(func() { stop(); wg.Wait() })

	holding.Wait()
	for id := range held {
		if err := admin.XDel(ctx, s, id).Err(); err != nil {
			t.Fatal(err)
		}
	}
	close(release)

	state := func() (int, int64, uint64) {
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		dl, _ := admin.XLen(ctx, dlqKey).Result()
		var l uint64
		for _, c := range cs {
			l += c.Stats().Lost
		}
		return n, dl, l
	}
	poll.Until(t, 2*time.Minute, func() (bool, string) {
		n, dl, l := state()
		pend, _ := admin.XPending(ctx, s, "g").Result()
		var p int64
		if pend != nil {
			p = pend.Count
		}
		return n+int(dl)+int(l) >= total && p == 0, fmt.Sprintf("ran %d dead %d lost %d pending %d of %d", n, dl, l, p, total)
	})
	for _, c := range cs {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := c.WaitIdle(wctx); err != nil {
			t.Fatalf("WaitIdle: %v", err)
		}
		cancel()
	}
	stop()
	wg.Wait()

	// The ghost's g3 is reclaimed once. More reclaims mean the machine
	// stalled a consumer past the 2 s lease (seen under -race beside the
	// rest of the suite): each such entry may run twice, as at-least-once
	// allows after a lost lease. That is a broken precondition; it widens
	// the check by that many entries, never beyond.
	var reclaimed uint64
	for _, c := range cs {
		reclaimed += c.Stats().Reclaimed
	}
	stalled := int(max(reclaimed, 1) - 1)
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for id, n := range ran {
		if !valid[id] {
			t.Errorf("entry %s ran but is not a valid job (malformed %v, lost %v)", id, malformed[id], lost[id])
		}
		if n == 2 && twice < stalled {
			twice++
			t.Logf("entry %s ran twice, after one of %d reclaims of leases lost to a stall", id, stalled)
			continue
		}
		if n != 1 {
			t.Errorf("entry %s ran %d times (reclaims past the ghost's one: %d)", id, n, stalled)
		}
	}
	for id := range valid {
		if ran[id] == 0 {
			t.Errorf("valid entry %s never ran", id)
		}
	}
	dead, err := admin.XRange(ctx, dlqKey, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range dead {
		id, _ := d.Values["dead_entry_id"].(string)
		if !malformed[id] {
			t.Errorf("dead letter of entry %s (reason %v, error %q) was not expected", id, d.Values["dead_reason"], d.Values["dead_error"])
			continue
		}
		if seen[id] {
			t.Errorf("entry %s dead-lettered twice", id)
		}
		seen[id] = true
		if d.Values["dead_reason"] != "malformed" || !strings.Contains(fmt.Sprint(d.Values["dead_error"]), id) {
			t.Errorf("entry %s: reason %v error %q", id, d.Values["dead_reason"], d.Values["dead_error"])
		}
	}
	for id := range malformed {
		if !seen[id] {
			t.Errorf("malformed entry %s not dead-lettered", id)
		}
	}
	var l uint64
	for _, c := range cs {
		l += c.Stats().Lost
	}
	// The ghost's two deleted entries are lost. A held job deleted while
	// its handler ran is reported lost too when a heartbeat finds its entry
	// gone before the job settles (README: entries deleted while pending
	// are reported lost), which depends on timing: it still ran once
	// (checked above). Nothing else may be reported lost.
	if l < uint64(len(lost)) || l > uint64(len(lost)+len(held)) {
		t.Errorf("lost %d, want %d (the ghost's deleted entries) to %d (and the held jobs deleted while running)", l, len(lost), len(lost)+len(held))
	}
	t.Logf("%d valid run once, %d dead-lettered malformed, %d lost, %d reclaimed", len(valid), len(malformed), l, reclaimed)
}
