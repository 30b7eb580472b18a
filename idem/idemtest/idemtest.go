// Package idemtest is the conformance suite of idem.Store implementations,
// as testing/slogtest is for slog handlers: every store in Pelican runs it,
// and a third-party store should too.
//
//	func TestMyStore(t *testing.T) {
//		idemtest.Run(t, func(t *testing.T) idem.Store { return newMyStore(t) })
//	}
//
// The suite uses keys of its own (random), short leases (LeaseShort) and
// polls with deadlines; it needs no particular retention beyond a few
// seconds.
package idemtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/idem"
)

// LeaseShort is the lease of the suite's takeover tests: the store must
// take the record over within LeaseShort plus TakeoverSlack.
const (
	LeaseShort    = 200 * time.Millisecond
	TakeoverSlack = 3 * time.Second
	leaseLong     = time.Minute
)

// Run runs the conformance suite against stores made by newStore, which is
// called once per subtest (it may return the same store each time). The
// subtests run in parallel.
func Run(t *testing.T, newStore func(t *testing.T) idem.Store) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s idem.Store)
	}{
		{"BeginCompleteHit", testBeginCompleteHit},
		{"InProgressForOtherOwner", testInProgress},
		{"LeaseExpiryTakeover", testTakeover},
		{"CompleteIdempotentForOwner", testCompleteIdempotent},
		{"FailKeepsReason", testFail},
		{"ReleaseLetsNextBeginStart", testRelease},
		{"ForgetDeletesOnlyTheStatusAsked", testForget},
		{"NotOwnerChangesNothing", testNotOwner},
		{"ConcurrentBeginsOneStarts", testConcurrent},
		{"KeysAreIndependent", testKeys},
		{"InvalidArguments", testInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

func key(t *testing.T) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idemtest:" + t.Name() + ":" + hex.EncodeToString(b[:])
}

func begin(t *testing.T, s idem.Store, k, owner string, lease time.Duration) idem.Outcome {
	t.Helper()
	o, err := s.Begin(context.Background(), k, owner, lease)
	if err != nil {
		t.Fatalf("Begin(%q, %q): %v", k, owner, err)
	}
	return o
}

func want(t *testing.T, o idem.Outcome, st idem.Status, owner string) {
	t.Helper()
	if o.Status != st || o.Owner != owner {
		t.Fatalf("Begin = %v owned by %q, want %v owned by %q (outcome %+v)", o.Status, o.Owner, st, owner, o)
	}
}

func ok(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func notOwner(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idem.ErrNotOwner) {
		t.Fatalf("%s = %v, want idem.ErrNotOwner", what, err)
	}
}

func testBeginCompleteHit(t *testing.T, s idem.Store) {
	ctx, k := context.Background(), key(t)
	want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	result := []byte("result \x00\xff binary")
	ok(t, "Complete", s.Complete(ctx, k, "a", result))
	for _, who := range []string{"b", "a"} {
		o := begin(t, s, k, who, leaseLong)
		want(t, o, idem.StatusCompleted, "a")
		if string(o.Result) != string(result) {
			t.Fatalf("Result = %q, want %q", o.Result, result)
		}
	}
	// An empty result reads back as empty.
	k2 := key(t)
	want(t, begin(t, s, k2, "a", leaseLong), idem.StatusStarted, "a")
	ok(t, "Complete(nil)", s.Complete(ctx, k2, "a", nil))
	if o := begin(t, s, k2, "b", leaseLong); o.Status != idem.StatusCompleted || len(o.Result) != 0 {
		t.Fatalf("Begin after Complete(nil) = %+v, want completed with an empty result", o)
	}
}

func testInProgress(t *testing.T, s idem.Store) {
	k := key(t)
	want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	want(t, begin(t, s, k, "b", leaseLong), idem.StatusInProgress, "a")
	// Still in progress a while later: the lease is long.
	time.Sleep(2 * LeaseShort)
	want(t, begin(t, s, k, "c", leaseLong), idem.StatusInProgress, "a")
}

func testTakeover(t *testing.T, s idem.Store) {
	ctx, k := context.Background(), key(t)
	start := time.Now()
	want(t, begin(t, s, k, "crashed", LeaseShort), idem.StatusStarted, "crashed")
	want(t, begin(t, s, k, "b", leaseLong), idem.StatusInProgress, "crashed")
	deadline := start.Add(LeaseShort + TakeoverSlack)
	for {
		o := begin(t, s, k, "b", leaseLong)
		if o.Status == idem.StatusStarted {
			want(t, o, idem.StatusStarted, "b")
			break
		}
		want(t, o, idem.StatusInProgress, "crashed")
		if time.Now().After(deadline) {
			t.Fatalf("processing record with a %v lease not taken over after %v", LeaseShort, time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if el := time.Since(start); el < LeaseShort*3/4 {
		t.Fatalf("taken over after %v, before the %v lease passed", el, LeaseShort)
	}
	// The new owner's lease is long: nobody else takes it.
	want(t, begin(t, s, k, "c", leaseLong), idem.StatusInProgress, "b")
	// The stale owner can neither finish nor release the record.
	notOwner(t, "stale Complete", s.Complete(ctx, k, "crashed", []byte("stale")))
	notOwner(t, "stale Fail", s.Fail(ctx, k, "crashed", "stale"))
	notOwner(t, "stale Release", s.Release(ctx, k, "crashed"))
	want(t, begin(t, s, k, "c", leaseLong), idem.StatusInProgress, "b")
	ok(t, "new owner's Complete", s.Complete(ctx, k, "b", []byte("fresh")))
	o := begin(t, s, k, "c", leaseLong)
	want(t, o, idem.StatusCompleted, "b")
	if string(o.Result) != "fresh" {
		t.Fatalf("Result = %q, want the new owner's %q", o.Result, "fresh")
	}
	notOwner(t, "stale Complete after completion", s.Complete(ctx, k, "crashed", []byte("stale")))
}

func testCompleteIdempotent(t *testing.T, s idem.Store) {
	ctx, k := context.Background(), key(t)
	want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	ok(t, "Complete", s.Complete(ctx, k, "a", []byte("first")))
	ok(t, "Complete again by the same owner", s.Complete(ctx, k, "a", []byte("second")))
	o := begin(t, s, k, "b", leaseLong)
	want(t, o, idem.StatusCompleted, "a")
	if string(o.Result) != "first" {
		t.Fatalf("Result = %q, want %q: a repeated Complete must not change the record", o.Result, "first")
	}
	notOwner(t, "Complete by another owner", s.Complete(ctx, k, "b", nil))
	notOwner(t, "Release of a completed record", s.Release(ctx, k, "a"))
	want(t, begin(t, s, k, "b", leaseLong), idem.StatusCompleted, "a")

	k2 := key(t)
	want(t, begin(t, s, k2, "a", leaseLong), idem.StatusStarted, "a")
	ok(t, "Fail", s.Fail(ctx, k2, "a", "boom"))
	ok(t, "Fail again by the same owner", s.Fail(ctx, k2, "a", "boom"))
}

func testFail(t *testing.T, s idem.Store) {
	ctx, k := context.Background(), key(t)
	want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	ok(t, "Fail", s.Fail(ctx, k, "a", "card declined"))
	for _, who := range []string{"b", "a"} {
		o := begin(t, s, k, who, leaseLong)
		want(t, o, idem.StatusFailed, "a")
		if o.Reason != "card declined" {
			t.Fatalf("Reason = %q, want %q", o.Reason, "card declined")
		}
	}
	notOwner(t, "Complete of a failed record", s.Complete(ctx, k, "b", nil))
}

func testRelease(t *testing.T, s idem.Store) {
	ctx, k := context.Background(), key(t)
	want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	ok(t, "Release", s.Release(ctx, k, "a"))
	want(t, begin(t, s, k, "b", leaseLong), idem.StatusStarted, "b")
	notOwner(t, "Release by the previous owner", s.Release(ctx, k, "a"))
	want(t, begin(t, s, k, "c", leaseLong), idem.StatusInProgress, "b")
	notOwner(t, "Release of an absent record", s.Release(ctx, key(t), "a"))
}

func forget(t *testing.T, s idem.Store, k string, st idem.Status) bool {
	t.Helper()
	ok, err := s.Forget(context.Background(), k, st)
	if err != nil {
		t.Fatalf("Forget(%q, %v): %v", k, st, err)
	}
	return ok
}

func testForget(t *testing.T, s idem.Store) {
	ctx := context.Background()
	// A failed record: forgotten only as failed, and once.
	k := key(t)
	want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	ok(t, "Fail", s.Fail(ctx, k, "a", "card declined"))
	if forget(t, s, k, idem.StatusCompleted) {
		t.Fatal("Forget(completed) deleted a failed record")
	}
	want(t, begin(t, s, k, "b", leaseLong), idem.StatusFailed, "a")
	if !forget(t, s, k, idem.StatusFailed) {
		t.Fatal("Forget(failed) of a failed record = false")
	}
	if forget(t, s, k, idem.StatusFailed) {
		t.Fatal("second Forget(failed) = true, want false: the record is gone")
	}
	notOwner(t, "Fail by the owner of the forgotten record", s.Fail(ctx, k, "a", "again"))
	want(t, begin(t, s, k, "b", leaseLong), idem.StatusStarted, "b")
	ok(t, "Complete after Forget", s.Complete(ctx, k, "b", []byte("ok")))

	// A completed record: forgotten only as completed.
	k2 := key(t)
	want(t, begin(t, s, k2, "a", leaseLong), idem.StatusStarted, "a")
	ok(t, "Complete", s.Complete(ctx, k2, "a", []byte("r")))
	if forget(t, s, k2, idem.StatusFailed) {
		t.Fatal("Forget(failed) deleted a completed record")
	}
	want(t, begin(t, s, k2, "b", leaseLong), idem.StatusCompleted, "a")
	if !forget(t, s, k2, idem.StatusCompleted) {
		t.Fatal("Forget(completed) of a completed record = false")
	}
	want(t, begin(t, s, k2, "b", leaseLong), idem.StatusStarted, "b")

	// A processing record is never forgotten.
	k3 := key(t)
	want(t, begin(t, s, k3, "a", leaseLong), idem.StatusStarted, "a")
	if forget(t, s, k3, idem.StatusFailed) || forget(t, s, k3, idem.StatusCompleted) {
		t.Fatal("Forget deleted a processing record")
	}
	want(t, begin(t, s, k3, "b", leaseLong), idem.StatusInProgress, "a")
	ok(t, "owner's Complete after the refused Forgets", s.Complete(ctx, k3, "a", nil))

	// No record: nothing to forget.
	if forget(t, s, key(t), idem.StatusFailed) {
		t.Fatal("Forget of an absent key = true")
	}
}

func testNotOwner(t *testing.T, s idem.Store) {
	ctx, k := context.Background(), key(t)
	notOwner(t, "Complete without Begin", s.Complete(ctx, k, "a", nil))
	notOwner(t, "Fail without Begin", s.Fail(ctx, k, "a", "x"))
	want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	notOwner(t, "Complete by another owner", s.Complete(ctx, k, "b", []byte("x")))
	notOwner(t, "Fail by another owner", s.Fail(ctx, k, "b", "x"))
	notOwner(t, "Release by another owner", s.Release(ctx, k, "b"))
	want(t, begin(t, s, k, "c", leaseLong), idem.StatusInProgress, "a")
	ok(t, "owner's Complete", s.Complete(ctx, k, "a", []byte("ok")))
}

func testConcurrent(t *testing.T, s idem.Store) {
	const n = 20
	for round := range 3 {
		k := key(t)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			started []string
			other   int
		)
		gate := make(chan struct{})
		for i := range n {
			owner := "o" + string(rune('A'+i))
			wg.Go(func() {
				<-gate
				o, err := s.Begin(context.Background(), k, owner, leaseLong)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("round %d: Begin(%s): %v", round, owner, err)
				case o.Status == idem.StatusStarted:
					started = append(started, owner)
				case o.Status == idem.StatusInProgress:
					other++
				default:
					t.Errorf("round %d: Begin(%s) = %+v", round, owner, o)
				}
			})
		}
		close(gate)
		wg.Wait()
		if len(started) != 1 || other != n-1 {
			t.Fatalf("round %d: %d concurrent Begins: started by %v, %d in progress; want exactly one started", round, n, started, other)
		}
		if o := begin(t, s, k, "late", leaseLong); o.Status != idem.StatusInProgress || o.Owner != started[0] {
			t.Fatalf("round %d: Begin after the race = %+v, want in progress owned by %s", round, o, started[0])
		}
	}
}

func testKeys(t *testing.T, s idem.Store) {
	ctx, base := context.Background(), key(t)
	keys := []string{base + ":a", base + ":b", base + ":{tag}", base + ":'quote\"", base + ":ü 😀"}
	for _, k := range keys {
		want(t, begin(t, s, k, "a", leaseLong), idem.StatusStarted, "a")
	}
	ok(t, "Complete", s.Complete(ctx, keys[0], "a", []byte("0")))
	ok(t, "Fail", s.Fail(ctx, keys[1], "a", "1"))
	ok(t, "Release", s.Release(ctx, keys[2], "a"))
	want(t, begin(t, s, keys[0], "b", leaseLong), idem.StatusCompleted, "a")
	want(t, begin(t, s, keys[1], "b", leaseLong), idem.StatusFailed, "a")
	want(t, begin(t, s, keys[2], "b", leaseLong), idem.StatusStarted, "b")
	want(t, begin(t, s, keys[3], "b", leaseLong), idem.StatusInProgress, "a")
	want(t, begin(t, s, keys[4], "b", leaseLong), idem.StatusInProgress, "a")
}

func testInvalid(t *testing.T, s idem.Store) {
	ctx := context.Background()
	if _, err := s.Begin(ctx, "", "a", leaseLong); err == nil {
		t.Error("Begin with an empty key: nil error")
	}
	if _, err := s.Begin(ctx, key(t), "", leaseLong); err == nil {
		t.Error("Begin with an empty owner: nil error")
	}
	if _, err := s.Begin(ctx, key(t), "a", 0); err == nil {
		t.Error("Begin with a zero lease: nil error")
	}
	if _, err := s.Forget(ctx, "", idem.StatusFailed); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("Forget with an empty key: %v, want idem.ErrInvalid", err)
	}
	for _, st := range []idem.Status{idem.StatusStarted, idem.StatusInProgress, idem.Status(42)} {
		if _, err := s.Forget(ctx, key(t), st); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("Forget(%v): %v, want idem.ErrInvalid", st, err)
		}
	}
}
