package dashboard_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/redis/go-redis/v9"
)

// Promise: replay and purge act on "the entries matching the filter", and the
// confirmation states how many: the click must touch those entries, not others.
func TestAttack11_FilteredActionsTouchOnlyMatches(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "filter")
	a11Dead(t, rdb, s, 5, "exhausted")
	a11Dead(t, rdb, s, 3, "permanent")
	a11Dead(t, rdb, s, 4, "exhausted")
	a11Dead(t, rdb, s, 2, "malformed")
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}})
	b.get("/queues/" + s + "/dead?reason=permanent")

	code, page := b.post("/queues/"+s+"/dead/replay?reason=permanent", url.Values{"csrf": {b.tok}, "rate": {"1000"}, "reason": {"permanent"}}, nil)
	if code != 200 || !strings.Contains(page, "Replay 3 job(s)") {
		t.Fatalf("filtered replay confirmation %d:\n%s", code, page)
	}
	b.post("/queues/"+s+"/dead/replay?reason=permanent", confirmForm(t, page), nil)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var mc, dc *redis.IntCmd
		rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { mc, dc = p.XLen(ctx, s), p.XLen(ctx, "{"+s+"}:dlq"); return nil })
		if mc.Val()+dc.Val() != 14 {
			t.Fatalf("lost or doubled: %d + %d != 14", mc.Val(), dc.Val())
		}
		if ex, _ := rdb.Exists(ctx, "{"+s+"}:dlq:replay").Result(); ex == 0 && mc.Val() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replay did not finish")
		}
	}
	moved, _ := rdb.XRange(ctx, s, "-", "+").Result()
	if len(moved) != 3 {
		t.Fatalf("filtered replay of 3 moved %d", len(moved))
	}
	for _, e := range moved {
		if !strings.HasPrefix(e.Values["job_id"].(string), "j-permanent-") {
			t.Fatalf("replay reason=permanent moved %v", e.Values["job_id"])
		}
	}
	// Purge reason=malformed: only those two go.
	code, page = b.post("/queues/"+s+"/dead/purge?reason=malformed", url.Values{"csrf": {b.tok}, "reason": {"malformed"}}, nil)
	if code != 200 || !strings.Contains(page, "Delete 2 job(s)") {
		t.Fatalf("filtered purge confirmation %d:\n%s", code, page)
	}
	b.post("/queues/"+s+"/dead/purge?reason=malformed", confirmForm(t, page), nil)
	left, _ := rdb.XRange(ctx, "{"+s+"}:dlq", "-", "+").Result()
	if len(left) != 9 {
		t.Fatalf("purge of 2 malformed left %d of 11", len(left))
	}
	for _, e := range left {
		if e.Values["dead_reason"] != "exhausted" {
			t.Fatalf("left %v", e.Values)
		}
	}
}
