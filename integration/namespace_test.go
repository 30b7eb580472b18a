package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// Two teams' queues, payments and orders, run the same middleware chain
// (one set of middleware values, reused by both consumers: Lock, Idempotency
// on Redis, RateLimit, DistributedConcurrency) with its default key
// prefixes. No key of one queue acts on the other: an "invoice-1" completed
// in payments is no hit in orders, a lock, a concurrency slot and a rate
// budget held or spent in payments leave orders' jobs of the same key
// running, while each still works within its own queue. Then the same
// chain with explicit prefixes shares all four across the queues.
//
// The rate limit applies to jobs of type "rated" only (1 start per hour per
// key), so that it meets no other step; the concurrency limit is 1 per type.
func TestNamespace_perQueueByDefault(t *testing.T) {
	t.Parallel()
	tm := newTeams(t, nil)
	p, o := tm.payments, tm.orders

	// Idempotency: invoice-1 completed in payments; orders runs its own,
	// and a duplicate in orders is then a hit.
	first := tm.enqueue(p, teamJob{typ: "charge", ik: "invoice-1"})
	tm.waitAcked(first)
	own := tm.enqueue(o, teamJob{typ: "charge", ik: "invoice-1"})
	tm.waitAcked(own)
	if n := tm.runsOf(own); n != 1 {
		t.Fatalf("orders' invoice-1 ran %d times after payments completed its invoice-1, want 1: the record was shared", n)
	}
	dup := tm.enqueue(o, teamJob{typ: "charge", ik: "invoice-1"})
	tm.waitAcked(dup)
	if n := tm.runsOf(dup); n != 0 {
		t.Fatalf("a duplicate invoice-1 in orders ran %d times, want 0 (a hit)", n)
	}

	// Locks: customer-7 held in payments; orders' customer-7 runs
	// meanwhile, payments' own second customer-7 is snoozed.
	hold := tm.enqueue(p, teamJob{typ: "lock-hold", lock: "customer-7", hold: true})
	tm.waitStarted(hold)
	other := tm.enqueue(o, teamJob{typ: "lock-probe", lock: "customer-7"})
	tm.waitAcked(other)
	same := tm.enqueue(p, teamJob{typ: "lock-probe", lock: "customer-7"})
	tm.waitSnoozed(same)
	if tm.runsOf(same) != 0 {
		t.Fatal("a second customer-7 job of payments ran while payments held the lock")
	}
	tm.release(hold)
	tm.waitAcked(hold, same)

	// Concurrency limit (1 per type): a "report" running in payments leaves
	// orders' "report" free to run.
	report := tm.enqueue(p, teamJob{typ: "report", hold: true})
	tm.waitStarted(report)
	theirs := tm.enqueue(o, teamJob{typ: "report"})
	tm.waitAcked(theirs)
	tm.release(report)
	tm.waitAcked(report)

	// Rate limit (1 per hour per key): payments spends its "rated" start;
	// orders has its own; payments' second is snoozed.
	spent := tm.enqueue(p, teamJob{typ: "rated"})
	tm.waitAcked(spent)
	budget := tm.enqueue(o, teamJob{typ: "rated"})
	tm.waitAcked(budget)
	over := tm.enqueue(p, teamJob{typ: "rated"})
	tm.waitSnoozed(over)

	// Every key lives in its queue's namespace.
	ctx := t.Context()
	for _, q := range []*teamQueue{p, o} {
		for _, k := range []string{q.keys.Idem + "invoice-1", q.keys.Lock + "{customer-7}", q.keys.Rate + "rated"} {
			if n, err := tm.rdb.Exists(ctx, k).Result(); err != nil || n != 1 {
				t.Errorf("queue %s: key %q exists %d, %v; want it in the queue's namespace", q.name, k, n, err)
			}
		}
	}
}

// The same chain with explicit prefixes shares records, locks, concurrency
// slots and rate budgets across the two queues.
func TestNamespace_explicitPrefixShares(t *testing.T) {
	t.Parallel()
	shared := redistest.Prefix(t, redistest.Shared(t))
	tm := newTeams(t, &sharedPrefixes{
		lock: shared + "lock:", idem: shared + "idem:", rate: shared + "rate:", limit: shared + "limit:",
	})
	p, o := tm.payments, tm.orders

	first := tm.enqueue(p, teamJob{typ: "charge", ik: "invoice-1"})
	tm.waitAcked(first)
	dup := tm.enqueue(o, teamJob{typ: "charge", ik: "invoice-1"})
	tm.waitAcked(dup)
	if n := tm.runsOf(dup); n != 0 {
		t.Fatalf("orders' invoice-1 ran %d times under a shared prefix after payments completed it, want 0 (a hit)", n)
	}

	hold := tm.enqueue(p, teamJob{typ: "lock-hold", lock: "customer-7", hold: true})
	tm.waitStarted(hold)
	locked := tm.enqueue(o, teamJob{typ: "lock-probe", lock: "customer-7"})
	tm.waitSnoozed(locked)
	report := tm.enqueue(p, teamJob{typ: "report", hold: true})
	tm.waitStarted(report)
	limited := tm.enqueue(o, teamJob{typ: "report"})
	tm.waitSnoozed(limited)
	if tm.runsOf(locked) != 0 || tm.runsOf(limited) != 0 {
		t.Fatal("orders ran a job whose shared lock or concurrency slot payments held")
	}
	tm.release(hold)
	tm.release(report)
	tm.waitAcked(hold, report, locked, limited)

	spent := tm.enqueue(p, teamJob{typ: "rated"})
	tm.waitAcked(spent)
	over := tm.enqueue(o, teamJob{typ: "rated"})
	tm.waitSnoozed(over)

	ctx := t.Context()
	for _, k := range []string{shared + "idem:invoice-1", shared + "lock:{customer-7}", shared + "rate:rated"} {
		if n, err := tm.rdb.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Errorf("shared key %q exists %d, %v", k, n, err)
		}
	}
}

