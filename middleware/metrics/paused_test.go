package metrics_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/stream"
)

// pelican_paused follows control.Pause and Resume: the queue's series is
// always there (0 when running), a type's only while it is paused, and a
// timed pause that ended is 0 without a Resume.
func TestCollector_Paused(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Paused) })
	ctx := context.Background()
	scrape := func(want string) {
		t.Helper()
		col := metrics.NewCollector(rdb, metrics.CollectorConfig{Queues: []metrics.Queue{{Stream: name, Groups: []string{"g"}}}})
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(col)
		head := "# HELP pelican_paused 1 while the queue (type \"\") or one of its job types is paused (package control).\n# TYPE pelican_paused gauge\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(head+want), "pelican_paused"); err != nil {
			t.Error(err)
		}
	}
	scrape(fmt.Sprintf("pelican_paused{stream=%q,type=\"\"} 0\n", name))
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{Type: "email", Until: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	scrape(fmt.Sprintf("pelican_paused{stream=%[1]q,type=\"\"} 1\npelican_paused{stream=%[1]q,type=\"email\"} 1\n", name))
	// A pause whose end the Redis clock has passed, as Pause leaves it.
	now, _ := rdb.Time(ctx).Result()
	rdb.HSet(ctx, keys.Paused, "type:email", now.Add(-time.Second).UnixMilli())
	if err := control.Resume(ctx, rdb, name, control.ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	scrape(fmt.Sprintf("pelican_paused{stream=%q,type=\"\"} 0\n", name))
}
