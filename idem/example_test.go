package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/idem"
)

// A second owner finds the first one's operation in progress, then
// completed with its result.
func ExampleRedisStore() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	store := idem.NewRedisStore(rdb, idem.RedisConfig{})
	ctx := context.Background()

	// The key is the record's Redis key: here the one middleware.Idempotency
	// uses for idempotency_key "order-7" of queue "orders".
	const key = "{orders}:idem:order-7"
	o, _ := store.Begin(ctx, key, "worker-a", time.Minute)
	fmt.Println("a:", o.Status)
	o, _ = store.Begin(ctx, key, "worker-b", time.Minute)
	fmt.Println("b:", o.Status, "owned by", o.Owner)
	_ = store.Complete(ctx, key, "worker-a", []byte("receipt-1"))
	o, _ = store.Begin(ctx, key, "worker-b", time.Minute)
	fmt.Printf("b: %v %s\n", o.Status, o.Result)
	// Output:
	// a: started
	// b: in_progress owned by worker-a
	// b: completed receipt-1
}

// A handler that writes to PostgreSQL commits its write and the completion
// of the idempotency record in one transaction: a worker that dies before
// the commit leaves neither, one that dies after it leaves both, and the
// redelivery is a hit. The middleware (middleware.Idempotency) puts the
// Claim in the handler's context.
func ExampleSQLStore_CompleteTx() {
	var (
		db    *sql.DB         // opened with the pgx driver
		store *idem.SQLStore  // idem.NewSQLStore(db, idem.SQLConfig{})
		ctx   context.Context // the handler's context
	)
	handle := func() error {
		claim, ok := idem.ClaimFromContext(ctx)
		if !ok {
			return fmt.Errorf("no idempotency claim")
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO payments (order_key, amount) VALUES ($1, $2)", claim.Key, 42); err != nil {
			return err
		}
		// ErrNotOwner: the lease passed and another delivery took over;
		// the rollback undoes this write.
		if err := store.CompleteTx(ctx, tx, claim.Key, claim.Owner, []byte("paid")); err != nil {
			return err
		}
		return tx.Commit()
	}
	_ = handle
}
