package claim_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/claim"
)

func ExampleClaimer_Sweep() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	mr.SetTime(time.UnixMilli(1_700_000_000_000))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	// worker-1 reads a job, then dies without acknowledging it.
	rdb.XGroupCreateMkStream(ctx, "jobs", "workers", "0")
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: "jobs", ID: "1700000000000-0", Values: []string{"type", "email.send"}})
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "workers", Consumer: "worker-1", Streams: []string{"jobs", ">"}, Block: -1,
	})

	// A minute later worker-2, with 4 free slots, sweeps with a 30 s
	// visibility timeout and takes the job over.
	mr.SetTime(time.UnixMilli(1_700_000_060_000))
	c := claim.New(rdb, "jobs", "workers", "worker-2", claim.Oversize{MaxBytes: 16 << 20, KeepFields: 1100, KeepBytes: 1024})
	free := 4
	take := func(max int) int {
		n := min(free, max)
		free -= n
		return n
	}
	handle := func(reserved int, claimed []claim.Entry, deleted []string) {
		free += reserved - len(claimed) // give back the unused slots
		for _, e := range claimed {
			fmt.Println("claimed", e.ID, e.Field("type"), "delivery", e.Deliveries)
		}
		for _, id := range deleted {
			fmt.Println("lost", id)
		}
	}
	if err := c.Sweep(ctx, 30*time.Second, take, handle); err != nil {
		panic(err)
	}
	fmt.Println("free slots:", free)
	// Output:
	// claimed 1700000000000-0 email.send delivery 2
	// free slots: 3
}
