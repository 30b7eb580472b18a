package idem_test

import (
	"testing"

	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/idem/idemtest"
	"github.com/pelicanqueue/pelican/internal/redistest"
)

// TestRedisStore_cluster runs the conformance suite on a 3-master Redis
// Cluster: every script names one key, so none can fail with CROSSSLOT, and
// keys spread over the masters.
func TestRedisStore_cluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	cc := redistest.StartCluster(t, 3).Client(t)
	store := idem.NewRedisStore(cc, idem.RedisConfig{})
	idemtest.Run(t, func(t *testing.T) idem.Store { return store })
}
