package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/pgtest"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/outbox"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func a11Setup(t *testing.T) (table, name string) {
	db := pgtest.Open(t)
	rdb := redistest.Shared(t)
	n := redistest.Name(t)
	table = "a11_" + strings.NewReplacer(":", "_", "/", "_", ".", "_", "-", "_").Replace(strings.ToLower(n[len(n)-8:]))
	if err := outbox.CreateSchema(context.Background(), db, table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Exec("DROP TABLE IF EXISTS " + table)
		redistest.DeleteKeys(rdb, "{"+n+"}*")
	})
	return table, "{" + n + "}"
}

func a11Count(t *testing.T, rdb redis.UniversalClient, name string) map[string]int {
	msgs, err := rdb.XRange(context.Background(), name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, x := range msgs {
		j, err := stream.Decode(x.ID, x.Values)
		if err != nil {
			t.Fatal(err)
		}
		m[j.ID]++
	}
	return m
}

// Rolled-back transactions never reach the stream, committed ones once each, with
// writers and four relays (small batches) running at the same time; jobs sharing
// an idempotency key are still distinct jobs.
func TestAttack11_OutboxConcurrentRelaysRollback(t *testing.T) {
	table, name := a11Setup(t)
	db := pgtest.Open(t)
	rdb := redistest.Shared(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := outbox.NewWriter(outbox.WriterConfig{Stream: name, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	var rwg sync.WaitGroup
	for i := 0; i < 4; i++ {
		r, err := outbox.NewRelay(db, rdb, outbox.RelayConfig{Table: table, BatchSize: 7, PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rwg.Add(1)
		go func() { defer rwg.Done(); r.Run(ctx) }()
	}
	var (
		mu        sync.Mutex
		committed = map[string]bool{}
		rolled    = map[string]bool{}
		wwg       sync.WaitGroup
	)
	for g := 0; g < 6; g++ {
		wwg.Add(1)
		go func(g int) {
			defer wwg.Done()
			for i := 0; i < 20; i++ {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Error(err)
					return
				}
				var ids []string
				for k := 0; k < 3; k++ {
					j, _ := stream.NewJob("t", i)
					j.IdempotencyKey = fmt.Sprintf("ik%d", i%2) // shared keys across distinct jobs
					if err := w.Enqueue(ctx, tx, j); err != nil {
						t.Error(err)
						tx.Rollback()
						return
					}
					ids = append(ids, j.ID)
				}
				rollback := (g+i)%3 == 0
				if rollback {
					err = tx.Rollback()
				} else {
					err = tx.Commit()
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, id := range ids {
					if rollback {
						rolled[id] = true
					} else {
						committed[id] = true
					}
				}
				mu.Unlock()
			}
		}(g)
	}
	wwg.Wait()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var left int
		if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 && rdb.XLen(ctx, name).Val() >= int64(len(committed)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows left %d, stream %d, committed %d", left, rdb.XLen(ctx, name).Val(), len(committed))
		}
	}
	cancel()
	rwg.Wait()
	got := a11Count(t, rdb, name)
	for id, n := range got {
		if rolled[id] {
			t.Fatalf("rolled-back job %s in the stream", id)
		}
		if n != 1 {
			t.Fatalf("job %s in the stream %d times", id, n)
		}
	}
	for id := range committed {
		if got[id] != 1 {
			t.Fatalf("committed job %s in the stream %d times", id, got[id])
		}
	}
	if len(got) != len(committed) {
		t.Fatalf("stream has %d jobs, committed %d", len(got), len(committed))
	}
}

// The relay's add is applied but its reply is lost (the connection closes): the
// relay fails, rolls back, and the next attempt must add nothing more.
func TestAttack11_OutboxLostReply(t *testing.T) {
	table, name := a11Setup(t)
	db := pgtest.Open(t)
	shared := redistest.Shared(t)
	ctx := context.Background()
	px, err := faultproxy.Start(redistest.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { rdb.Close() })
	w, _ := outbox.NewWriter(outbox.WriterConfig{Stream: name, Table: table})
	tx, _ := db.BeginTx(ctx, nil)
	var ids []string
	for i := 0; i < 10; i++ {
		j, _ := stream.NewJob("t", i)
		if err := w.Enqueue(ctx, tx, j); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(db, rdb, outbox.RelayConfig{Table: table, BatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	rdb.Ping(ctx) // warm the single connection so the match is on an idle one
	px.DropReplies(1, "relayed:")
	errs := 0
	deadline := time.Now().Add(60 * time.Second)
	for {
		var left int
		db.QueryRow("SELECT count(*) FROM " + table).Scan(&left)
		if left == 0 {
			break
		}
		if _, err := r.RelayBatch(ctx); err != nil {
			errs++
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows left %d", left)
		}
	}
	if errs == 0 {
		t.Log("no relay error seen: the drop may not have matched")
	}
	got := a11Count(t, shared, name)
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("job %s %d times after a lost reply (relay errors %d)", id, got[id], errs)
		}
	}
	if len(got) != len(ids) {
		t.Fatalf("%d jobs in stream, want %d", len(got), len(ids))
	}
}

// Hostile table names must be refused or quoted, never run as SQL.
func TestAttack11_OutboxHostileTable(t *testing.T) {
	for _, tb := range []string{`x; DROP TABLE pg_class; --`, `a"b`, `x y`, ``} {
		if _, err := outbox.SchemaSQL(tb); err == nil && tb != "" {
			s, _ := outbox.SchemaSQL(tb)
			if strings.Contains(s, "DROP TABLE pg_class") && !strings.Contains(s, `"x; DROP`) {
				t.Fatalf("table %q gives unquoted SQL: %s", tb, s)
			}
		}
		if _, err := outbox.NewWriter(outbox.WriterConfig{Stream: "s", Table: tb}); err == nil && strings.ContainsAny(tb, `;" `) {
			t.Logf("writer accepted table %q", tb)
		}
	}
}

// Namespace collision: the relay's marker was {s}:once:outbox:<job id>, a
// producer's marker for idempotency key k is {s}:once:<k>, so a producer job
// whose (hostile, user-chosen) idempotency key was "outbox:<id>" made a
// committed outbox job with that ID vanish. The relay's markers now live in
// their own namespace ({s}:relayed:<job id>, ProducerConfig.OnceNamespace),
// which no idempotency key reaches.
func TestAttack11_OutboxMarkerCollision(t *testing.T) {
	table, name := a11Setup(t)
	db := pgtest.Open(t)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	w, _ := outbox.NewWriter(outbox.WriterConfig{Stream: name, Table: table})
	victim, _ := stream.NewJob("payment", 1)
	victim.ID = "0190a0a0-0000-7000-8000-000000000001"
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, EnqueueOnce: time.Hour})
	var hostile *stream.Job
	for _, k := range []string{"outbox:" + victim.ID, "relayed:" + victim.ID, ":relayed:" + victim.ID} {
		hostile, _ = stream.NewJob("spam", 2)
		hostile.IdempotencyKey = k
		if _, err := p.Enqueue(ctx, hostile); err != nil {
			t.Fatal(err)
		}
	}
	tx, _ := db.BeginTx(ctx, nil)
	if err := w.Enqueue(ctx, tx, victim); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r, _ := outbox.NewRelay(db, rdb, outbox.RelayConfig{Table: table})
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left int
		db.QueryRow("SELECT count(*) FROM " + table).Scan(&left)
		if left == 0 {
			break
		}
		if _, err := r.RelayBatch(ctx); err != nil {
			t.Log(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows left %d", left)
		}
	}
	got := a11Count(t, rdb, name)
	if got[victim.ID] != 1 {
		t.Fatalf("committed outbox job %s is in the stream %d times (stream: %v): a producer job with idempotency key %q suppressed it",
			victim.ID, got[victim.ID], got, hostile.IdempotencyKey)
	}
}
