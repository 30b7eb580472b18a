package outbox

import (
	"os"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain runs a relay subprocess when the test binary is started as one
// (see relayChild), and otherwise the tests, failing the run if a relay's
// goroutine outlives its Run.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(relayChild())
	}
	leakcheck.Main(m, 5*time.Second, "pelican/outbox.")
}
