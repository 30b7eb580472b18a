package idem_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/idem/idemtest"
	"github.com/pelicanqueue/pelican/internal/pgtest"
	"github.com/pelicanqueue/pelican/internal/redistest"
)

// redisSetup returns a RedisStore on the shared Redis whose keys are put
// under a prefix of the test's own, deleted at the end of the test.
func redisSetup(t *testing.T, cfg idem.RedisConfig) idem.Store {
	t.Helper()
	rdb := redistest.Shared(t)
	return prefixed{idem.NewRedisStore(rdb, cfg), redistest.Prefix(t, rdb)}
}

// prefixed is a Store that puts every key of s under prefix p, as
// middleware.Idempotency does with its queue's namespace.
type prefixed struct {
	s idem.Store
	p string
}

func (s prefixed) Begin(ctx context.Context, key, owner string, lease time.Duration) (idem.Outcome, error) {
	return s.s.Begin(ctx, s.key(key), owner, lease)
}

func (s prefixed) Complete(ctx context.Context, key, owner string, result []byte) error {
	return s.s.Complete(ctx, s.key(key), owner, result)
}

func (s prefixed) Fail(ctx context.Context, key, owner, reason string) error {
	return s.s.Fail(ctx, s.key(key), owner, reason)
}

func (s prefixed) Release(ctx context.Context, key, owner string) error {
	return s.s.Release(ctx, s.key(key), owner)
}

func (s prefixed) Forget(ctx context.Context, key string, status idem.Status) (bool, error) {
	return s.s.Forget(ctx, s.key(key), status)
}

// key keeps the empty key empty, so that the store still refuses it.
func (s prefixed) key(k string) string {
	if k == "" {
		return ""
	}
	return s.p + k
}

// sqlSetup returns a SQLStore on a table of the test's own, dropped at the
// end of the test.
func sqlSetup(t *testing.T, cfg idem.SQLConfig) *idem.SQLStore {
	t.Helper()
	db := pgtest.Open(t)
	name := redistest.Name(t)
	cfg.Table = "idem_" + strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' {
			return r
		}
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, name[max(len(name)-40, 0):])
	s, err := idem.NewSQLStore(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + cfg.Table) })
	return s
}

func TestRedisStore_conformance(t *testing.T) {
	t.Parallel()
	idemtest.Run(t, func(t *testing.T) idem.Store { return redisSetup(t, idem.RedisConfig{}) })
}

