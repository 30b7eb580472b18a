package control_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// ParseState on hostile field values (what redis-cli could write into the
// hash) never panics, ignores what Pause did not write, and keeps the valid
// pauses beside them.
func TestAttack14Pause_parseStateHostile(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_800_000_000_000)
	hostile := []string{"", "garbage", "-1", "-9223372036854775808", "9223372036854775807",
		"99999999999999999999999999", "1e30", "0x10", " 0", "0 ", "NaN", "\x00", strings.Repeat("9", 10000)}
	for _, v := range hostile {
		all := map[string]string{"queue": v, "type:" + v: v, v: v, "type:ok": "0", "type:": v, "type:" + strings.Repeat("x", 100000): "0"}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("ParseState with value %q panicked: %v", v, r)
				}
			}()
			st := control.ParseState(now, all)
			if _, ok := st.Types["ok"]; !ok {
				t.Errorf("ParseState with a hostile value %q beside it lost the valid pause of type ok: %+v", v, st)
			}
			_ = st.TypeNames()
			_ = st.Any()
		}()
	}
	// A far end is not an ended one; an ended one is left out.
	st := control.ParseState(now, map[string]string{"queue": fmt.Sprint(now.Add(-time.Millisecond).UnixMilli()), "type:a": fmt.Sprint(now.Add(time.Hour).UnixMilli())})
	if st.Queue || len(st.Types) != 1 {
		t.Errorf("ParseState = %+v; want the queue's ended pause left out and type a kept", st)
	}
}

// A job type named like the queue's own field, or like a type field, pauses
// only that type: it never pauses the whole queue, and Resume of the queue
// does not lift it.
func TestAttack14Pause_typeNamesCollide(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Paused) })
	for _, typ := range []string{"queue", "type:queue", "type:", ":", " ", "*", "{x}", "é✓"} {
		if err := control.Pause(ctx, rdb, name, control.PauseOptions{Type: typ}); err != nil {
			t.Fatalf("Pause of type %q: %v", typ, err)
		}
		st, err := control.State(ctx, rdb, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Queue {
			t.Errorf("Pause of type %q paused the whole queue: %+v", typ, st)
		}
		if _, ok := st.Types[typ]; !ok {
			t.Errorf("Pause of type %q is not in State.Types: %+v", typ, st.Types)
		}
		if err := control.Resume(ctx, rdb, name, control.ResumeOptions{}); !errors.Is(err, control.ErrNotPaused) {
			t.Errorf("Resume of the queue with only type %q paused = %v, want ErrNotPaused", typ, err)
		}
		if err := control.Resume(ctx, rdb, name, control.ResumeOptions{Type: typ}); err != nil {
			t.Errorf("Resume of type %q: %v", typ, err)
		}
		if st, _ := control.State(ctx, rdb, name); st.Any() {
			t.Errorf("after Resume of type %q: %+v still paused", typ, st)
		}
	}
}

// The pause key holding another type (written by hand) makes Pause, Resume
// and State return an error, not panic; a hash with a huge number of junk
// fields is read in bounded time and does not count against MaxPauses in a
// way that makes State lie.
func TestAttack14Pause_hostileKey(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Paused) })
	rdb.Set(ctx, keys.Paused, "not a hash", 0)
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{}); err == nil {
		t.Error("Pause on a string key: nil error")
	}
	if _, err := control.State(ctx, rdb, name); err == nil {
		t.Error("State on a string key: nil error")
	}
	if err := control.Resume(ctx, rdb, name, control.ResumeOptions{All: true}); err == nil || errors.Is(err, control.ErrNotPaused) {
		t.Errorf("Resume on a string key = %v, want a Redis error (not ErrNotPaused)", err)
	}
	rdb.Del(ctx, keys.Paused)
	// Junk fields.
	pipe := rdb.Pipeline()
	for i := range 20000 {
		pipe.HSet(ctx, keys.Paused, fmt.Sprintf("junk%d", i), "x")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	st, err := control.State(ctx, rdb, name)
	if err != nil || st.Any() {
		t.Errorf("State over junk fields = %+v, %v; want nothing paused", st, err)
	}
	t.Logf("State over 20,000 junk fields took %v", time.Since(start))
	if err := control.Resume(ctx, rdb, name, control.ResumeOptions{All: true}); err != nil && !errors.Is(err, control.ErrNotPaused) {
		t.Errorf("Resume All: %v", err)
	}
}

// Fields that Pause did not write are ignored by State ("nothing paused"),
// yet they count against MaxPauses (Pause fails, "resume some first"); Resume
// All must then clear them so that the queue can be paused again without
// redis-cli.
func TestAttack14Pause_junkFieldsBlockPause(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Paused) })
	pipe := rdb.Pipeline()
	for i := range control.MaxPauses {
		pipe.HSet(ctx, keys.Paused, fmt.Sprintf("junk%d", i), "x")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := control.State(ctx, rdb, name); err != nil || st.Any() {
		t.Fatalf("State = %+v, %v; want nothing paused", st, err)
	}
	_ = control.Resume(ctx, rdb, name, control.ResumeOptions{All: true})
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{}); err != nil {
		t.Errorf("Pause of a queue that State shows with no pause, after Resume All: %v", err)
	}
}

// Validation names the field for more bad inputs than the existing test,
// before Redis is touched.
func TestAttack14Pause_validateMore(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		o    control.PauseOptions
		want string
	}{
		{control.PauseOptions{Type: "a\tb"}, "PauseOptions.Type"},
		{control.PauseOptions{Type: "a\x7fb"}, "PauseOptions.Type"},
		{control.PauseOptions{Type: "a\u0085b"}, "PauseOptions.Type"}, // C1 control
		{control.PauseOptions{Type: "a\x00"}, "PauseOptions.Type"},
		{control.PauseOptions{Until: time.Unix(0, 0)}, "PauseOptions.Until"},
	} {
		if err := c.o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+q) = %v, want an error naming %s", c.o.Type, err, c.want)
		}
	}
	if err := (control.PauseOptions{Type: strings.Repeat("é", control.MaxTypeBytes/2)}).Validate(); err != nil {
		t.Errorf("a type of exactly MaxTypeBytes bytes: %v", err)
	}
	if err := (control.ResumeOptions{Type: "a\nb"}).Validate(); err == nil || !strings.Contains(err.Error(), "ResumeOptions.Type") {
		t.Errorf("ResumeOptions{Type: a\\nb}.Validate() = %v, want an error naming ResumeOptions.Type", err)
	}
}
