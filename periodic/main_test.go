package periodic

import (
	"os"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain runs a scheduler subprocess when the test binary is started as
// one (see schedulerChild), and otherwise the tests, failing the run if a
// scheduler's goroutine outlives its Run.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(schedulerChild())
	}
	leakcheck.Main(m, 5*time.Second, "pelican/periodic.")
}
