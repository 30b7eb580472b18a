package claim_test

import (
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/claim"
)

// miniEnv is a miniredis with a frozen clock at t0, a client to it, and a
// stream "s" with group "g".
type miniEnv struct {
	t   *testing.T
	mr  *miniredis.Miniredis
	rdb *redis.Client
	t0  time.Time
}

const miniStream = "s"

func setupMini(t *testing.T) *miniEnv {
	t.Helper()
	mr := miniredis.RunT(t)
	t0 := time.UnixMilli(1_700_000_000_000)
	mr.SetTime(t0)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.XGroupCreateMkStream(t.Context(), miniStream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	return &miniEnv{t: t, mr: mr, rdb: rdb, t0: t0}
}

// at moves the server clock to t0+d.
func (m *miniEnv) at(d time.Duration) { m.mr.SetTime(m.t0.Add(d)) }

func (m *miniEnv) add(n int) []string {
	m.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := m.rdb.XAdd(m.t.Context(), &redis.XAddArgs{Stream: miniStream, Values: []any{"n", i}}).Result()
		if err != nil {
			m.t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

func (m *miniEnv) read(consumer string, count int) {
	m.t.Helper()
	err := m.rdb.XReadGroup(m.t.Context(), &redis.XReadGroupArgs{
		Group: group, Consumer: consumer, Streams: []string{miniStream, ">"}, Count: int64(count), Block: -1,
	}).Err()
	if err != nil {
		m.t.Fatal(err)
	}
}

func (m *miniEnv) pending() map[string]redis.XPendingExt {
	m.t.Helper()
	res, err := m.rdb.XPendingExt(m.t.Context(), &redis.XPendingExtArgs{
		Stream: miniStream, Group: group, Start: "-", End: "+", Count: 1000,
	}).Result()
	if err != nil {
		m.t.Fatal(err)
	}
	out := map[string]redis.XPendingExt{}
	for _, p := range res {
		out[p.ID] = p
	}
	return out
}

// TestClaimer_miniredis pins what the embedded mode (miniredis v2.40.0)
// gets from the same calls, REDIS-NOTES.md §5. Min-idle and the
// RETRYCOUNT-preserving heartbeat hold there too; the gaps are pinned so
// that a miniredis upgrade that closes them shows up here.
func TestClaimer_miniredis(t *testing.T) {
	t.Parallel()

	t.Run("Sweep honours min-idle and Extend keeps the count", func(t *testing.T) {
		t.Parallel()
		m := setupMini(t)
		ids := m.add(2)
		m.read("a", 2)
		b := claim.New(m.rdb, miniStream, group, "b", claim.Oversize{})

		m.at(10 * time.Second)
		if got := claimedIDs(sweep(t, b, visibility, upTo(10))); len(got) != 0 {
			t.Errorf("sweep at 10 s idle claimed %v; want nothing (min-idle %v)", got, visibility)
		}
		m.at(40 * time.Second)
		calls := sweep(t, b, visibility, upTo(10))
		if got := claimedIDs(calls); !slices.Equal(got, ids) {
			t.Fatalf("sweep at 40 s idle claimed %v; want %v", got, ids)
		}
		for _, en := range calls[0].claimed {
			if en.Deliveries != 2 {
				t.Errorf("%s: Deliveries %d; want 2", en.ID, en.Deliveries)
			}
		}

		m.at(50 * time.Second)
		lost, err := b.Extend(t.Context(), ids...)
		if err != nil || len(lost) != 0 {
			t.Fatalf("Extend: lost %v, err %v; want neither", lost, err)
		}
		for id, p := range m.pending() {
			// JUSTID alone would make this 3 on miniredis; RETRYCOUNT keeps it.
			if p.Consumer != "b" || p.RetryCount != 2 || p.Idle != 0 {
				t.Errorf("%s after Extend: owner %s count %d idle %v; want b, 2, 0", id, p.Consumer, p.RetryCount, p.Idle)
			}
		}

		// The stale heartbeat of a is refused here too.
		lost, err = claim.New(m.rdb, miniStream, group, "a", claim.Oversize{}).Extend(t.Context(), ids[0])
		if err != nil || !slices.Equal(lost, ids[:1]) {
			t.Errorf("a's Extend: lost %v, err %v; want %v", lost, err, ids[:1])
		}
		if p := m.pending()[ids[0]]; p.Consumer != "b" || p.RetryCount != 2 {
			t.Errorf("after a's Extend: owner %s count %d; want b, 2", p.Consumer, p.RetryCount)
		}
	})

	t.Run("ReadOwn counts a delivery but ignores COUNT", func(t *testing.T) {
		t.Parallel()
		m := setupMini(t)
		ids := m.add(4)
		m.read("a", 3)
		m.read("b", 1)
		entries, deleted, err := claim.New(m.rdb, miniStream, group, "a", claim.Oversize{}).ReadOwn(t.Context(), "0", 2)
		if err != nil {
			t.Fatal(err)
		}
		// Gap §5.1: history reads ignore COUNT. Redis returns 2 here.
		if got := entryIDs(entries); !slices.Equal(got, ids[:3]) || len(deleted) != 0 {
			t.Errorf("ReadOwn(0, 2): %v deleted %v; want miniredis's %v (COUNT ignored)", got, deleted, ids[:3])
		}
		for _, en := range entries {
			if en.Deliveries != 2 {
				t.Errorf("%s: Deliveries %d; want 2", en.ID, en.Deliveries)
			}
		}
	})

	t.Run("deleted entries are neither reported nor purged", func(t *testing.T) {
		t.Parallel()
		m := setupMini(t)
		ids := m.add(2)
		m.read("a", 2)
		if err := m.rdb.XDel(t.Context(), miniStream, ids[0]).Err(); err != nil {
			t.Fatal(err)
		}
		m.at(time.Minute)
		calls := sweep(t, claim.New(m.rdb, miniStream, group, "b", claim.Oversize{}), visibility, upTo(10))
		// Gap §5.1/§5.3.5: Redis reports ids[0] in deleted and drops it from
		// the PEL; miniredis skips it and keeps it forever.
		if got, d := claimedIDs(calls), deletedIDs(calls); !slices.Equal(got, ids[1:]) || len(d) != 0 {
			t.Errorf("sweep: claimed %v deleted %v; want miniredis's %v and nothing deleted", got, d, ids[1:])
		}
		if p, ok := m.pending()[ids[0]]; !ok || p.Consumer != "a" {
			t.Errorf("deleted entry in the PEL: %v (%+v); want still pending for a", ok, p)
		}
		entries, deleted, err := claim.New(m.rdb, miniStream, group, "a", claim.Oversize{}).ReadOwn(t.Context(), "0", 10)
		if err != nil || len(entries) != 0 || len(deleted) != 0 {
			t.Errorf("a's ReadOwn: %v deleted %v err %v; want nothing (miniredis skips the dangling entry)", entryIDs(entries), deleted, err)
		}
	})
}
