package idem_test

import (
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain fails the run if goroutines of idem or go-redis are still
// running after every test and its cleanups.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 2*time.Second, "pelican/idem", "go-redis")
}
