package integration

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/pgtest"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// The idempotency worker: a consumer process with the Idempotency
// middleware, whose handler makes its effect in PostgreSQL (a row in a
// business table without a unique constraint, committed with the record by
// SQLStore.CompleteTx) or, with the Redis store, only in the ledger. It
// SIGKILLs itself at random points (PI_CRASH_RATE per point per run, from
// PI_SEED) or sleeps (the job's payload), and appends every event to
// PI_LEDGER: "<event> <key> <job_id> <consumer> <owner> <unix_ms>".

func init() { subprocessModes["idemworker"] = idemWorkerMain }

// idemPayload is the payload of the idempotency worker's jobs.
type idemPayload struct {
	// SleepMS is how long the handler works before its effect.
	SleepMS int `json:"sleep_ms,omitempty"`
	// SleepOn limits the sleep to the consumer of that name ("" means all).
	SleepOn string `json:"sleep_on,omitempty"`
	// StallMS is how long the handler waits between its INSERT and its
	// CompleteTx (SQL store), ignoring its context: a worker that stalls
	// past its lease.
	StallMS int `json:"stall_ms,omitempty"`
	// StallOn limits the stall to the consumer of that name ("" means all).
	StallOn string `json:"stall_on,omitempty"`
}

// Crash points of the idempotency worker. With PI_LOCK (a lock TTL), the
// worker runs middleware.Lock directly outside Idempotency (fused with it:
// one script takes the lock and begins the record, one finishes the record
// and releases the lock), with the job's idempotency key as lock key, and
// can also crash at "after_finish": after both, before the acknowledgement.
// PI_POINTS limits the crash points to a comma list.
var idemCrashPoints = []string{"before", "after_insert", "after_commit", "after_finish"}

