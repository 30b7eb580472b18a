package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/pgtest"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

const childEnv = "OUTBOX_RELAY_CHILD"

// relayChild is a relay subprocess: it relays OUTBOX_TABLE of OUTBOX_DSN
// to REDIS_ADDR in batches of OUTBOX_BATCH until SIGTERM, and SIGKILLs
// itself at its OUTBOX_KILL point: "select:K" (the K-th batch locked,
// nothing added), "stream:K" (after the K-th add of one stream's jobs:
// inside a batch of two streams), "add:K" (the K-th batch added, its rows
// not deleted), or "" (the parent kills it).
func relayChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	db, err := sql.Open("pgx", os.Getenv("OUTBOX_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	batch, _ := strconv.Atoi(os.Getenv("OUTBOX_BATCH"))
	r, err := NewRelay(db, rdb, RelayConfig{Table: os.Getenv("OUTBOX_TABLE"), BatchSize: batch,
		PollInterval: 20 * time.Millisecond, Window: 10 * time.Minute, ListenDSN: os.Getenv("OUTBOX_DSN")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	point, k, _ := strings.Cut(os.Getenv("OUTBOX_KILL"), ":")
	at, _ := strconv.Atoi(k)
	count := 0
	hit := func(p string) error {
		if p == point {
			count++
			if count == at {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
		return nil
	}
	r.afterSelect = func(int) error { return hit("select") }
	r.afterStream = func(string) error { return hit("stream") }
	r.afterAdd = func(int) error { return hit("add") }
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

// startRelay starts a relay subprocess with kill point kill.
func startRelay(t *testing.T, dsn, table string, batch int, kill string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "OUTBOX_DSN="+dsn, "OUTBOX_TABLE="+table,
		"OUTBOX_BATCH="+strconv.Itoa(batch), "OUTBOX_KILL="+kill, "REDIS_ADDR="+redistest.Addr())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestRelay_kill relays 5,000 jobs over two streams with three relay
// processes that SIGKILL themselves at chosen points (rows locked; one
// stream's jobs added, the other's not; all added, rows not deleted) or are
// killed by the test at random moments, each replaced when it dies: every
// committed job reaches its stream exactly once, and no rolled-back one.
func TestRelay_kill(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := redistest.Name(t)
	t.Cleanup(func() { b.rdb.Del(context.Background(), other) })
	w2, err := NewWriter(WriterConfig{Stream: other, Table: b.table})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var committed, rolledBack []string
	for i := 0; len(committed) < 5000; i++ {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for k := range 50 {
			w := b.writer
			if k%2 == 1 {
				w = w2
			}
			j := &stream.Job{Type: "t", Payload: []byte(`{}`)}
			if err := w.Enqueue(ctx, tx, j); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, j.ID)
		}
		if i%10 == 9 {
			err, rolledBack = tx.Rollback(), append(rolledBack, ids...)
		} else {
			err, committed = tx.Commit(), append(committed, ids...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	points := []string{"select", "stream", "add", ""}
	kills := map[string]int{}
	procs := make([]*exec.Cmd, 3)
	exited := make([]chan struct{}, 3)
	start := func(i int) {
		p := points[rand.IntN(len(points))]
		kill := ""
		if p != "" {
			kill = fmt.Sprintf("%s:%d", p, 1+rand.IntN(3))
		}
		procs[i] = startRelay(t, pgtest.DSN(), b.table, 60, kill)
		exited[i] = make(chan struct{})
		cmd, done := procs[i], exited[i]
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		kills[p]++ // counted at start: a relay with a point dies there, unless the rows run out first
	}
	for i := range procs {
		start(i)
	}
	defer func() {
		for i, p := range procs {
			_ = p.Process.Kill()
			<-exited[i]
		}
	}()
	deadline := time.Now().Add(5 * time.Minute) // a hang, not a bound on speed
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	for b.rows(t) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows left after the deadline", b.rows(t))
		}
		<-tick.C
		for i := range procs {
			select {
			case <-exited[i]:
				start(i)
				continue
			default:
			}
			if rand.IntN(8) == 0 { // a random kill, wherever it is
				_ = procs[i].Process.Kill()
				<-exited[i]
				kills["random"]++
				start(i)
			}
		}
	}
	t.Logf("relays started by kill point: %v", kills)

	got := b.inStream(t)
	for id, n := range inStreamOf(t, b.rdb, other) {
		got[id] += n
	}
	for _, id := range committed {
		if got[id] != 1 {
			t.Errorf("committed job %s is in its stream %d times; want 1", id, got[id])
		}
	}
	for _, id := range rolledBack {
		if got[id] != 0 {
			t.Errorf("rolled-back job %s is in a stream", id)
		}
	}
	if total := len(got); total != len(committed) {
		t.Errorf("the streams hold %d jobs; want %d", total, len(committed))
	}
}

func inStreamOf(t *testing.T, rdb *redis.Client, name string) map[string]int {
	t.Helper()
	b := &bundle{rdb: rdb, stream: name}
	return b.inStream(t)
}
