package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/outbox"
	"github.com/pelicanqueue/pelican/stream"
)

// The job is written in the same transaction as the order it belongs to,
// and a relay moves it to its stream once the transaction has committed.
// (Runs against the PostgreSQL and Redis of the tests.)
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	const table, queue = "example_outbox", "example:outbox:orders"
	defer db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table)
	defer rdb.Del(ctx, queue)

	if err := outbox.CreateSchema(ctx, db, table); err != nil { // or outbox.SchemaSQL in a migration
		panic(err)
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Stream: queue, Table: table})
	if err != nil {
		panic(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	// ... INSERT INTO orders ... in tx ...
	job := &stream.Job{Type: "order.confirm", Payload: []byte(`{"order":42}`)}
	if err := w.Enqueue(ctx, tx, job); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	relay, err := outbox.NewRelay(db, rdb, outbox.RelayConfig{Table: table, Window: time.Hour})
	if err != nil {
		panic(err)
	}
	// Run(ctx) relays until ctx ends; one batch here.
	n, err := relay.RelayBatch(ctx)
	if err != nil {
		panic(err)
	}
	entries := rdb.XRange(ctx, queue, "-", "+").Val()
	fmt.Println("relayed", n, "entries", len(entries), entries[0].Values["job_id"] == job.ID)
	// Output: relayed 1 entries 1 true
}