func idemWorkerMain() int {
	env := os.Getenv
	dur := func(k string) time.Duration { d, _ := time.ParseDuration(env(k)); return d }
	num := func(k string) int { n, _ := strconv.Atoi(env(k)); return n }
	me := env("PI_CONSUMER")
	ledger, err := os.OpenFile(env("PI_LEDGER"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var lmu sync.Mutex
	record := func(event, key string, job *stream.Job, owner string) {
		lmu.Lock()
		defer lmu.Unlock()
		if owner == "" {
			owner = "-"
		}
		fmt.Fprintf(ledger, "%s %s %s %s %s %d\n", event, key, job.ID, me, owner, time.Now().UnixMilli())
	}
	rdb := redis.NewClient(&redis.Options{Addr: env("PI_ADDR"), MaxRetries: -1})
	defer rdb.Close()

	var (
		store    idem.Store
		sqlStore *idem.SQLStore
		db       *sql.DB
	)
	if tbl := env("PI_TABLE"); tbl != "" {
		db, err = sql.Open("pgx", pgtest.DSN())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer db.Close()
		sqlStore, err = idem.NewSQLStore(db, idem.SQLConfig{Table: tbl})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		store = sqlStore
	} else {
		store = idem.NewRedisStore(rdb, idem.RedisConfig{})
	}
	biz := env("PI_BIZ")
	seed, _ := strconv.ParseUint(env("PI_SEED"), 10, 64)
	rate, _ := strconv.ParseFloat(env("PI_CRASH_RATE"), 64)
	var rmu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, uint64(os.Getpid())))
	points := idemCrashPoints
	if env("PI_POINTS") != "" {
		points = strings.Split(env("PI_POINTS"), ",")
	}
	crashPoint := func() string {
		rmu.Lock()
		defer rmu.Unlock()
		for _, p := range points {
			if p != "after_finish" && rng.Float64() < rate {
				return p
			}
		}
		return ""
	}
	crash := func(point, key string, job *stream.Job, owner string) {
		record("crash_"+point, key, job, owner)
		lmu.Lock() // no more ledger lines from this process
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}

	handler := consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		claim, ok := idem.ClaimFromContext(ctx)
		if !ok {
			return consumer.Permanent(errors.New("no idempotency claim"))
		}
		var p idemPayload
		if err := job.Decode(&p); err != nil {
			return err
		}
		record("start", claim.Key, job, claim.Owner)
		point := crashPoint()
		if p.SleepMS > 0 && (p.SleepOn == "" || p.SleepOn == me) {
			select {
			case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		if point == "before" {
			crash(point, claim.Key, job, claim.Owner)
		}
		if sqlStore != nil {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+biz+" (key, job_id, owner) VALUES ($1, $2, $3)",
				claim.Key, job.ID, claim.Owner); err != nil {
				return err
			}
			if point == "after_insert" {
				crash(point, claim.Key, job, claim.Owner)
			}
			if p.StallMS > 0 && (p.StallOn == "" || p.StallOn == me) {
				record("stall", claim.Key, job, claim.Owner)
				time.Sleep(time.Duration(p.StallMS) * time.Millisecond)
			}
			if err := sqlStore.CompleteTx(ctx, tx, claim.Key, claim.Owner, []byte(job.ID)); err != nil {
				record("not_owner", claim.Key, job, claim.Owner)
				return err
			}
			if err := tx.Commit(); err != nil {
				return err
			}
		} else {
			claim.SetResult([]byte(job.ID))
		}
		record("effect", claim.Key, job, claim.Owner)
		if point == "after_commit" {
			crash(point, claim.Key, job, claim.Owner)
		}
		return nil
	})
	// Outside the idempotency middleware: records each attempt, before the
	// middleware begins the record, and its snoozes.
	observe := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			record("attempt", job.IdempotencyKey, job, "")
			err := next.Process(ctx, job)
			var o *consumer.Outcome
			if errors.As(err, &o) && !o.CountsAttempt() && !o.IsDead() {
				record("snooze", job.IdempotencyKey, job, "")
			}
			return err
		})
	}
	idemMW := middleware.Idempotency(store, middleware.IdempotencyConfig{
		Lease:           dur("PI_LEASE"),
		InProgressDelay: 100 * time.Millisecond,
		OnHit: func(_ context.Context, job *stream.Job, result []byte) {
			record("hit", job.IdempotencyKey, job, string(result))
		},
	})
	mws := []consumer.Middleware{observe, idemMW}
	if env("PI_LOCK") != "" {
		afterFinish := func(next consumer.Handler) consumer.Handler {
			return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				err := next.Process(ctx, job)
				if err == nil {
					record("finished", job.IdempotencyKey, job, "")
				}
				rmu.Lock()
				c := slices.Contains(points, "after_finish") && rng.Float64() < rate
				rmu.Unlock()
				if err == nil && c {
					crash("after_finish", job.IdempotencyKey, job, "")
				}
				return err
			})
		}
		lock := middleware.Lock(rdb, middleware.LockConfig{TTL: dur("PI_LOCK"), ConflictDelay: 100 * time.Millisecond,
			Key: func(j *stream.Job) string { return j.IdempotencyKey }})
		mws = []consumer.Middleware{observe, afterFinish, lock, idemMW}
	}
	visibility := dur("PI_VISIBILITY")
	c := consumer.New(rdb, consumer.Config{
		Stream:            env("PI_STREAM"),
		Group:             "g",
		Consumer:          me,
		VisibilityTimeout: visibility,
		SweepInterval:     100 * time.Millisecond,
		HeartbeatInterval: visibility / 4,
		Block:             200 * time.Millisecond,
		ShutdownTimeout:   2 * time.Second,
		Concurrency:       max(num("PI_CONCURRENCY"), 1),
		Prefetch:          num("PI_PREFETCH"),
		MaxCrashes:        100,
		PromoteInterval:   50 * time.Millisecond,
		Backoff:           consumer.Backoff{Base: 50 * time.Millisecond, Cap: 50 * time.Millisecond},
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}).Use(mws...).Handle(handler)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "PI_RUN_ERROR %v\n", err)
		return 3
	}
	return 0
}

// idemEvent is one line of the idempotency worker's ledger.
type idemEvent struct {
	Event, Key, JobID, Consumer, Owner string
	At                                 time.Time
}