// A hostile producer's lock_key (braces that form no hash tag, a key
// starting with '}') is just a key: a lock is one Redis key, so every
// non-empty lock_key can be locked, under a lock prefix without a hash tag
// as under the queue's default namespace. The job runs once, holding its
// lock, and is acknowledged.
func TestNamespace_hostileLockKeyRuns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		prefix string
	}{{"SharedPrefix", "shared:lock:"}, {"QueueNamespace", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScenario(t, nil, "")
			if tc.prefix != "" {
				tc.prefix = redistest.Prefix(t, s.rdb) + tc.prefix
			}
			var mu sync.Mutex
			ran, locked := 0, 0
			c := consumer.New(s.rdb, consumer.Config{Stream: s.stream, Group: "g", Consumer: "c1",
				Block: 50 * time.Millisecond, PromoteInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
			}).Use(middleware.Lock(s.rdb, middleware.LockConfig{Prefix: tc.prefix})).
				Handle(consumer.HandlerFunc(func(ctx context.Context, _ *stream.Job) error {
					mu.Lock()
					defer mu.Unlock()
					ran++
					if _, ok := lockx.FromContext(ctx); ok {
						locked++
					}
					return nil
				}))
			runConsumer(t, c)
			// As a producer without Pelican's client would write it.
			if err := s.rdb.Do(t.Context(), "XADD", s.stream, "*", "type", "sync", "payload", "{}", "lock_key", "}evil").Err(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, func() (bool, string) {
				mu.Lock()
				defer mu.Unlock()
				return ran == 1 && c.Stats().Acked == 1, fmt.Sprintf("the job ran %d times, %d acknowledged", ran, c.Stats().Acked)
			})
			mu.Lock()
			defer mu.Unlock()
			if locked != 1 {
				t.Errorf("the handler ran without its lock")
			}
			if n, _ := s.rdb.XLen(t.Context(), s.keys.Dead).Result(); n != 0 {
				t.Errorf("%d dead letters, want none", n)
			}
		})
	}
}

// teams is two queues, payments and orders, each with a consumer running
// one chain of middleware values built once, as one team's code reused by
// another: Lock, Idempotency (Redis store), RateLimit, DistributedConcurrency.
// It records what became of each job.
type teams struct {
	t                *testing.T
	rdb              *redis.Client
	payments, orders *teamQueue

	mu       sync.Mutex
	n        int                      // jobs enqueued
	runs     map[string]int           // job ID -> handler runs
	started  map[string]bool          // job ID -> its handler started
	acked    map[string]bool          // job ID -> the chain returned nil
	snoozes  map[string]int           // job ID -> snoozes
	releases map[string]chan struct{} // job ID -> closed to let a holding handler return
}

// teamQueue is one queue of teams.
type teamQueue struct {
	name string
	keys stream.Keys
}

// sharedPrefixes are explicit prefixes for the four middleware.
type sharedPrefixes struct{ lock, idem, rate, limit string }

// teamJob is a job to enqueue: its type, idempotency and lock keys, and
// whether its handler holds (its lock, its slot) until released.
type teamJob struct {
	typ, ik, lock string
	hold          bool
}

