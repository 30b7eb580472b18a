package poll_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/poll"
)

func TestUntil(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	poll.Until(t, time.Minute, poll.True("three calls", func() bool { return n.Add(1) == 3 }))
	if n.Load() != 3 {
		t.Fatalf("cond called %d times, want 3", n.Load())
	}
}

// fatalT records Fatalf instead of stopping the test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

func TestUntil_failsWithTheLastState(t *testing.T) {
	t.Parallel()
	f := &fatalT{TB: t}
	func() {
		defer func() {
			if r := recover(); r != f {
				t.Fatalf("Until did not fail the test (recovered %v)", r)
			}
		}()
		var n int
		poll.Until(f, 30*time.Millisecond, func() (bool, string) {
			n++
			return false, "last state " + string(rune('a'+min(n, 20)))
		})
	}()
	if !strings.Contains(f.msg, "last state") {
		t.Fatalf("failure %q does not carry the condition's last state", f.msg)
	}
}
