package dlq_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
)

func ExampleDLQ_Replay() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	// Two jobs dead-lettered as consumer/dead.lua writes them: the job's
	// fields, then the dead_* fields.
	for i, reason := range []string{"exhausted", "malformed"} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "{orders}:dlq", Values: []any{
			"type", "invoice.send", "payload", "{}", "job_id", fmt.Sprint("job-", i), "idempotency_key", fmt.Sprint("ik-", i),
			"attempt", "4", "dead_reason", reason, "dead_error", "smtp: timeout", "dead_at", "1800000000000",
			"dead_attempts", "5", "dead_consumer", "c1", "dead_entry_id", "1700000000000-0", "dead_stream", "orders",
		}})
	}

	d, err := dlq.New(rdb, "orders", dlq.Config{})
	if err != nil {
		panic(err)
	}
	f := dlq.Filter{Reasons: []string{"exhausted"}, ErrorContains: "timeout"}
	entries, _, err := d.List(ctx, f, 10, "")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		fmt.Println("dead:", e.Job.ID, e.Job.Type, e.Reason, e.Attempts)
	}

	res, err := d.Replay(ctx, f, dlq.ReplayOptions{Rate: 100})
	if err != nil {
		panic(err)
	}
	fmt.Println("replayed:", res.Replayed)

	msgs, _ := rdb.XRange(ctx, "orders", "-", "+").Result()
	v := msgs[0].Values
	fmt.Println("job:", v["job_id"], v["idempotency_key"], "attempt:", v["attempt"], "dead_reason:", v["dead_reason"], "replay_count:", v["replay_count"])
	left, _ := d.Count(ctx, dlq.Filter{})
	fmt.Println("left in the DLQ:", left)
	// Output:
	// dead: job-0 invoice.send exhausted 5
	// replayed: 1
	// job: job-0 ik-0 attempt: <nil> dead_reason: <nil> replay_count: 1
	// left in the DLQ: 1
}

func ExamplePartitioned() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	p, err := dlq.NewPartitioned(rdb, "orders", 3, dlq.Config{})
	if err != nil {
		panic(err)
	}
	// Three dead letters, in partitions 2, 0 and 1, in that order of IDs.
	for i, part := range []int{2, 0, 1} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: p.Partitions()[part].Stream(), ID: fmt.Sprint(1800000000000+i, "-0"), Values: []any{
			"type", "invoice.send", "payload", "{}", "job_id", fmt.Sprint("job-", i), "dead_reason", "exhausted",
		}})
	}
	page, next, _ := p.List(ctx, dlq.Filter{}, 2, "")
	for _, e := range page {
		fmt.Println(e.Job.ID, e.Stream)
	}
	fmt.Println("next:", next)
	res, _ := p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{Limit: 2})
	left, _ := p.Count(ctx, dlq.Filter{})
	fmt.Println("replayed:", res.Replayed, "left:", left)
	// Output:
	// job-0 {orders~3~2~3}:dlq
	// job-1 {orders~3~0~2}:dlq
	// next: 1800000000001-0@0
	// replayed: 2 left: 1
}
