package periodic

import (
	"context"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// TestScheduler_cluster runs two schedulers on a 3-master Redis Cluster for
// queues "orders" and "{shop}:orders": the tick script's keys share the
// stream's slot (no CROSSSLOT), and each tick is enqueued once.
func TestScheduler_cluster(t *testing.T) {
	t.Parallel()
	rdb := redistest.StartCluster(t, 3).Client(t)
	for _, name := range []string{"orders", "{shop}:orders"} {
		var runs []chan error
		ctx, cancel := context.WithCancel(context.Background())
		for range 2 {
			s, err := New(rdb, Config{Stream: name, Schedules: []Schedule{{Name: "hb", Type: "ping", Every: time.Second, Tolerance: time.Second}}})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			runs = append(runs, done)
		}
		waitLen(t, rdb, name, 2, time.Second)
		cancel()
		for _, d := range runs {
			<-d
		}
		count := map[int64]int{}
		for _, j := range entries(t, rdb, name) {
			count[tickOf(t, "hb", j.ID)]++
		}
		for tick, c := range count {
			if c != 1 {
				t.Errorf("%s: tick %d enqueued %d times", name, tick, c)
			}
		}
		recs, err := Records(context.Background(), rdb, name)
		if err != nil || len(recs) != 1 {
			t.Errorf("%s: Records = %v, %v", name, recs, err)
		}
	}
}
