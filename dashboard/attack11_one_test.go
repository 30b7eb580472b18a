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

// Promises: delete is "dlq.Purge of one entry"; replay of one entry moves that
// entry; the confirmation states how many jobs it touches; lists are capped at
// Config.PageSize.
func TestAttack11_OneEntryActionsTouchOnlyIt(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "one")
	a11Dead(t, rdb, s, 120, "permanent")
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}, PageSize: 7})
	_, page := b.get("/queues/" + s + "/dead")
	if rows := strings.Count(page, `<tr><td class="id"><a href=`); rows == 0 || rows > 7 {
		t.Fatalf("dead page lists %d rows with PageSize 7", rows)
	}
	ids, _ := rdb.XRange(ctx, "{"+s+"}:dlq", "-", "+").Result()
	victim, replayed := ids[40].ID, ids[77].ID

	// Delete one: confirmation, then exactly that entry is gone.
	code, page := b.post("/queues/"+s+"/dead/"+victim+"/delete", url.Values{"csrf": {b.tok}}, nil)
	if code != 200 || !strings.Contains(page, "1 job") && !strings.Contains(page, "1 dead") {
		t.Fatalf("delete confirmation %d does not say 1:\n%s", code, page)
	}
	if n, _ := rdb.XLen(ctx, "{"+s+"}:dlq").Result(); n != 120 {
		t.Fatalf("asking for confirmation deleted %d", 120-n)
	}
	b.post("/queues/"+s+"/dead/"+victim+"/delete", confirmForm(t, page), nil)
	left, _ := rdb.XRange(ctx, "{"+s+"}:dlq", "-", "+").Result()
	if len(left) != 119 {
		t.Fatalf("delete of one touched %d entries", 120-len(left))
	}
	for _, e := range left {
		if e.ID == victim {
			t.Fatalf("the deleted entry is still there")
		}
	}

	// Replay one.
	code, page = b.post("/queues/"+s+"/dead/replay", url.Values{"csrf": {b.tok}, "id": {replayed}, "rate": {"1000"}}, nil)
	if code != 200 || !strings.Contains(page, "Replay 1 job(s)") {
		t.Fatalf("replay-one confirmation %d:\n%s", code, page)
	}
	b.post("/queues/"+s+"/dead/replay", confirmForm(t, page), nil)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var mc, dc *redis.IntCmd
		rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { mc, dc = p.XLen(ctx, s), p.XLen(ctx, "{"+s+"}:dlq"); return nil })
		if mc.Val()+dc.Val() != 119 {
			t.Fatalf("lost or doubled: %d + %d != 119", mc.Val(), dc.Val())
		}
		if ex, _ := rdb.Exists(ctx, "{"+s+"}:dlq:replay").Result(); ex == 0 && mc.Val() > 0 {
			if mc.Val() != 1 {
				t.Fatalf("replay of one entry moved %d", mc.Val())
			}
			e, _ := rdb.XRange(ctx, s, "-", "+").Result()
			if e[0].Values["replayed_from"] != replayed {
				t.Fatalf("replayed the wrong entry: %v, want from %s", e[0].Values, replayed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replay of one did not finish")
		}
	}
	// A deleted (nonexistent) ID: nothing moves and nothing is deleted.
	code, page = b.post("/queues/"+s+"/dead/replay", url.Values{"csrf": {b.tok}, "id": {victim}, "rate": {"1000"}}, nil)
	if strings.Contains(page, "Replay 1 job(s)") {
		t.Fatalf("confirmation offers to replay a deleted entry:\n%s", page)
	}
	if n, _ := rdb.XLen(ctx, "{"+s+"}:dlq").Result(); n != 118 {
		t.Fatalf("dead letters %d, want 118", n)
	}
}
