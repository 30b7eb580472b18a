package lockx_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/lockx"
)

// A lock held while working on a customer, renewed while held, with its
// fencing token passed to the store it protects.
func Example() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Unix(1700000000, 0)) // Redis TIME, the fences' baseline
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	locks := lockx.New(rdb, lockx.Config{})

	l, err := locks.TryAcquire(ctx, "customer:7", 30*time.Second)
	if err != nil {
		panic(err)
	}
	l.KeepAlive(ctx) // extend every 10 s until Release
	fmt.Println("holding", l.Key(), "with fencing token", l.Fence())

	_, err = locks.TryAcquire(ctx, "customer:7", 30*time.Second)
	fmt.Println("second holder:", err, errors.Is(err, lockx.ErrNotObtained))

	// ... write to the store with l.Fence(); the store refuses lower tokens.
	if err := l.Release(ctx); err != nil {
		panic(err)
	}
	l, err = locks.Acquire(ctx, "customer:7", 30*time.Second, lockx.AcquireOptions{Wait: time.Second})
	if err != nil {
		panic(err)
	}
	defer l.Release(ctx)
	fmt.Println("next holder's fencing token", l.Fence())
	// Output:
	// holding customer:7 with fencing token 1700000000000000
	// second holder: lockx: not obtained true
	// next holder's fencing token 1700000000000001
}
