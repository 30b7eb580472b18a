// Package leakcheck fails a test binary whose goroutines outlive its tests
// (STYLE.md: a goroutine-leak check after the run), without a dependency.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests, then waits up to wait for every goroutine whose stack
// mentions one of markers (package paths such as "pelican/consumer.") to
// end. It exits non-zero, printing their stacks, if any is still running.
// Call it from TestMain.
func Main(m *testing.M, wait time.Duration, markers ...string) {
	os.Exit(Run(m, wait, markers...))
}

// Run is Main without the exit: it returns the exit code, so that a
// TestMain can clean up before it exits.
func Run(m *testing.M, wait time.Duration, markers ...string) int {
	code := m.Run()
	if code == 0 {
		if leaked := Leaked(wait, markers...); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines left running after the tests:\n\n%s\n", leaked)
			code = 1
		}
	}
	return code
}

// Leaked polls until no goroutine other than the caller's mentions one of
// markers, and returns the stacks of those still running when wait is up
// ("" if none).
func Leaked(wait time.Duration, markers ...string) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for i, g := range strings.Split(string(buf), "\n\n") {
			if i == 0 { // the caller
				continue
			}
			for _, m := range markers {
				if strings.Contains(g, m) {
					leaked = append(leaked, g)
					break
				}
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
