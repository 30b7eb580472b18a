package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/poll"
)

// With the default Prefetch the room grows while jobs are short and stays
// at Concurrency plus Prefetch while they are slow or not yet measured; a
// Prefetch set by the user is never changed.
func TestConsumer_roomLimit(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T, cfg Config) *Consumer {
		t.Helper()
		cfg.Stream, cfg.Group, cfg.Consumer = "s", "g", "c"
		r, err := cfg.resolve()
		if err != nil {
			t.Fatal(err)
		}
		return &Consumer{r: r}
	}
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		c := setup(t, Config{})
		if got, want := c.roomSize(), fastRoom; got != want {
			t.Fatalf("roomSize = %d, want %d", got, want)
		}
		if got, want := c.roomLimit(), 2*DefaultConcurrency; got != want {
			t.Errorf("before any job: roomLimit = %d, want %d (Concurrency + Prefetch)", got, want)
		}
		for range 50 {
			c.noteRunTime(20 * time.Microsecond)
		}
		if got := c.roomLimit(); got != fastRoom {
			t.Errorf("20 µs jobs: roomLimit = %d, want %d", got, fastRoom)
		}
		for range 100 {
			c.noteRunTime(time.Millisecond)
		}
		if got, want := c.roomLimit(), DefaultConcurrency+DefaultConcurrency*int(prefetchWait/time.Millisecond); got < want-2 || got > want+2 {
			t.Errorf("1 ms jobs: roomLimit = %d, want about %d", got, want)
		}
		for range 100 {
			c.noteRunTime(100 * time.Millisecond)
		}
		if got, want := c.roomLimit(), 2*DefaultConcurrency; got != want {
			t.Errorf("100 ms jobs: roomLimit = %d, want %d (Concurrency + Prefetch)", got, want)
		}
	})
	t.Run("large Concurrency", func(t *testing.T) {
		t.Parallel()
		c := setup(t, Config{Concurrency: 80})
		c.noteRunTime(time.Microsecond)
		if got, want := c.roomLimit(), 160; got != want {
			t.Errorf("roomLimit = %d, want %d (never below Concurrency + Prefetch)", got, want)
		}
	})
	for _, prefetch := range []int{-1, 3} {
		c := setup(t, Config{Prefetch: prefetch})
		c.noteRunTime(time.Microsecond)
		want := DefaultConcurrency + max(prefetch, 0)
		if got := c.roomLimit(); got != want || c.roomSize() != want {
			t.Errorf("Prefetch %d: roomLimit = %d, roomSize = %d, want %d", prefetch, got, c.roomSize(), want)
		}
	}
}

// While fresh jobs are queued the read loop waits for half of the room,
// but once the workers have taken every queued job a freed place wakes it:
// it reads with the places it has instead of waiting for the sweep.
func TestConsumer_takeRoomWakesWhenQueueEmpties(t *testing.T) {
	t.Parallel()
	r, err := Config{Stream: "s", Group: "g", Consumer: "c", Concurrency: 1, Prefetch: 5}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	c := &Consumer{r: r, ready: make(chan *task, 6)}
	c.room.kick = make(chan struct{}, 1)
	c.ready <- &task{} // a job queued: the read loop waits for 3 places (half of 6)
	// One place free before the read loop looks: it takes it and waits
	// for two more. (Freed after it looked, the place would sit free under
	// a wait for three: no worker frees one while the job is queued.)
	c.freeRoom(1)
	got := make(chan int, 1)
	go func() {
		n, _ := c.takeRoom(context.Background(), time.Now().Add(time.Hour))
		got <- n
	}()
	poll.Until(t, 30*time.Second, poll.True("the read loop holds one place and waits for two more", func() bool {
		return c.room.want.Load() == 2 && c.room.free.Load() == 0
	}))
	<-c.ready // a worker takes the last queued job
	c.freeRoom(1)
	select {
	case n := <-got:
		if n != 2 {
			t.Errorf("takeRoom = %d places, want 2", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the read loop still waits for room with no job queued and two places free")
	}
}

// The room is fitted to roomLimit each time the read loop wakes, not only
// before it waits: jobs that finished while it waited count, so that short
// jobs are read in large batches instead of being held to the limit
// measured just after the previous read (when few jobs had finished).
func TestConsumer_takeRoomRefitsAfterWaiting(t *testing.T) {
	t.Parallel()
	r, err := Config{Stream: "s", Group: "g", Consumer: "c"}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	c := &Consumer{r: r, ready: make(chan *task, fastRoom)}
	c.room.kick = make(chan struct{}, 1)
	c.jobTime.Store(int64(time.Microsecond)) // short jobs: the limit is set by the jobs finished
	// The previous read took 20 entries: 10 run, 10 are queued, and no job
	// has finished since, so the limit is Concurrency + Prefetch (20).
	c.room.free.Store(fastRoom - 20)
	for range 10 {
		c.ready <- &task{}
	}
	got := make(chan int, 1)
	go func() {
		n, _ := c.takeRoom(context.Background(), time.Now().Add(time.Hour))
		got <- n
	}()
	poll.Until(t, 30*time.Second, poll.True("the read loop waits for half of a room of 20", func() bool {
		return c.room.want.Load() == 10
	}))
	// 15 jobs finish: the limit is 20 + 2×15 = 50, and 45 places are free
	// within it (15 freed, 30 no longer held back).
	c.finished.Add(15)
	c.freeRoom(15)
	select {
	case n := <-got:
		if n != 45 {
			t.Errorf("takeRoom = %d places, want 45 (the room fitted to the jobs finished while it waited)", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the read loop still waits for room with 15 places free")
	}
}
