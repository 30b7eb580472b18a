package lockx_test

import (
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain fails the run if a lock's renewal goroutine outlives its test.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 2*time.Second, "pelican/lockx.")
}
