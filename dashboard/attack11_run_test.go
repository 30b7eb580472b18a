package dashboard_test

import (
	"context"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Promise: run now "makes one delayed job due at once (ZADD XX, the Redis time
// as its score)", after a confirmation; the other delayed jobs are untouched.
func TestAttack11_RunNowTouchesOne(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "run")
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	if _, err := p.Enqueue(ctx, &stream.Job{Type: "a11.now"}); err != nil { // the stream must exist to have a page
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		j, _ := stream.NewJSONJob("a11.later", i)
		if err := p.EnqueueIn(ctx, j, time.Duration(i+1)*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	key := "{" + s + "}:delayed"
	before, _ := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}})
	_, page := b.get("/queues/" + s)
	forms := regexp.MustCompile(`(?s)<form[^>]*method="post"[^>]*action="([^"]+/delayed/run)"[^>]*>(.*?)</form>`).FindAllStringSubmatch(page, -1)
	if len(forms) != 5 {
		t.Fatalf("queue page has %d run-now forms for 5 delayed jobs:\n%s", len(forms), page)
	}
	action := forms[2][1]
	v := url.Values{}
	for _, m := range regexp.MustCompile(`name="([^"]+)" value="([^"]*)"`).FindAllStringSubmatch(forms[2][2], -1) {
		v.Set(m[1], strings.NewReplacer("&#34;", `"`, "&#43;", "+", "&amp;", "&", "&lt;", "<", "&gt;", ">", "&#39;", "'").Replace(m[2]))
	}
	code, conf := b.post(action, v, nil)
	if code != 200 || !strings.Contains(conf, "1") {
		t.Fatalf("run-now confirmation %d:\n%s", code, conf)
	}
	after0, _ := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	if len(after0) != 5 || after0[0].Score != before[0].Score || after0[4].Score != before[4].Score {
		t.Fatalf("the confirmation page changed the delayed set")
	}
	b.post(action, confirmForm(t, conf), nil)
	after, _ := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	now, _ := rdb.Time(ctx).Result()
	if len(after) != 5 {
		t.Fatalf("delayed set has %d members, want 5", len(after))
	}
	due, changed := 0, 0
	old := map[string]float64{}
	for _, z := range before {
		old[z.Member.(string)] = z.Score
	}
	for _, z := range after {
		if z.Score <= float64(now.UnixMilli()) {
			due++
		}
		if o, ok := old[z.Member.(string)]; !ok || o != z.Score {
			changed++
		}
	}
	if due != 1 || changed != 1 {
		t.Fatalf("run now made %d due and changed %d of 5, want 1 and 1", due, changed)
	}
	_ = redis.Nil
}
