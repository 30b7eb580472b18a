package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/pgtest"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// TestRelay_postgresRestart restarts PostgreSQL (an immediate stop: every
// connection cut, as by a crash) while a relay runs and jobs are being
// committed: the relay and its LISTEN connection recover by themselves, and
// every committed job reaches the stream once.
func TestRelay_postgresRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	db := srv.Open(t)
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { rdb.Del(context.Background(), name) })
	ctx := context.Background()
	if err := CreateSchema(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(WriterConfig{Stream: name})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRelay(db, rdb, RelayConfig{ListenDSN: srv.DSN(), PollInterval: 50 * time.Millisecond, Window: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		<-done
	}()
	b := &bundle{db: db, rdb: rdb, stream: name, table: DefaultTable, writer: w}

	var ids []string
	commit := func(n int) {
		// A commit may fail while the server restarts: retry the
		// transaction (its jobs were never committed) until it succeeds.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			tx, err := db.BeginTx(ctx, nil)
			if err == nil {
				var batch []string
				for range n {
					j := &stream.Job{Type: "t"}
					if err = w.Enqueue(ctx, tx, j); err != nil {
						break
					}
					batch = append(batch, j.ID)
				}
				if err == nil {
					if err = tx.Commit(); err == nil {
						ids = append(ids, batch...)
						return
					}
				} else {
					_ = tx.Rollback()
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("cannot commit for 2 minutes: %v", err)
			}
		}
	}
	for range 10 {
		commit(50)
	}
	srv.Restart()
	for range 10 {
		commit(50)
	}
	// The relay relays them all, without a duplicate.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := b.inStream(t)
		if len(got) == len(ids) {
			for _, id := range ids {
				if got[id] != 1 {
					t.Errorf("job %s is in the stream %d times; want 1", id, got[id])
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream holds %d of %d jobs 2 minutes after the restart", len(got), len(ids))
		}
		time.Sleep(10 * time.Millisecond) // polling the result
	}
	// The relay deletes a batch's rows after adding its jobs: the last
	// batch's rows may still be there when its jobs are seen in the stream.
	poll.Until(t, time.Minute, func() (bool, string) {
		n := b.rows(t)
		return n == 0, fmt.Sprintf("%d rows left a minute after every job was in the stream", n)
	})
	if got := b.inStream(t); len(got) != len(ids) {
		t.Errorf("the stream holds %d jobs once the rows are gone, want %d", len(got), len(ids))
	}
}
