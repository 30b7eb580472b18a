package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/stream"
)

// A service mounts the dashboard under a prefix of its own, behind its own
// authorization.
func ExampleNew() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "emails"})
	job, _ := stream.NewJSONJob("email.send", map[string]string{"to": "ana@example.com"})
	if _, err := p.Enqueue(context.Background(), job); err != nil {
		panic(err)
	}

	dash, err := dashboard.New(rdb, dashboard.Config{
		Streams:  []string{"emails"},
		ReadOnly: true,
		Authorize: func(r *http.Request) error {
			if r.Header.Get("X-Role") != "ops" {
				return dashboard.ErrUnauthenticated
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	defer dash.Close()
	mux := http.NewServeMux()
	mux.Handle("/jobs/", http.StripPrefix("/jobs", dash))

	for _, role := range []string{"", "ops"} {
		req := httptest.NewRequest("GET", "/jobs/", nil)
		req.Header.Set("X-Role", role)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		body := w.Body.String()
		fmt.Println(w.Code, strings.Contains(body, `href="/jobs/queues/emails"`))
	}
	// Output:
	// 401 false
	// 200 true
}

// A partitioned queue (stream.Partitions) is named with its partition
// count, as metrics.PartitionedQueue and pelican's --partitions take it:
// the overview shows it as one queue.
func ExampleConfig_partitions() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	p, _ := stream.NewPartitionedProducer(rdb, stream.PartitionedProducerConfig{Queue: "orders", Partitions: 4})
	job, _ := stream.NewJSONJob("order.ship", map[string]int{"order": 42})
	if _, _, err := p.Enqueue(context.Background(), job); err != nil {
		panic(err)
	}

	dash, err := dashboard.New(rdb, dashboard.Config{Partitions: map[string]int{"orders": 4}, ReadOnly: true})
	if err != nil {
		panic(err)
	}
	defer dash.Close()
	w := httptest.NewRecorder()
	dash.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	body := w.Body.String()
	fmt.Println(w.Code, strings.Contains(body, `href="/queues/orders"`), strings.Contains(body, "4 partitions"), strings.Contains(body, "{orders~4~"))

	_, err = dashboard.New(rdb, dashboard.Config{Partitions: map[string]int{"orders": 0}})
	fmt.Println(err)
	// Output:
	// 200 true true false
	// dashboard: Config.Partitions["orders"] (0): stream: partition count 0 must be between 1 and 1024
}
