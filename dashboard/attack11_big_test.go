package dashboard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/redis/go-redis/v9"
)

// Promise: MaxValueBytes is "how many bytes of one field value or decoded
// payload a page shows; longer ones are cut and marked"; lists are capped at
// PageSize. A page of a hostile, huge dead letter must stay bounded.
func TestAttack11_HugeValuesAreCut(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "big")
	big := strings.Repeat("<b>a11</b>", 50_000) // 500 KB, escaping makes it bigger still
	vals := []any{"type", big, "payload", `{"k":"` + big + `"}`, "last_error", big, "error_history", `["` + big + `"]`,
		"dead_reason", "permanent", "dead_error", big, "dead_at", fmt.Sprint(time.Now().UnixMilli()), "dead_stream", s}
	for i := 0; i < 200; i++ {
		vals = append(vals, fmt.Sprintf("f%03d", i), big[:5000])
	}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "{" + s + "}:dlq", Values: vals}).Result()
	if err != nil {
		t.Fatal(err)
	}
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", big, "payload", big}})
	const max = 1000
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}, MaxValueBytes: max})
	// Each shown value ≤ max bytes, escaped ≤ 6× (&#34;), over at most ~210 values, plus markup.
	limit := 210*(6*max+200) + 64<<10
	for _, p := range []string{"/", "/queues/" + s, "/queues/" + s + "/dead", "/queues/" + s + "/dead/" + id} {
		code, page := b.get(p)
		if code != 200 {
			t.Fatalf("%s: %d", p, code)
		}
		if len(page) > limit {
			t.Errorf("%s: page of %d bytes with MaxValueBytes %d (bound %d)", p, len(page), max, limit)
		}
		if strings.Contains(page, strings.Repeat("&lt;b&gt;a11&lt;/b&gt;", 2*max/10)) {
			t.Errorf("%s shows a run of more than %d bytes of one value", p, max)
		}
	}
}
