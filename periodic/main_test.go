package periodic

import (
	"os"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
	"github.com/pelicanqueue/pelican/internal/redistest"
)

// TestMain runs a scheduler subprocess when the test binary is started as
// one (see schedulerChild), and otherwise the tests, failing the run if a
// scheduler's goroutine outlives its Run.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(schedulerChild())
	}
	redistest.WidenParallel(4) // most tests wait for schedules to come due
	leakcheck.Main(m, 5*time.Second, "pelican/periodic.")
}
