// Package poll is the tests' one way to wait for a condition: it polls with
// a deadline instead of sleeping for a guessed time (STYLE.md: no
// time.Sleep to wait for something). Each package's test helpers
// (waitFor, eventually) are thin wrappers of Until.
package poll

import (
	"testing"
	"time"
)

// Until calls cond until it reports true, and fails t with cond's last
// state after timeout. It checks at once, then every few milliseconds,
// backing off to 20 ms, so that a fast condition costs little and a slow
// one does not spin.
func Until(t testing.TB, timeout time.Duration, cond func() (ok bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state == "" {
				state = "the condition"
			}
			t.Fatalf("not within %v: %s", timeout, state)
		}
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// True adapts a condition with a fixed description to [Until].
func True(what string, cond func() bool) func() (bool, string) {
	return func() (bool, string) { return cond(), what }
}