func newTeams(t *testing.T, shared *sharedPrefixes) *teams {
	t.Helper()
	rdb := redistest.Shared(t)
	base := redistest.Name(t)
	tm := &teams{t: t, rdb: rdb, runs: map[string]int{}, started: map[string]bool{}, acked: map[string]bool{},
		snoozes: map[string]int{}, releases: map[string]chan struct{}{}}
	// A plain name and one with a hash tag of its own.
	tm.payments = tm.queue(base + ":payments")
	tm.orders = tm.queue("{" + base + ":shop}:orders")

	var sp sharedPrefixes
	if shared != nil {
		sp = *shared
	}
	rated := func(job *stream.Job) string {
		if job.Type == "rated" {
			return job.Type
		}
		return ""
	}
	chain := []consumer.Middleware{
		tm.recorder,
		middleware.Lock(rdb, middleware.LockConfig{Prefix: sp.lock, ConflictDelay: 200 * time.Millisecond}),
		middleware.Idempotency(idem.NewRedisStore(rdb, idem.RedisConfig{}), middleware.IdempotencyConfig{Prefix: sp.idem}),
		middleware.RateLimit(rdb, middleware.RateLimitConfig{Prefix: sp.rate, Rate: 1, Per: time.Hour, Burst: 1, Key: rated}),
		middleware.DistributedConcurrency(rdb, middleware.DistributedConcurrencyConfig{Prefix: sp.limit, Limit: 1,
			SnoozeFor: 200 * time.Millisecond}),
	}
	for _, q := range []*teamQueue{tm.payments, tm.orders} {
		c := consumer.New(rdb, consumer.Config{Stream: q.name, Group: "g", Consumer: "c1", Concurrency: 8,
			Block: 50 * time.Millisecond, PromoteInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		}).Use(chain...).Handle(consumer.HandlerFunc(tm.handle))
		runConsumer(t, c)
	}
	// Let holding handlers return before the consumers stop (cleanups run
	// last registered first).
	t.Cleanup(func() {
		tm.mu.Lock()
		defer tm.mu.Unlock()
		for id, ch := range tm.releases {
			close(ch)
			delete(tm.releases, id)
		}
	})
	return tm
}

// queue returns the queue of stream name, with its group, and deletes its
// keys at the end of the test.
func (tm *teams) queue(name string) *teamQueue {
	keys, err := stream.KeysFor(name)
	if err != nil {
		tm.t.Fatal(err)
	}
	ns := strings.TrimSuffix(keys.Dead, "dlq") // "{payments}:", "{shop}:orders:"
	tm.t.Cleanup(func() {
		tm.rdb.Del(context.Background(), name)
		redistest.DeleteKeys(tm.rdb, ns+"*")
	})
	if err := tm.rdb.XGroupCreateMkStream(tm.t.Context(), name, "g", "0").Err(); err != nil {
		tm.t.Fatal(err)
	}
	return &teamQueue{name: name, keys: keys}
}

// recorder is the outermost middleware: it records each delivery's outcome.
func (tm *teams) recorder(next consumer.Handler) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		err := next.Process(ctx, job)
		tm.mu.Lock()
		defer tm.mu.Unlock()
		var o *consumer.Outcome
		switch {
		case err == nil:
			tm.acked[job.ID] = true
		case errors.As(err, &o) && !o.CountsAttempt() && !o.IsDead():
			tm.snoozes[job.ID]++
		}
		return err
	})
}

// handle counts the run and, for a holding job, waits for its release.
func (tm *teams) handle(ctx context.Context, job *stream.Job) error {
	tm.mu.Lock()
	tm.runs[job.ID]++
	tm.started[job.ID] = true
	ch := tm.releases[job.ID]
	tm.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// enqueue adds j to q and returns its job ID.
func (tm *teams) enqueue(q *teamQueue, j teamJob) string {
	tm.t.Helper()
	job, err := stream.NewJSONJob(j.typ, struct{}{})
	if err != nil {
		tm.t.Fatal(err)
	}
	job.IdempotencyKey, job.LockKey = j.ik, j.lock
	tm.mu.Lock()
	tm.n++
	job.ID = fmt.Sprintf("%s-%d", j.typ, tm.n) // known before the handler can start
	if j.hold {
		tm.releases[job.ID] = make(chan struct{})
	}
	tm.mu.Unlock()
	if _, err := stream.NewProducer(tm.rdb, stream.ProducerConfig{Stream: q.name}).Enqueue(tm.t.Context(), job); err != nil {
		tm.t.Fatal(err)
	}
	return job.ID
}

// release lets the holding job id return.
func (tm *teams) release(id string) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if ch := tm.releases[id]; ch != nil {
		close(ch)
		delete(tm.releases, id)
	}
}

func (tm *teams) runsOf(id string) int {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.runs[id]
}

// teamWait bounds each wait: a step that works takes well under a second;
// one that is blocked by another queue's key never completes.
const teamWait = 15 * time.Second

func (tm *teams) wait(what string, ids []string, cond func(id string) bool) {
	tm.t.Helper()
	eventually(tm.t, teamWait, func() (bool, string) {
		tm.mu.Lock()
		defer tm.mu.Unlock()
		for _, id := range ids {
			if !cond(id) {
				return false, fmt.Sprintf("job %s not %s (runs %d, snoozes %d)", id, what, tm.runs[id], tm.snoozes[id])
			}
		}
		return true, ""
	})
}

func (tm *teams) waitAcked(ids ...string) {
	tm.t.Helper()
	tm.wait("acknowledged", ids, func(id string) bool { return tm.acked[id] })
}

func (tm *teams) waitStarted(ids ...string) {
	tm.t.Helper()
	tm.wait("started", ids, func(id string) bool { return tm.started[id] })
}

func (tm *teams) waitSnoozed(ids ...string) {
	tm.t.Helper()
	tm.wait("snoozed", ids, func(id string) bool { return tm.snoozes[id] > 0 })
}
