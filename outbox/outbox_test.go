package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/pgtest"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// The tests run against the real PostgreSQL at PG_DSN and Redis at
// REDIS_ADDR, each in a table and a stream of its own.

type bundle struct {
	db     *sql.DB
	rdb    *redis.Client
	table  string
	stream string
	writer *Writer
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{db: pgtest.Open(t), rdb: redistest.Shared(t), stream: redistest.Name(t)}
	var r [6]byte
	_, _ = rand.Read(r[:])
	b.table = "outbox_test_" + hex.EncodeToString(r[:])
	ctx := context.Background()
	if err := CreateSchema(ctx, b.db, b.table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+b.table)
		b.rdb.Del(context.Background(), b.stream)
		// Markers expire after their window; these tests use short ones.
	})
	w, err := NewWriter(WriterConfig{Stream: b.stream, Table: b.table})
	if err != nil {
		t.Fatal(err)
	}
	b.writer = w
	return b
}

func (b *bundle) relay(t *testing.T, cfg RelayConfig) *Relay {
	t.Helper()
	cfg.Table = b.table
	if cfg.Window == 0 {
		cfg.Window = 10 * time.Minute
	}
	r, err := NewRelay(b.db, b.rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// enqueue writes n jobs in one transaction, committed or rolled back, and
// returns their IDs.
func (b *bundle) enqueue(t testing.TB, n int, commit bool) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		j := &stream.Job{Type: "t", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		if err := b.writer.Enqueue(ctx, tx, j); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// inStream returns how often each job ID is in the stream.
func (b *bundle) inStream(t testing.TB) map[string]int {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), b.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, m := range msgs {
		got[fmt.Sprint(m.Values[stream.FieldJobID])]++
	}
	return got
}

func (b *bundle) rows(t testing.TB) int {
	t.Helper()
	var n int
	if err := b.db.QueryRowContext(context.Background(), "SELECT count(*) FROM "+b.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWriter_Enqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, RelayConfig{})

	rolledBack := b.enqueue(t, 3, false)
	committed := b.enqueue(t, 3, true)
	n, err := r.RelayBatch(ctx)
	if err != nil || n != 3 {
		t.Fatalf("RelayBatch = %d, %v; want 3", n, err)
	}
	if n, err := r.RelayBatch(ctx); err != nil || n != 0 {
		t.Fatalf("second RelayBatch = %d, %v; want 0", n, err)
	}
	got := b.inStream(t)
	for _, id := range rolledBack {
		if got[id] != 0 {
			t.Errorf("rolled-back job %s is in the stream", id)
		}
	}
	for _, id := range committed {
		if got[id] != 1 {
			t.Errorf("committed job %s is in the stream %d times; want 1", id, got[id])
		}
	}
	if n := b.rows(t); n != 0 {
		t.Errorf("%d rows left; want the relayed rows deleted", n)
	}
	msgs := b.rdb.XRange(ctx, b.stream, "-", "+").Val()
	job, err := stream.Decode(msgs[0].ID, msgs[0].Values)
	if err != nil || job.Type != "t" || string(job.Payload) != `{"n":0}` || job.ID != committed[0] {
		t.Errorf("first entry decodes to %+v, %v", job, err)
	}
}

// TestRelay_crashAfterAdd: a relay whose transaction ends after its add and
// before its delete committed (a crash, a lost commit reply) leaves the
// rows; the next relay adds them again, and that adds nothing.
func TestRelay_crashAfterAdd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, RelayConfig{BatchSize: 7})
	ids := b.enqueue(t, 20, true)
	crash := errors.New("crash")
	crashes := 0
	r.afterAdd = func(int) error {
		crashes++
		if crashes%2 == 1 {
			return crash
		}
		return nil
	}
	for b.rows(t) > 0 {
		if _, err := r.RelayBatch(ctx); err != nil && !errors.Is(err, crash) {
			t.Fatal(err)
		}
	}
	got := b.inStream(t)
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("job %s is in the stream %d times; want 1", id, got[id])
		}
	}
	if len(got) != len(ids) || crashes < 6 {
		t.Errorf("stream holds %d jobs after %d adds; want %d", len(got), crashes, len(ids))
	}
}

// TestRelay_skipLocked: two relays at once never take the same rows.
func TestRelay_skipLocked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.enqueue(t, 10, true)
	r1, r2 := b.relay(t, RelayConfig{BatchSize: 5}), b.relay(t, RelayConfig{BatchSize: 5})
	inside := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free() // r1 must end before the table is dropped
	r1.afterSelect = func(int) error {
		close(inside)
		<-release
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := r1.RelayBatch(ctx)
		done <- err
	}()
	<-inside
	// r1 holds rows 1-5: r2 takes 6-10 without waiting (a relay that
	// waited for r1's locks would time out), then finds none.
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if n, err := r2.RelayBatch(wctx); err != nil || n != 5 {
		t.Fatalf("r2 RelayBatch = %d, %v; want 5 while r1 holds the others", n, err)
	}
	if n, err := r2.RelayBatch(ctx); err != nil || n != 0 {
		t.Fatalf("r2 second RelayBatch = %d, %v; want 0", n, err)
	}
	free()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := b.inStream(t); len(got) != 10 {
		t.Errorf("stream holds %d jobs; want 10", len(got))
	}
}

// TestRelay_notify: with a poll interval of an hour, a commit still reaches
// the stream at once: LISTEN wakes the relay.
func TestRelay_notify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, RelayConfig{ListenDSN: pgtest.DSN(), PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	// The first wake-up (after LISTEN) finds nothing; then each commit wakes it.
	for round := range 3 {
		ids := b.enqueue(t, 1, true)
		deadline := time.Now().Add(30 * time.Second)
		for b.inStream(t)[ids[0]] == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: job not relayed within 30s with PollInterval 1h", round)
			}
			time.Sleep(5 * time.Millisecond) // polling the result, not waiting for the relay
		}
	}
}

func TestNewRelay_badConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  RelayConfig
		want string
	}{
		{RelayConfig{Table: "Bad-Name"}, "RelayConfig.Table"},
		{RelayConfig{BatchSize: -1}, "RelayConfig.BatchSize"},
		{RelayConfig{PollInterval: -1}, "RelayConfig.PollInterval"},
		{RelayConfig{Window: time.Millisecond}, "RelayConfig.Window"},
		{RelayConfig{ListenDSN: "postgres://u:secret@[::1"}, "RelayConfig.ListenDSN"},
	} {
		_, err := NewRelay(nil, nil, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("NewRelay(%+v) = %v; want an error naming %s (and no password)", tc.cfg, err, tc.want)
		}
	}
	if _, err := NewWriter(WriterConfig{Stream: "a{b"}); err == nil || !strings.Contains(err.Error(), "WriterConfig.Stream") {
		t.Errorf("NewWriter with a bad stream: %v", err)
	}
}
