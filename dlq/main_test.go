package dlq_test

import (
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain fails the run if a replay's lease renewer outlives its Replay.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 5*time.Second, "pelican/dlq.")
}
