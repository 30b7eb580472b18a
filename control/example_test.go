package control_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/control"
)

// Pause one job type for an hour, then the whole queue, and lift both.
func ExamplePause() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	_ = control.Pause(ctx, rdb, "orders", control.PauseOptions{Type: "invoice.send", Until: time.Now().Add(time.Hour)})
	_ = control.Pause(ctx, rdb, "orders", control.PauseOptions{})
	st, _ := control.State(ctx, rdb, "orders")
	fmt.Println("queue paused:", st.Queue, "types paused:", st.TypeNames())

	_ = control.Resume(ctx, rdb, "orders", control.ResumeOptions{All: true})
	st, _ = control.State(ctx, rdb, "orders")
	fmt.Println("anything paused:", st.Any())
	// Output:
	// queue paused: true types paused: [invoice.send]
	// anything paused: false
}