func readIdemLedger(t testing.TB, path string) []idemEvent {
	t.Helper()
	var out []idemEvent
	for _, line := range ledgerLines(t, path) {
		fs := strings.Fields(line)
		if len(fs) != 6 {
			continue // a line cut short by SIGKILL
		}
		ms, err := strconv.ParseInt(fs[5], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, idemEvent{fs[0], fs[1], fs[2], fs[3], fs[4], time.UnixMilli(ms)})
	}
	return out
}

func idemCount(events []idemEvent, event string) int {
	n := 0
	for _, e := range events {
		if e.Event == event {
			n++
		}
	}
	return n
}

// idemScenario is a stream, a ledger, and either a SQL store (idempotency
// and business tables of the test's own) or the Redis store, whose records
// are in the stream's namespace.
type idemScenario struct {
	*scenario
	db     *sql.DB
	store  idem.Store
	table  string // idempotency table ("" for the Redis store)
	biz    string // business table
	prefix string // of the record keys: the queue's namespace, as the middleware's default
	ledger string
}

func newIdemScenario(t *testing.T, useSQL bool) *idemScenario {
	t.Helper()
	s := &idemScenario{scenario: newScenario(t, nil, "")}
	s.ledger = filepath.Join(t.TempDir(), "idem-ledger")
	s.prefix = s.keys.Idem
	if !useSQL {
		s.store = idem.NewRedisStore(s.rdb, idem.RedisConfig{})
		t.Cleanup(func() { redistest.DeleteKeys(s.rdb, s.prefix+"*") })
		return s
	}
	s.db = pgtest.Open(t)
	base := "it_" + strings.ToLower(strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
			return r
		}
		return '_'
	}, s.stream[max(len(s.stream)-30, 0):]))
	s.table, s.biz = base+"_idem", base+"_biz"
	st, err := idem.NewSQLStore(s.db, idem.SQLConfig{Table: s.table})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	// No unique constraint: only the idempotency record prevents duplicates.
	if _, err := s.db.ExecContext(ctx, "CREATE TABLE "+s.biz+" (key text NOT NULL, job_id text NOT NULL, owner text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.db.Exec("DROP TABLE IF EXISTS " + s.table)
		s.db.Exec("DROP TABLE IF EXISTS " + s.biz)
	})
	s.store = st
	return s
}

type idemWorkerOpts struct {
	Lease, Visibility time.Duration
	CrashRate         float64
	Seed              uint64
	Concurrency       int           // defaults to 8
	Prefetch          int           // 0: the default; negative disables
	Lock              time.Duration // PI_LOCK: Lock fused with Idempotency, with this TTL
	Points            string        // PI_POINTS: the crash points, a comma list (all by default)
}

func (s *idemScenario) worker(name string, o idemWorkerOpts) *worker {
	s.t.Helper()
	return startSubprocess(s.t, "idemworker",
		"PI_ADDR="+s.addr, "PI_STREAM="+s.stream, "PI_CONSUMER="+name, "PI_LEDGER="+s.ledger,
		"PI_TABLE="+s.table, "PI_BIZ="+s.biz,
		"PI_LEASE="+o.Lease.String(), "PI_VISIBILITY="+o.Visibility.String(),
		"PI_CONCURRENCY="+strconv.Itoa(cmp.Or(o.Concurrency, 8)), "PI_PREFETCH="+strconv.Itoa(o.Prefetch),
		"PI_SEED="+strconv.FormatUint(o.Seed, 10), "PI_CRASH_RATE="+strconv.FormatFloat(o.CrashRate, 'f', -1, 64),
		"PI_LOCK="+idemLockEnv(o.Lock), "PI_POINTS="+o.Points)
}

