package dashboard_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/pelicanqueue/pelican/dashboard"
)

// Promise: replay is "rate-limited" at "the rate given": a rate that is not a
// positive number must be refused, not run unbounded or never.
func TestAttack11_ReplayRejectsHostileRates(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "rate")
	a11Dead(t, rdb, s, 3, "exhausted")
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}})
	b.get("/queues/" + s + "/dead")
	for _, r := range []string{"0", "-1", "NaN", "Inf", "+Inf", "-Inf", "1e400", "abc", "0x10"} {
		code, page := b.post("/queues/"+s+"/dead/replay", url.Values{"csrf": {b.tok}, "rate": {r}, "confirm": {"1"}}, nil)
		if code != 400 {
			t.Errorf("rate %q accepted: %d\n%.400s", r, code, page)
		}
		if ex, _ := rdb.Exists(ctx, "{"+s+"}:dlq:replay", "{"+s+"}:dlq:replay:cursor").Result(); ex != 0 {
			t.Errorf("rate %q left a replay lease or cursor", r)
		}
	}
	if n, _ := rdb.XLen(ctx, s).Result(); n != 0 {
		t.Fatalf("hostile rates replayed %d jobs", n)
	}
}
