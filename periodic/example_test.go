package periodic_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/periodic"
)

// Run a scheduler beside each consumer: however many run, each tick's job
// is enqueued once. Here one scheduler on an embedded Redis enqueues the
// first tick of a one-second heartbeat.
func Example() {
	m, _ := miniredis.Run()
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ny, _ := time.LoadLocation("America/New_York")

	s, err := periodic.New(rdb, periodic.Config{Stream: "reports", Schedules: []periodic.Schedule{
		{Name: "nightly", Type: "report.build", Cron: "30 2 * * *", Location: ny, Missed: periodic.RunOnce,
			Payload: []byte(`{"kind":"daily"}`)},
		{Name: "heartbeat", Type: "ping", Every: time.Second},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n, _ := rdb.XLen(ctx, "reports").Result(); n > 0 {
			break
		}
	}
	cancel()
	<-done

	msgs, _ := rdb.XRange(context.Background(), "reports", "-", "+").Result()
	id := msgs[0].Values["job_id"].(string)
	fmt.Println(id[:len("heartbeat@")], msgs[0].Values["type"], msgs[0].Values["idempotency_key"] == id)
	fmt.Println(periodic.JobID("nightly", time.Date(2026, 3, 9, 2, 30, 0, 0, ny)))
	// Output:
	// heartbeat@ ping true
	// nightly@2026-03-09T06:30:00.000Z
}

// Bad schedules fail in New, naming the field, before Redis is touched.
func ExampleConfig_Validate() {
	err := periodic.Config{Stream: "reports", Schedules: []periodic.Schedule{
		{Name: "nightly", Type: "report.build", Cron: "30 25 * * *"},
	}}.Validate()
	fmt.Println(err)
	// Output:
	// periodic: Config.Schedules[0]: Schedule "nightly": Cron ("30 25 * * *") does not parse: end of range (25) above maximum (23): 25
}
