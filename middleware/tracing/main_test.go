package tracing_test

import (
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, 5*time.Second, "pelican/consumer.(*Consumer)", "pelican/claim.", "otel/sdk/trace.")
}
