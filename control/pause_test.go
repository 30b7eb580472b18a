package control_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// On a real Redis: a second Pause replaces the end; an end the Redis clock
// has passed is refused, naming the field; a pause whose end passed is no
// longer in State (and is removed by the next Pause); MaxPauses bounds the
// hash; Resume of a type leaves the queue's pause.
func TestPause_state(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Paused) })
	end := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(control.Pause(ctx, rdb, name, control.PauseOptions{Type: "a", Until: end}))
	must(control.Pause(ctx, rdb, name, control.PauseOptions{Type: "a"}))
	must(control.Pause(ctx, rdb, name, control.PauseOptions{Until: end}))
	st, err := control.State(ctx, rdb, name)
	must(err)
	if !st.Queue || !st.QueueUntil.Equal(end) || len(st.Types) != 1 || !st.Types["a"].IsZero() {
		t.Fatalf("State = %+v; want the queue until %v and type a until resumed", st, end)
	}
	// An end that the Redis clock has passed (this machine's clock is a
	// second ahead of it, as Validate cannot see).
	now, _ := rdb.Time(ctx).Result()
	rdb.HSet(ctx, keys.Paused, "type:old", now.Add(-time.Millisecond).UnixMilli())
	if st, _ := control.State(ctx, rdb, name); len(st.Types) != 1 {
		t.Errorf("State lists an ended pause: %+v", st.Types)
	}
	must(control.Pause(ctx, rdb, name, control.PauseOptions{Type: "b"}))
	if rdb.HExists(ctx, keys.Paused, "type:old").Val() {
		t.Error("Pause left an ended pause in the hash")
	}
	for i := range control.MaxPauses {
		rdb.HSet(ctx, keys.Paused, fmt.Sprintf("type:t%d", i), 0)
	}
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{Type: "one-more"}); err == nil || !strings.Contains(err.Error(), "MaxPauses") {
		t.Errorf("Pause beyond MaxPauses = %v, want an error naming MaxPauses", err)
	}
	must(control.Pause(ctx, rdb, name, control.PauseOptions{Type: "a", Until: end})) // replacing one is allowed
	must(control.Resume(ctx, rdb, name, control.ResumeOptions{Type: "a"}))
	if err := control.Resume(ctx, rdb, name, control.ResumeOptions{Type: "a"}); !errors.Is(err, control.ErrNotPaused) {
		t.Errorf("second Resume of a = %v, want ErrNotPaused", err)
	}
	if st, _ := control.State(ctx, rdb, name); !st.Queue {
		t.Error("Resume of a type lifted the queue's pause")
	}
}

// Bad options are errors naming the field, before Redis is touched (the
// client points at nothing).
func TestPause_invalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}) // nothing listens
	defer rdb.Close()
	for _, c := range []struct {
		err  error
		want string
	}{
		{control.Pause(ctx, rdb, "", control.PauseOptions{}), "empty stream"},
		{control.Pause(ctx, rdb, "a{b", control.PauseOptions{}), "braces"},
		{control.Pause(ctx, rdb, "q", control.PauseOptions{Until: time.Now().Add(-time.Second)}), "PauseOptions.Until"},
		{control.Pause(ctx, rdb, "q", control.PauseOptions{Type: "a\nb"}), "PauseOptions.Type"},
		{control.Pause(ctx, rdb, "q", control.PauseOptions{Type: strings.Repeat("x", control.MaxTypeBytes+1)}), "PauseOptions.Type"},
		{control.Pause(ctx, rdb, "q", control.PauseOptions{Type: "\xff"}), "PauseOptions.Type"},
		{control.Resume(ctx, rdb, "q", control.ResumeOptions{All: true, Type: "x"}), "ResumeOptions.Type"},
		{control.Resume(ctx, rdb, "", control.ResumeOptions{}), "empty stream"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("error %v, want one naming %q", c.err, c.want)
		}
	}
}
