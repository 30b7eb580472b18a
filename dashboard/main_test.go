package dashboard_test

import (
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain fails the run if a replay goroutine outlives its dashboard.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 5*time.Second, "pelican/dashboard.")
}