// The record of key k is the Redis key k: the store adds no prefix, so the
// key the middleware names (the queue's namespace) is where the record is.
func TestRedisStore_key(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	key := "{" + redistest.Name(t) + "}:idem:invoice-1"
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	store := idem.NewRedisStore(rdb, idem.RedisConfig{})
	if _, err := store.Begin(t.Context(), key, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.Get(t.Context(), key).Result(); v != "pa" {
		t.Errorf("Redis key %q holds %q, want the processing record of a (\"pa\")", key, v)
	}
	if err := store.Complete(t.Context(), key, "a", []byte("r:1")); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.Get(t.Context(), key).Result(); v != "c1:ar:1" {
		t.Errorf("Redis key %q holds %q, want the completed record \"c1:ar:1\"", key, v)
	}
}

func TestSQLStore_conformance(t *testing.T) {
	t.Parallel()
	idemtest.Run(t, func(t *testing.T) idem.Store { return sqlSetup(t, idem.SQLConfig{}) })
}

// TestStores_retention: a finished record is forgotten after the retention,
// and the key starts again. A run in which more than the retention passed
// between the completion and the Begin that must find it (a busy machine)
// checked nothing, and runs again with a longer retention.
func TestStores_retention(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]func(t *testing.T, retention time.Duration) idem.Store{
		"redis": func(t *testing.T, r time.Duration) idem.Store { return redisSetup(t, idem.RedisConfig{Retention: r}) },
		"sql":   func(t *testing.T, r time.Duration) idem.Store { return sqlSetup(t, idem.SQLConfig{Retention: r}) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			redistest.Widen(t, "retention", 300*time.Millisecond, func(t *testing.T, retention time.Duration) time.Duration {
				st, ctx := s(t, retention), context.Background()
				if _, err := st.Begin(ctx, "k", "a", time.Minute); err != nil {
					t.Fatal(err)
				}
				completing := time.Now()
				if err := st.Complete(ctx, "k", "a", []byte("r")); err != nil {
					t.Fatal(err)
				}
				if o, _ := st.Begin(ctx, "k", "b", time.Minute); o.Status != idem.StatusCompleted {
					if d := time.Since(completing); d >= retention {
						t.Logf("Begin %v after the completion, beyond the %v retention: checked nothing", d, retention)
						return 4 * retention
					}
					t.Fatalf("Begin within retention = %+v, want completed", o)
				}
				start := time.Now()
				for {
					o, err := st.Begin(ctx, "k", "b", time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					if o.Status == idem.StatusStarted {
						return 0
					}
					if time.Since(start) > 5*time.Second+retention {
						t.Fatalf("completed record still there %v after a %v retention", time.Since(start), retention)
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		})
	}
}

func TestSQLStore_CompleteTx(t *testing.T) {
	t.Parallel()
	s := sqlSetup(t, idem.SQLConfig{})
	db := pgtest.Open(t)
	ctx := context.Background()
	biz := s.Table() + "_biz"
	if _, err := db.Exec("CREATE TABLE " + biz + " (k text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + biz) })
	effect := func(owner string, commit bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+biz+" (k) VALUES ('k')"); err != nil {
			t.Fatal(err)
		}
		if err := s.CompleteTx(ctx, tx, "k", owner, []byte(owner)); err != nil {
			return err
		}
		if !commit {
			return nil
		}
		return tx.Commit()
	}
	rows := func() (n int) {
		if err := db.QueryRow("SELECT count(*) FROM " + biz).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const lease = 500 * time.Millisecond
	began := time.Now()
	if _, err := s.Begin(ctx, "k", "stale", lease); err != nil {
		t.Fatal(err)
	}
	// A rolled-back completion leaves the record processing (checked only
	// while the lease still holds: a loaded machine may outlast it).
	if err := effect("stale", false); err != nil {
		t.Fatal(err)
	}
	if o, _ := s.Begin(ctx, "k", "x", lease); o.Status != idem.StatusInProgress {
		if time.Since(began) < lease {
			t.Fatalf("after a rolled-back CompleteTx Begin = %+v, want in progress", o)
		}
		t.Logf("the check of the rolled-back completion was skipped: %v passed, beyond the %v lease", time.Since(began), lease)
	}
	for {
		o, err := s.Begin(ctx, "k", "new", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if o.Status == idem.StatusStarted {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := effect("stale", true); err == nil || !strings.Contains(err.Error(), idem.ErrNotOwner.Error()) {
		t.Fatalf("stale owner's CompleteTx = %v, want ErrNotOwner", err)
	}
	if n := rows(); n != 0 {
		t.Fatalf("business rows = %d after the stale owner's rolled-back write, want 0", n)
	}
	if err := effect("new", true); err != nil {
		t.Fatal(err)
	}
	// The middleware's own Complete after the handler's CompleteTx is a no-op.
	if err := s.Complete(ctx, "k", "new", nil); err != nil {
		t.Fatalf("Complete after CompleteTx by the same owner: %v", err)
	}
	o, _ := s.Begin(ctx, "k", "late", time.Minute)
	if o.Status != idem.StatusCompleted || string(o.Result) != "new" || rows() != 1 {
		t.Fatalf("Begin = %+v, rows %d; want completed with result %q and 1 row", o, rows(), "new")
	}
}

func TestSQLStore_PurgeExpired(t *testing.T) {
	t.Parallel()
	s := sqlSetup(t, idem.SQLConfig{Retention: 50 * time.Millisecond})
	ctx := context.Background()
	for i := range 3 {
		k := fmt.Sprint(i)
		if _, err := s.Begin(ctx, k, "a", time.Minute); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			if err := s.Complete(ctx, k, "a", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(100 * time.Millisecond) // the retention must pass; nothing to poll
	n, err := s.PurgeExpired(ctx)
	if err != nil || n != 2 {
		t.Fatalf("PurgeExpired = %d, %v; want the 2 finished records", n, err)
	}
	if o, _ := s.Begin(ctx, "2", "b", time.Minute); o.Status != idem.StatusInProgress {
		t.Fatalf("the processing record was purged: %+v", o)
	}
}

func TestNewSQLStore_rejectsBadTable(t *testing.T) {
	t.Parallel()
	for _, tbl := range []string{"a;drop", "a b", "1a", "a.b.c"} {
		if _, err := idem.NewSQLStore(nil, idem.SQLConfig{Table: tbl}); err == nil {
			t.Errorf("NewSQLStore(Table %q): nil error", tbl)
		}
	}
}

func TestValidateRetention(t *testing.T) {
	t.Parallel()
	h := idem.RetryHorizon(25, 10*time.Minute, 72*time.Hour)
	if h != 25*10*time.Minute+72*time.Hour {
		t.Fatalf("RetryHorizon = %v", h)
	}
	if err := idem.ValidateRetention(idem.DefaultRetention, h); err != nil {
		t.Fatal(err)
	}
	if err := idem.ValidateRetention(h, h); err == nil || !strings.Contains(err.Error(), "retention") {
		t.Fatalf("ValidateRetention(h, h) = %v", err)
	}
}
