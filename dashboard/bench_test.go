package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// BenchmarkOverview renders the overview of 100 queues holding 1,000,000
// entries in all (10,000 each, 1 KiB of fields), each with a group that
// read half of them and holds 100 pending over 2 consumers, and 1,000 dead
// letters in each of 10 queues, on a private redis-server: with the
// default Config (named streams, and found by SCAN on every request), and
// with 1,000 and 1 dead letters counted by reason per queue instead of the
// default 100:
//
//	go test ./dashboard -run '^$' -bench Overview -benchtime 20x
func BenchmarkOverview(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	payload := make([]byte, 900)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	names := make([]string, 100)
	for q := range names {
		names[q] = fmt.Sprintf("bench-%03d", q)
		keys, _ := stream.KeysFor(names[q])
		for batch := 0; batch < 10_000; batch += 1000 {
			pipe := rdb.Pipeline()
			for range 1000 {
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: names[q], Values: []any{"v", "1", "type", "bench.job", "payload", payload}})
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		rdb.XGroupCreate(ctx, names[q], "workers", "0")
		for c := range 2 {
			rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: fmt.Sprint("w", c), Streams: []string{names[q], ">"}, Count: 50})
		}
		rdb.XGroupSetID(ctx, names[q], "workers", "+") // read everything else: lag 0
		if q%10 == 0 {
			pipe := rdb.Pipeline()
			for i := range 1000 {
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"v", "1", "type", "bench.job", "payload", payload,
					"dead_reason", []string{"permanent", "exhausted", "panic"}[i%3], "dead_error", "boom"}})
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, cfg := range []struct {
		name string
		cfg  dashboard.Config
	}{
		{"named", dashboard.Config{Streams: names}},
		{"scan", dashboard.Config{StreamsTTL: 1}}, // SCAN on every request
		{"reasons1000", dashboard.Config{Streams: names, ReasonScan: 1000}},
		{"reasons1", dashboard.Config{Streams: names, ReasonScan: 1}},
	} {
		d, err := dashboard.New(rdb, cfg.cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(cfg.name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				d.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
				if w.Code != http.StatusOK {
					b.Fatalf("GET / = %d", w.Code)
				}
			}
		})
		_ = d.Close()
	}
}