func idemLockEnv(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// enqueueKeys enqueues one job per key, with payload p.
func (s *idemScenario) enqueueKeys(keys []string, p idemPayload) {
	s.t.Helper()
	jobs := make([]*stream.Job, len(keys))
	for i, k := range keys {
		j, err := stream.NewJSONJob("idem", p)
		if err != nil {
			s.t.Fatal(err)
		}
		j.IdempotencyKey = k
		jobs[i] = j
	}
	prod := stream.NewProducer(s.rdb, stream.ProducerConfig{Stream: s.stream})
	for i := 0; i < len(jobs); i += 500 {
		if _, err := prod.EnqueueBatch(context.Background(), jobs[i:min(i+500, len(jobs))]); err != nil {
			s.t.Fatal(err)
		}
	}
}

// record reads the record of key straight from the store's backend,
// without Begin (which would take an expired record over): its status
// (processing, completed, failed; "" if there is none) and when it expires,
// by the store's clock.
func (s *idemScenario) record(key string) (status string, expires time.Time) {
	s.t.Helper()
	ctx := context.Background()
	if s.db != nil {
		err := s.db.QueryRowContext(ctx, "SELECT status, expires_at FROM "+s.table+" WHERE key = $1", s.prefix+key).Scan(&status, &expires)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			s.t.Fatal(err)
		}
		return status, expires
	}
	v, err := s.rdb.Get(ctx, s.prefix+key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		s.t.Fatal(err)
	}
	// The record's first letter is its status (see idem.RedisStore).
	status = map[string]string{"p": "processing", "c": "completed", "f": "failed"}[v[:min(len(v), 1)]]
	at, err := s.rdb.PExpireTime(ctx, s.prefix+key).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	if at < 0 { // no key (-2) or no expiry (-1)
		return status, time.Time{}
	}
	return status, time.UnixMilli(at.Milliseconds())
}

// settled reports whether the group has nothing pending and nothing
// delayed.
func (s *idemScenario) settled() (bool, string) {
	ctx := context.Background()
	p, err := s.rdb.XPending(ctx, s.stream, "g").Result()
	if err != nil {
		return false, err.Error()
	}
	d, err := s.rdb.ZCard(ctx, s.keys.Delayed).Result()
	if err != nil {
		return false, err.Error()
	}
	return p.Count == 0 && d == 0, fmt.Sprintf("pending %d, delayed %d", p.Count, d)
}

// bizRows returns the business table's row count and the keys with more
// than one row.
func (s *idemScenario) bizRows() (int, []string) {
	s.t.Helper()
	var n int
	if err := s.db.QueryRow("SELECT count(*) FROM " + s.biz).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	rows, err := s.db.Query("SELECT key FROM " + s.biz + " GROUP BY key HAVING count(*) > 1")
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	var dups []string
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		dups = append(dups, k)
	}
	return n, dups
}

