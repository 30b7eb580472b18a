package claim_test

import (
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain fails the run if goroutines of claim, go-redis or miniredis are
// still running after every test and its cleanups.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 2*time.Second, "pelican/claim", "go-redis", "miniredis")
}
