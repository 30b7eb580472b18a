package consumer

import (
	"context"
	"testing"
	"time"
)

// grants runs n grants of b with every share always waiting (each share
// has waiters workers waiting; a granted slot is released as soon as its
// worker waits again), and returns the grants per share. Every waiter is
// registered before the first slot frees.
func grants(t *testing.T, b *budget, n, waiters int) []int {
	t.Helper()
	shares := len(b.shares)
	hold := b.add(0, 1, 0) // holds every slot until the waiters wait
	hold.tryAcquire(b.free)
	ch := make(chan int, shares*waiters)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := func(i int) {
		go func() {
			if b.shares[i].acquire(ctx) {
				ch <- i
			}
		}()
	}
	registered := func(want int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			b.mu.Lock()
			w := 0
			for _, s := range b.shares[:shares] {
				w += len(s.waiters) + s.used
			}
			b.mu.Unlock()
			if w == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiters did not register: %d, want %d", w, want)
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
	for i := range shares {
		for range waiters {
			wait(i)
		}
	}
	registered(shares * waiters)
	hold.release(hold.used)
	count := make([]int, shares)
	for range n {
		i := <-ch
		count[i]++
		wait(i) // its worker waits again before the slot frees: always backlogged
		registered(shares*waiters + 1)
		b.shares[i].release(1)
	}
	return count
}

func TestBudget_weighted(t *testing.T) {
	t.Parallel()
	b := newBudget(10, false)
	b.add(0, 6, 0)
	b.add(0, 3, 0)
	b.add(0, 1, 0)
	c := grants(t, b, 3000, 10)
	// The first 10 grants fill the budget in order; after that it is exact
	// to within a stride.
	want := []int{1800, 900, 300}
	for i := range want {
		if d := c[i] - want[i]; d < -12 || d > 12 {
			t.Errorf("share %d (weight %d): %d grants of 3000, want %d: %v", i, []int{6, 3, 1}[i], c[i], want[i], c)
		}
	}
}

func TestBudget_strict(t *testing.T) {
	b := newBudget(4, true)
	b.add(0, 1, 0)  // low
	b.add(0, 1, 10) // high
	b.add(1, 1, -5) // lowest, with one reserved slot
	c := grants(t, b, 1000, 4)
	// Slots go highest first: high takes 3, and the slot reserved for the
	// lowest queue only it may take; low never gets one.
	if c[0] != 0 || c[1]+c[2] != 1000 || c[2] == 0 {
		t.Errorf("grants per share (low, high, lowest with Min 1) = %v, want [0 x y], x+y = 1000, y > 0", c)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.shares[2].used != 1 || b.shares[1].used != 3 || b.shares[0].used != 0 {
		t.Errorf("used = %d/%d/%d, want 0/3/1", b.shares[0].used, b.shares[1].used, b.shares[2].used)
	}
}

func TestBudget_minReserved(t *testing.T) {
	b := newBudget(3, false)
	a := b.add(0, 1, 0)
	r := b.add(2, 1, 0)
	ctx := context.Background()
	if !a.acquire(ctx) {
		t.Fatal("acquire failed")
	}
	// The other two slots are r's: a may not take them, waiting or not.
	if got := a.tryAcquire(2); got != 0 {
		t.Fatalf("tryAcquire took %d of the reserved slots", got)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if a.acquire(wctx) {
		t.Fatal("acquire took a reserved slot")
	}
	if got := r.tryAcquire(3); got != 2 {
		t.Fatalf("reserved queue took %d slots, want 2", got)
	}
	r.release(2)
	a.release(1)
	// With nothing reserved left unfilled beyond r's, a gets one slot only.
	if got := a.tryAcquire(3); got != 1 {
		t.Fatalf("a took %d slots, want 1 (2 reserved for r)", got)
	}
	a.release(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free != 3 || b.lacking != 2 {
		t.Errorf("free %d lacking %d after releasing everything, want 3 and 2", b.free, b.lacking)
	}
}

func TestBudget_cancelledWaiterHoldsNothing(t *testing.T) {
	b := newBudget(1, false)
	a := b.add(0, 1, 0)
	if !a.acquire(context.Background()) {
		t.Fatal("acquire failed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- a.acquire(ctx) }()
	for {
		b.mu.Lock()
		n := len(a.waiters)
		b.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if <-done {
		t.Fatal("a cancelled acquire returned true")
	}
	a.release(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free != 1 || len(a.waiters) != 0 || a.used != 0 {
		t.Errorf("free %d waiters %d used %d, want 1 0 0", b.free, len(a.waiters), a.used)
	}
}