// TestIdem_SQLCompleteTxSurvivesSIGKILL: 1,000 jobs whose effect is a row in
// a business table without a unique constraint, committed together with the
// idempotency record (CompleteTx). Workers SIGKILL themselves at random
// points (before the effect, after the INSERT before COMMIT, after COMMIT
// before the ack) and are restarted; the table ends with exactly one row per
// job.
func TestIdem_SQLCompleteTxSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	s := newIdemScenario(t, true)
	const n = 1000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("op-%04d", i)
	}
	s.enqueueKeys(keys, idemPayload{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	opts := idemWorkerOpts{Lease: time.Second, Visibility: 500 * time.Millisecond, CrashRate: 0.01, Seed: seed,
		Points: "before,after_insert,after_commit"}
	const slots = 2
	workers := make([]*worker, slots)
	restarts := 0
	start := time.Now()
	for i := range workers {
		opts.Seed = seed + uint64(i)
		workers[i] = s.worker(fmt.Sprintf("w%d", i), opts)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		var completed int
		if err := s.db.QueryRow("SELECT count(*) FROM " + s.table + " WHERE status = 'completed'").Scan(&completed); err != nil {
			t.Fatal(err)
		}
		if done, _ := s.settled(); done && completed == n {
			break
		}
		if time.Now().After(deadline) {
			_, msg := s.settled()
			t.Fatalf("not done after 90 s: %d of %d completed, %s, %d restarts", completed, n, msg, restarts)
		}
		for i, w := range workers {
			select {
			case <-w.done:
				if !w.killed() {
					t.Fatalf("worker %d exited by itself: %v", i, w.err)
				}
				restarts++
				opts.Seed = seed + uint64(slots*restarts+i)
				workers[i] = s.worker(fmt.Sprintf("w%d", i), opts)
			default:
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	for _, w := range workers {
		w.term()
	}
	for _, w := range workers {
		_ = w.wait(10 * time.Second)
	}
	rows, dups := s.bizRows()
	ev := readIdemLedger(t, s.ledger)
	crashes := map[string]int{}
	for _, p := range strings.Split(opts.Points, ",") {
		crashes[p] = idemCount(ev, "crash_"+p)
	}
	t.Logf("%d jobs in %v: %d restarts, crashes %v, %d effects, %d hits, %d snoozes, %d not-owner",
		n, elapsed.Round(time.Millisecond), restarts, crashes, idemCount(ev, "effect"), idemCount(ev, "hit"),
		idemCount(ev, "snooze"), idemCount(ev, "not_owner"))
	if rows != n || len(dups) > 0 {
		t.Fatalf("business table has %d rows (want %d); keys with more than one row: %v", rows, n, dups)
	}
	var distinct int
	if err := s.db.QueryRow("SELECT count(DISTINCT key) FROM " + s.biz).Scan(&distinct); err != nil || distinct != n {
		t.Fatalf("distinct keys %d, %v; want %d", distinct, err, n)
	}
	// The test must have exercised every crash point, the completed-record
	// hit (crash after commit) and the takeover (crash before commit).
	for p, c := range crashes {
		if c == 0 {
			t.Errorf("no crash at %q: the test did not exercise it (seed %d)", p, seed)
		}
	}
	if idemCount(ev, "hit") == 0 {
		t.Errorf("no idempotency hit: a crash after commit must be redelivered and acked as a hit")
	}
}

// TestIdem_FusedLockSurvivesSIGKILL: Lock fused with Idempotency on Redis
// (one script locks and begins, one completes and releases), workers
// SIGKILLed at random before the effect (after the first script) and after
// both scripts (before the acknowledgement): every operation completes with
// an effect, none has an effect after its completion script ran (a crash
// after it is redelivered as a hit), a crash before the effect is taken
// over once the lock and the lease pass, and no lock is left held. (A kill
// also ends the other jobs of the process, some between their effect and
// their completion: those run again, at least once, as documented.)
func TestIdem_FusedLockSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	s := newIdemScenario(t, false)
	const n = 300
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("op-%04d", i)
	}
	s.enqueueKeys(keys, idemPayload{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	opts := idemWorkerOpts{Lease: time.Second, Lock: time.Second, Visibility: 500 * time.Millisecond, CrashRate: 0.02,
		Seed: seed, Points: "before,after_finish"}
	const slots = 2
	workers := make([]*worker, slots)
	restarts := 0
	for i := range workers {
		opts.Seed = seed + uint64(i)
		workers[i] = s.worker(fmt.Sprintf("w%d", i), opts)
	}
	recordKeys := make([]string, n)
	for i, k := range keys {
		recordKeys[i] = s.prefix + k
	}
	completed := func() int { // records completed ("c…")
		vs, _ := s.rdb.MGet(context.Background(), recordKeys...).Result()
		c := 0
		for _, v := range vs {
			if str, ok := v.(string); ok && strings.HasPrefix(str, "c") {
				c++
			}
		}
		return c
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if done, _ := s.settled(); done && completed() == n {
			break
		}
		if time.Now().After(deadline) {
			_, msg := s.settled()
			t.Fatalf("not done after 2 minutes: %s, %d restarts", msg, restarts)
		}
		for i, w := range workers {
			select {
			case <-w.done:
				if !w.killed() {
					t.Fatalf("worker %d exited by itself: %v", i, w.err)
				}
				restarts++
				opts.Seed = seed + uint64(slots*restarts+i)
				workers[i] = s.worker(fmt.Sprintf("w%d", i), opts)
			default:
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, w := range workers {
		w.term()
	}
	for _, w := range workers {
		_ = w.wait(10 * time.Second)
	}
	ev := readIdemLedger(t, s.ledger)
	effects := map[string]int{}
	finished := map[string]bool{} // by idempotency key
	for _, e := range ev {
		switch e.Event {
		case "effect":
			k := strings.TrimPrefix(e.Key, s.prefix)
			if finished[k] {
				t.Errorf("operation %s had an effect (by %s) after its completion script ran", k, e.Consumer)
			}
			effects[e.Key]++
		case "finished":
			finished[e.Key] = true
		}
	}
	t.Logf("%d jobs: %d restarts, crashes before %d, after finish %d; %d effects, %d hits, %d snoozes",
		n, restarts, idemCount(ev, "crash_before"), idemCount(ev, "crash_after_finish"), idemCount(ev, "effect"),
		idemCount(ev, "hit"), idemCount(ev, "snooze"))
	for _, k := range keys {
		if effects[s.prefix+k] == 0 {
			t.Errorf("operation %s had no effect", k)
		}
		status, _ := s.record(k)
		if status != "completed" {
			t.Errorf("operation %s: record %q, want completed", k, status)
		}
		// A lock is "<fence> <token>" while held, the fence alone after.
		if v, _ := s.rdb.Get(context.Background(), s.keys.Lock+"{"+k+"}").Result(); strings.Contains(v, " ") {
			if d, _ := s.rdb.PTTL(context.Background(), s.keys.Lock+"{"+k+"}").Result(); d > 0 {
				t.Errorf("operation %s: its lock is still held (%v left) after every job settled", k, d)
			}
		}
	}
	if idemCount(ev, "crash_before") == 0 || idemCount(ev, "crash_after_finish") == 0 {
		t.Errorf("crash points not all exercised (seed %d)", seed)
	}
	if idemCount(ev, "hit") == 0 {
		t.Errorf("no idempotency hit: a crash after the completion must be redelivered and acked as a hit")
	}
	t.Cleanup(func() { redistest.DeleteKeys(s.rdb, s.keys.Lock+"*") })
}

// TestIdem_DuplicateEnqueuesOneEffect: the same business operation enqueued
// 10 times at once under different job IDs, with 3 consumers: one effect,
// and the other 9 jobs are acknowledged as hits (some after being snoozed
// while the first ran).
func TestIdem_DuplicateEnqueuesOneEffect(t *testing.T) {
	t.Parallel()
	s := newIdemScenario(t, true)
	opts := idemWorkerOpts{Lease: 5 * time.Second, Visibility: time.Second}
	for i := range 3 {
		s.worker(fmt.Sprintf("c%d", i), opts)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { s.enqueueKeys([]string{"order-1"}, idemPayload{SleepMS: 300}) })
	}
	wg.Wait()
	eventually(t, 30*time.Second, func() (bool, string) {
		ev := readIdemLedger(t, s.ledger)
		done, msg := s.settled()
		return done && idemCount(ev, "hit") == 9,
			fmt.Sprintf("%s, %d effects, %d hits", msg, idemCount(ev, "effect"), idemCount(ev, "hit"))
	})
	ev := readIdemLedger(t, s.ledger)
	rows, _ := s.bizRows()
	jobs := map[string]bool{}
	for _, e := range ev {
		if e.Event == "hit" || e.Event == "effect" {
			jobs[e.JobID] = true
		}
	}
	t.Logf("%d effects, %d hits, %d snoozes, %d rows", idemCount(ev, "effect"), idemCount(ev, "hit"), idemCount(ev, "snooze"), rows)
	if rows != 1 || idemCount(ev, "effect") != 1 || idemCount(ev, "start") != 1 {
		t.Fatalf("%d rows, %d effects, %d starts; want one of each", rows, idemCount(ev, "effect"), idemCount(ev, "start"))
	}
	if len(jobs) != 10 {
		t.Fatalf("%d distinct jobs ended in an effect or a hit, want 10", len(jobs))
	}
	if idemCount(ev, "snooze") == 0 {
		t.Fatalf("no job was snoozed: the duplicates never met the operation in progress")
	}
}

// TestIdem_CrashedWorkersRecordTakenOver: a worker killed mid-handler
// leaves a processing record; another worker gets the job after the
// visibility timeout, is snoozed while the lease runs, and takes the record
// over after it: its effect comes no earlier than the record's lease end,
// read from the store after the crash (by the store's clock, the machine's).
//
// A run in which the crash came after the lease had already ended, or in
// which worker b first met the record after its lease ended (a busy machine
// slow to start b), could not check the snoozes and is repeated with a
// longer lease.
func TestIdem_CrashedWorkersRecordTakenOver(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"redis", "sql"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			redistest.Widen(t, "lease", 2*time.Second, func(t *testing.T, lease time.Duration) time.Duration {
				return idemTakeOver(t, store == "sql", lease)
			})
		})
	}
}

// idemTakeOver runs one TestIdem_CrashedWorkersRecordTakenOver scenario; it
// returns a longer lease if the run could not check the snoozes.
func idemTakeOver(t *testing.T, useSQL bool, lease time.Duration) time.Duration {
	s := newIdemScenario(t, useSQL)
	opts := idemWorkerOpts{Lease: lease, Visibility: 500 * time.Millisecond}
	a := s.worker("a", opts)
	s.enqueueKeys([]string{"op"}, idemPayload{SleepMS: 600_000, SleepOn: "a"})
	var attempt, started time.Time // a's attempt, before it began the record, and its handler's start
	eventually(t, time.Minute, func() (bool, string) {
		for _, e := range readIdemLedger(t, s.ledger) {
			switch {
			case e.Consumer != "a":
			case e.Event == "attempt":
				attempt = e.At
			case e.Event == "start":
				started = e.At
				return true, ""
			}
		}
		return false, "worker a has not started the job"
	})
	a.kill()
	status, leaseEnd := s.record("op")
	if status != "processing" {
		t.Fatalf("record after the crash has status %q, want processing", status)
	}
	// a began the record after its attempt, with the lease.
	if leaseEnd.Before(attempt.Add(lease)) {
		t.Fatalf("a's record expires at %v, %v after a's attempt; want at least the lease %v", leaseEnd, leaseEnd.Sub(attempt), lease)
	}
	if left := time.Until(leaseEnd); left <= 0 {
		t.Logf("the run checked nothing: the lease had ended %v before the crash was seen", -left)
		return 2 * lease
	}
	s.worker("b", opts)
	var bEffect idemEvent
	eventually(t, lease+time.Minute, func() (bool, string) {
		for _, e := range readIdemLedger(t, s.ledger) {
			if e.Event == "effect" {
				bEffect = e
				return true, ""
			}
		}
		return false, "no effect: the record was not taken over"
	})
	eventually(t, time.Minute, s.settled)
	ev := readIdemLedger(t, s.ledger)
	var bFirst time.Time // b's first meeting with the job: a snooze, or its start
	for _, e := range ev {
		if e.Consumer == "b" && (e.Event == "snooze" || e.Event == "start") {
			bFirst = e.At
			break
		}
	}
	t.Logf("lease ended %v after a's start (lease %v); b met the job %v before the lease end and made the effect %v after it, %d snoozes",
		leaseEnd.Sub(started), lease, leaseEnd.Sub(bFirst), bEffect.At.Sub(leaseEnd), idemCount(ev, "snooze"))
	if bEffect.Consumer != "b" || idemCount(ev, "effect") != 1 {
		t.Fatalf("effects: %d, the first by %s; want one, by b", idemCount(ev, "effect"), bEffect.Consumer)
	}
	// The ledger's times are whole milliseconds.
	if bEffect.At.Before(leaseEnd.Truncate(time.Millisecond)) {
		t.Fatalf("b made the effect at %v, %v before a's lease ended at %v", bEffect.At, leaseEnd.Sub(bEffect.At), leaseEnd)
	}
	if idemCount(ev, "snooze") == 0 {
		if !bFirst.Before(leaseEnd.Truncate(time.Millisecond)) {
			t.Logf("the run checked nothing: b met the job %v after the lease ended", bFirst.Sub(leaseEnd))
			return 2 * bFirst.Sub(started)
		}
		t.Fatalf("b was never snoozed: it met the job %v before a's lease ended and did not meet a's record in progress", leaseEnd.Sub(bFirst))
	}
	if o, _ := s.store.Begin(context.Background(), s.prefix+"op", "probe", time.Minute); o.Status != idem.StatusCompleted || o.Owner != bEffect.Owner {
		t.Fatalf("record = %+v, want completed by b (%s)", o, bEffect.Owner)
	}
	if s.db != nil {
		if rows, _ := s.bizRows(); rows != 1 {
			t.Fatalf("business rows = %d, want 1", rows)
		}
	}
	return 0
}

// TestIdem_StaleOwnerCannotCommit: a worker that stalls between its INSERT
// and CompleteTx for longer than the lease loses the record to a duplicate
// job of the same operation, still running when the stalled one wakes up;
// the stale CompleteTx fails (ErrNotOwner), its transaction rolls back, and
// its job ends as a hit once the new owner committed: one row, the new
// owner's.
func TestIdem_StaleOwnerCannotCommit(t *testing.T) {
	t.Parallel()
	s := newIdemScenario(t, true)
	// a runs one job at a time with a 1 s lease, and stalls 3 s in it; b
	// runs the duplicate for 4 s under a 10 s lease (a holds no job
	// queued: Prefetch disabled, so that the duplicate goes to b).
	s.worker("a", idemWorkerOpts{Lease: time.Second, Visibility: 500 * time.Millisecond, Concurrency: 1, Prefetch: -1})
	s.enqueueKeys([]string{"op"}, idemPayload{StallMS: 3000, StallOn: "a"})
	eventually(t, 10*time.Second, func() (bool, string) {
		return idemCount(readIdemLedger(t, s.ledger), "stall") == 1, "worker a has not stalled"
	})
	s.worker("b", idemWorkerOpts{Lease: 10 * time.Second, Visibility: 500 * time.Millisecond})
	// The duplicate takes the record over after the lease and works 4 s,
	// so it is still processing when the stalled run tries to commit.
	s.enqueueKeys([]string{"op"}, idemPayload{SleepMS: 4000})
	eventually(t, 30*time.Second, func() (bool, string) {
		ev := readIdemLedger(t, s.ledger)
		done, msg := s.settled()
		return done && idemCount(ev, "hit") == 1, fmt.Sprintf("%s, %d effects, %d hits, %d not-owner",
			msg, idemCount(ev, "effect"), idemCount(ev, "hit"), idemCount(ev, "not_owner"))
	})
	ev := readIdemLedger(t, s.ledger)
	rows, _ := s.bizRows()
	var stale, refused, effect string
	for _, e := range ev {
		switch e.Event {
		case "stall":
			stale = e.Owner
		case "not_owner":
			refused = e.Owner
		case "effect":
			effect = e.Owner
		}
	}
	t.Logf("%d rows, %d effects, %d not-owner, %d hits, %d snoozes", rows, idemCount(ev, "effect"),
		idemCount(ev, "not_owner"), idemCount(ev, "hit"), idemCount(ev, "snooze"))
	if rows != 1 || idemCount(ev, "effect") != 1 || idemCount(ev, "not_owner") != 1 {
		t.Fatalf("%d rows, %d effects, %d not-owner; want 1, 1, 1", rows, idemCount(ev, "effect"), idemCount(ev, "not_owner"))
	}
	if refused != stale || effect == stale {
		t.Fatalf("CompleteTx refused %q and the effect is %q's; want the stale owner %q refused", refused, effect, stale)
	}
	var owner string
	if err := s.db.QueryRow("SELECT owner FROM " + s.biz).Scan(&owner); err != nil || owner != effect {
		t.Fatalf("the business row is %q's (%v), want the new owner %q's", owner, err, effect)
	}
}
